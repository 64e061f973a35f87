// ds41 server: Generator — the server's only dependency on the engine (ARCHITECTURE.md: the server
// talks to the engine only through its request queue). Production wires it to engine::EngineLoop
// (engine_loop_generator.h); tests use a scripted fake.
#pragma once

#include <memory>

#include "core/status.h"
#include "engine/engine_loop.h"
#include "engine/request.h"

namespace ds41::server {

class Generator {
 public:
  virtual ~Generator() = default;
  // Queues a request. kInvalidArgument (context too long, bad token ids: message has the
  // numbers) -> HTTP 400; kResourceExhausted (queue full) -> 429; kUnavailable (stopping) -> 503.
  // Thread-safe.
  virtual Result<std::shared_ptr<engine::RequestStream>> submit(engine::GenerationRequest req) = 0;
  virtual engine::LoopStats stats() const = 0;
};

}  // namespace ds41::server
