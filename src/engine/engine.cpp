// ds41 engine: the unimplemented() defaults of the Engine's state export / import (engine.h).
#include "engine/engine.h"

namespace ds41::engine {

namespace {
Status not_here(const char* what) {
  return unimplemented(std::string(what) + " is not implemented by this engine (the prefix cache needs it)");
}
}  // namespace

Result<std::vector<uint8_t>> Engine::export_kv_block(SeqId, int64_t, int64_t) const {
  return not_here("export_kv_block");
}
Result<std::vector<uint8_t>> Engine::export_swa_snapshot(SeqId, int64_t, bool) const {
  return not_here("export_swa_snapshot");
}
Status Engine::import_state(SeqId, std::span<const std::span<const uint8_t>>, std::span<const uint8_t>,
                            int64_t) {
  return not_here("import_state");
}
Status Engine::replay_window(SeqId, std::span<const int32_t>) { return not_here("replay_window"); }
Status Engine::prefill_decoder_replay(SeqId, std::span<const int32_t>) {
  return not_here("prefill_decoder_replay");
}

}  // namespace ds41::engine
