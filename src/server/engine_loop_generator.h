// ds41 server: the Generator adapter over engine::EngineLoop (the production wiring).
#pragma once

#include "server/generator.h"

namespace ds41::server {

class EngineLoopGenerator final : public Generator {
 public:
  // `loop` must outlive the adapter.
  explicit EngineLoopGenerator(engine::EngineLoop* loop) : loop_(loop) {}
  Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerationRequest req) override;
  engine::LoopStats stats() const override;

 private:
  engine::EngineLoop* loop_;
};

}  // namespace ds41::server
