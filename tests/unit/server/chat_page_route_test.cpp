// ds41 server tests: GET / serves the embedded chat page (src/server/chat_page.html) — the exact
// bytes of the source file, as HTML, without a key and while the model loads, with no external
// resources; the API routes stay guarded by the key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server/api_service.h"
#include "server/chat_page.h"

namespace ds41::server {
namespace {

std::string read_source_page() {
  std::ifstream f(std::string(DS41_SOURCE_DIR) + "/src/server/chat_page.html", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

HttpRequest get(const std::string& path) {
  HttpRequest r;
  r.method = "GET";
  r.path = path;
  r.remote = "127.0.0.1:1";
  return r;
}

TEST(ChatPageRoute, ServesTheSourceFileWithoutKeyWhileLoading) {
  ServerMetrics metrics;
  ServiceConfig sc;
  sc.api_key = "sekret";
  ApiService service(sc, &metrics);  // never set_ready: the model is still loading
  HttpResponse r = service.handle(get("/"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type.rfind("text/html", 0), 0u) << r.content_type;
  const std::string src = read_source_page();
  ASSERT_FALSE(src.empty()) << "cannot read src/server/chat_page.html";
  EXPECT_EQ(r.body, src) << "the embedded page is not the source file";
  EXPECT_EQ(std::string(chat_page_html()), src);
  // The page streams from the chat route and asks for the key (Bearer) when one is needed.
  EXPECT_NE(r.body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_NE(r.body.find("\"Bearer \""), std::string::npos);
  // No external resources: nothing is fetched from another origin.
  for (const char* ext : {"http://", "https://", "src=\"//", "href=\"//"})
    EXPECT_EQ(r.body.find(ext), std::string::npos) << ext;
  // The API itself still needs the key.
  EXPECT_EQ(service.handle(get("/v1/models")).status, 401);
  EXPECT_EQ(service.handle(get("/index.php")).status, 404);
}

}  // namespace
}  // namespace ds41::server
