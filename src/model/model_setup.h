// ds41 model: the host-side steps of loading a model that do not depend on where the weights
// live — the config checks beyond validate_model_config (one shared K=V latent, o_groups, RoPE
// width) and the Engram hasher (MODEL_SPEC 3.2: hash constants from the config, compressed
// vocabulary from the tokenizer). Model::load (CPU) and gpu::DeviceModel::load share them, so
// both refuse the same configs with the same messages.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "engram/hasher.h"
#include "model/config.h"

namespace ds41::model {

// Checks Model::load makes after validate_model_config; `where` prefixes the messages
// (e.g. "DIR/config.json").
Status check_model_config_supported(const ModelConfig& c, const std::string& where);

// The Engram hasher of the config, or null when it has no Engram layers. tokenizer_dir: a folder
// holding tokenizer.json or the file itself; empty: model_dir is tried. NotFound naming the file
// (and --tokenizer) when it is missing.
Result<std::unique_ptr<engram::EngramHasher>> make_engram_hasher(const ModelConfig& c,
                                                                 const std::string& model_dir,
                                                                 const std::string& tokenizer_dir);

}  // namespace ds41::model
