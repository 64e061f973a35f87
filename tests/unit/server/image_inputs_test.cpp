// server/image_inputs: the prefix cache's image key (issue 16). resolve_request_images sets each
// RequestImage's content_hash to XXH3-128 of the image's encoded bytes (docs/formats/kv_block.md
// "Prompts with images"), the same hash the vision-feature cache key starts with, and expands the
// placeholder to the image's span.
#include "server/image_inputs.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <iterator>

namespace ds41::server {
namespace {

std::string base64(const std::vector<uint8_t>& b) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t v = (uint32_t{b[i]} << 16) | (i + 1 < b.size() ? uint32_t{b[i + 1]} << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t{b[i + 2]} : 0);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < b.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < b.size() ? k[v & 63] : '=';
  }
  return out;
}

TEST(ImageInputs, RequestImagesCarryTheBytesContentHash) {
  const std::string path = std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-vision-public/images/image0.png";
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f) << path;
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  VisionModelInfo vm;
  vm.enabled = true;
  vm.image_token_id = 2047;
  vm.placeholder_id = 9;
  vm.config_key = "cfg";
  std::vector<int32_t> ids{0, 5, 9, 6};
  int64_t image_tokens = 0;
  auto r = resolve_request_images({"data:image/png;base64," + base64(bytes)}, vm, ImageInputOptions{}, &ids,
                                  &image_tokens);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value().size(), 1u);
  const engine::RequestImage& im = r.value()[0];
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  ASSERT_TRUE(im.content_hash.has_value());
  EXPECT_EQ(im.content_hash->hi, h.high64);
  EXPECT_EQ(im.content_hash->lo, h.low64);
  char hex[40];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  EXPECT_EQ(im.cache_key, std::string(hex) + "/cfg");
  EXPECT_EQ(im.span_start, 2);
  EXPECT_GT(im.span_length, 0);
  EXPECT_EQ(image_tokens, im.span_length);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), 3 + im.span_length);
  // Other bytes, another hash.
  EXPECT_FALSE(image_content_hash(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1)) == *im.content_hash);
}

}  // namespace
}  // namespace ds41::server
