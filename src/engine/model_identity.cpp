// ds41 engine: model_identity (model_identity.h).
#include "engine/model_identity.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

namespace ds41::engine {

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

// Hashes the whole file (small files) or its size plus samples (large ones) into `st`.
Status hash_file(XXH3_state_t* st, const std::filesystem::path& p, bool whole) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(p, ec);
  if (ec) return io_error("model identity: cannot stat " + p.string() + ": " + ec.message());
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(p.c_str(), "rb"));
  if (!f) return io_error("model identity: cannot open " + p.string());
  const std::string name = p.filename().string();
  XXH3_64bits_update(st, name.data(), name.size());
  XXH3_64bits_update(st, &size, sizeof(size));
  constexpr uint64_t kChunk = 64 * 1024, kSamples = 16;
  std::vector<char> buf(kChunk);
  auto read_at = [&](uint64_t off, uint64_t n) -> Status {
    if (std::fseek(f.get(), static_cast<long>(off), SEEK_SET) != 0)
      return io_error("model identity: cannot seek in " + p.string());
    const size_t got = std::fread(buf.data(), 1, n, f.get());
    if (got != n) return io_error("model identity: short read of " + p.string());
    XXH3_64bits_update(st, buf.data(), got);
    return ok_status();
  };
  if (whole || size <= kChunk * kSamples) {
    for (uint64_t off = 0; off < size; off += kChunk)
      DS41_RETURN_IF_ERROR(read_at(off, std::min(kChunk, size - off)));
    return ok_status();
  }
  for (uint64_t i = 0; i < kSamples; ++i) {
    const uint64_t off = i * ((size - kChunk) / (kSamples - 1));
    DS41_RETURN_IF_ERROR(read_at(off, kChunk));
  }
  return ok_status();
}

std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

Result<std::string> model_identity(const std::string& model_dir, const model::KvLayout& layout) {
  namespace fs = std::filesystem;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> cfg(XXH3_createState(), &XXH3_freeState);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> w(XXH3_createState(), &XXH3_freeState);
  XXH3_64bits_reset(cfg.get());
  XXH3_64bits_reset(w.get());
  DS41_RETURN_IF_ERROR(hash_file(cfg.get(), fs::path(model_dir) / "config.json", true));
  std::vector<fs::path> shards;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(model_dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  if (ec) return io_error("model identity: cannot list " + model_dir + ": " + ec.message());
  if (shards.empty()) return not_found("model identity: no *.safetensors in " + model_dir);
  std::sort(shards.begin(), shards.end());
  for (const fs::path& p : shards) DS41_RETURN_IF_ERROR(hash_file(w.get(), p, false));
  std::string lay = "n_layers=" + std::to_string(layout.n_layers) +
                    ",window=" + std::to_string(layout.window) +
                    ",window_row=" + std::to_string(layout.window_row_bytes);
  for (const model::KvSourceLayout& s : layout.sources)
    lay += ",src" + std::to_string(s.layer) + ":r" + std::to_string(s.ratio) + ":" +
           std::to_string(s.kv_row_bytes) + "+" + std::to_string(s.key_row_bytes);
  return "ds41-kv1 config=" + hex64(XXH3_64bits_digest(cfg.get())) +
         " weights=" + hex64(XXH3_64bits_digest(w.get())) + " layout=" + lay + " swa-payload=1";
}

}  // namespace ds41::engine
