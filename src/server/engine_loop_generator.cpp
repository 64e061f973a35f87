// ds41 server: EngineLoopGenerator (see engine_loop_generator.h).
#include "server/engine_loop_generator.h"

namespace ds41::server {

Result<std::shared_ptr<engine::RequestStream>> EngineLoopGenerator::submit(engine::GenerationRequest req) {
  return loop_->submit(std::move(req));
}

engine::LoopStats EngineLoopGenerator::stats() const { return loop_->stats(); }

}  // namespace ds41::server
