// ds41 engine: names of the request vocabulary (request.h).
#include "engine/request.h"

namespace ds41::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

}  // namespace ds41::engine
