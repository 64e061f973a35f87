// ds41 server: the embedded chat page (see chat_page.h). The generated header comes from
// chat_page.html at configure time (src/server/CMakeLists.txt).
#include "server/chat_page.h"

#include "server/chat_page_html.h"

namespace ds41::server {

std::string_view chat_page_html() { return {generated::kChatPageHtml, sizeof(generated::kChatPageHtml) - 1}; }

}  // namespace ds41::server
