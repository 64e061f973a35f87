// ds41 server: the chat page served at GET / (src/server/chat_page.html, compiled into the
// binary). One static HTML+JS document with no external resources.
#pragma once

#include <string_view>

namespace ds41::server {

// The page's bytes (UTF-8 HTML), valid for the program's lifetime.
std::string_view chat_page_html();

}  // namespace ds41::server
