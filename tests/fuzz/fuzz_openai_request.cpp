// libFuzzer target: the OpenAI request parsers/validators of the server (issue 12) on arbitrary
// bytes, through the entry point the CI replay test uses (openai_request_entry.h). Aborts when an
// invariant breaks (a 500 for bad input, a rejection without a message, an out-of-range value
// accepted); crashes, hangs and sanitizer reports are findings too. Run:
//   build-fuzz/tests/fuzz/ds41_fuzz_openai_request -dict=tests/fuzz/json.dict \
//     -runs=1000000 <scratch-corpus-dir> tests/fuzz/corpus/openai_request
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "openai_request_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string broken =
      ds41::fuzz::fuzz_openai_request(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
