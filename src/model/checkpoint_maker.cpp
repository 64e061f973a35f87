// ds41 model: config -> contract -> checkpoint directory (random weights or layout only).
#include "model/checkpoint_maker.h"

#include <filesystem>

#include "model/layer_schedule.h"
#include "model/loader/checkpoint_writer.h"
#include "model/loader/tensor_contract.h"
#include "model/presets.h"
#include "model/random_weights.h"

namespace ds41::model {

Result<MadeCheckpoint> make_checkpoint(const std::string& dir, const ModelConfig& config,
                                       const MakeCheckpointOptions& options) {
  // Round trip through the real parser, so the written config.json is what the loader will see.
  const std::string text = model_config_to_json(config);
  DS41_ASSIGN_OR_RETURN(ModelConfig parsed, parse_model_config(text));
  DS41_ASSIGN_OR_RETURN(LayerSchedule schedule, derive_layer_schedule(parsed));
  DS41_ASSIGN_OR_RETURN(TensorContract contract, derive_tensor_contract(parsed, schedule));
  if (options.shards < 1)
    return invalid_argument("shards must be >= 1, got " + std::to_string(options.shards));

  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n == "config.json" || n.ends_with(".safetensors") || n == "model.safetensors.index.json")
        return failed_precondition(dir + " already holds a checkpoint file (" + n +
                                   "); use an empty directory");
    }
  }
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create directory (" + ec.message() + ")");

  std::vector<TensorSpec> specs;
  specs.reserve(contract.tensors.size());
  for (const auto& t : contract.tensors) specs.push_back({t.name, t.dtype, t.shape});
  RandomWeights rw(parsed, contract, options.seed);
  CheckpointWriteOptions wo;
  wo.shards = options.shards;
  wo.layout_only = options.layout_only;
  wo.progress = options.progress;
  DS41_RETURN_IF_ERROR(write_checkpoint(
      dir, specs, wo, [&](size_t i, uint8_t* out, uint64_t n) { return rw.fill(i, out, n); }));
  DS41_RETURN_IF_ERROR(write_text_file(dir + "/config.json", text));
  const std::string gen = "{\n  \"bos_token_id\": " + std::to_string(parsed.bos_token_id) +
                          ",\n  \"eos_token_id\": " + std::to_string(parsed.eos_token_id) +
                          ",\n  \"pad_token_id\": " + std::to_string(parsed.pad_token_id) +
                          ",\n  \"do_sample\": false\n}\n";
  DS41_RETURN_IF_ERROR(write_text_file(dir + "/generation_config.json", gen));
  MadeCheckpoint m;
  m.tensor_count = contract.tensors.size();
  m.payload_bytes = contract.payload_bytes();
  m.shards = static_cast<int>(std::min<size_t>(static_cast<size_t>(options.shards), specs.size()));
  return m;
}

}  // namespace ds41::model
