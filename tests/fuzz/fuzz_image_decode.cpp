// libFuzzer target: image::decode_image + prepare_image on arbitrary bytes (issue 16). Seeds:
// tests/fuzz/corpus/image (made by tests/unit/image/fixtures/make_image_fixtures.py). Aborts when
// fuzz_image_decode reports a broken invariant; ASan/UBSan catch the rest.
#include <cstdio>
#include <cstdlib>

#include "image_decode_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string r = ds41::fuzz::fuzz_image_decode(std::span<const uint8_t>(data, size));
  if (!r.empty()) {
    std::fprintf(stderr, "fuzz_image_decode: %s\n", r.c_str());
    std::abort();
  }
  return 0;
}
