// Shared helpers for the kvcache tests: a unique scratch directory removed on destruction,
// deterministic payloads.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace ds41::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static int seq = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("ds41-kv-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(seq++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string sub(const std::string& s) const { return (path_ / s).string(); }

 private:
  std::filesystem::path path_;
};

inline std::vector<uint8_t> make_payload(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ULL + 1);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = static_cast<uint8_t>(x >> (8 * j));
  }
  return v;
}

inline std::vector<int32_t> make_tokens(uint64_t seed, size_t n, int32_t vocab = 129280) {
  std::vector<int32_t> t(n);
  std::mt19937_64 rng(seed);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

}  // namespace ds41::testing
