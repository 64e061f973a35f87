// ds41 server: Server-Sent Events framing as OpenAI streams use it: one `data: <json>\n\n` per
// chunk, `data: [DONE]\n\n` at the end, `: comment\n\n` as a keep-alive that clients ignore.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ds41::server {

// The JSON is written on one line (nlohmann escapes newlines inside strings), so one event is
// one `data:` line. Invalid UTF-8 in model output becomes U+FFFD.
std::string sse_event(const nlohmann::ordered_json& j);
std::string sse_done();
// A comment line; newlines in `text` are replaced so it stays one comment.
std::string sse_comment(std::string_view text);

}  // namespace ds41::server
