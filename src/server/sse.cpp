// ds41 server: SSE framing (see sse.h).
#include "server/sse.h"

#include "server/api_error.h"

namespace ds41::server {

std::string sse_event(const nlohmann::ordered_json& j) { return "data: " + json_text(j) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_comment(std::string_view text) {
  std::string out = ": ";
  for (char c : text) out += (c == '\n' || c == '\r') ? ' ' : c;
  return out + "\n\n";
}

}  // namespace ds41::server
