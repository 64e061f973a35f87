// ds41 model/loader: streaming safetensors writer with holes, sharding and the index file.
#include "model/loader/checkpoint_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace ds41::model {

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

namespace {

std::string errno_text() { return std::strerror(errno); }

Status pwrite_all(int fd, const uint8_t* p, uint64_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, std::min<uint64_t>(n, 1ull << 30), static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return io_error(path + ": write failed at offset " + std::to_string(off) + " (" + errno_text() + ")");
    }
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::create(
    const std::string& path, std::vector<TensorSpec> tensors,
    const std::map<std::string, std::string>& metadata) {
  // Built as text (not via ordered_json, whose inserts are linear): tensors in list order.
  std::string text = "{";
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    text += "\"__metadata__\":" + m.dump();
  }
  std::set<std::string> seen;
  uint64_t off = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name == "__metadata__" || !seen.insert(t.name).second)
      return invalid_argument(path + ": duplicate or reserved tensor name '" + t.name + "'");
    uint64_t n = t.nbytes();
    nlohmann::json e = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    if (text.size() > 1) text += ",";
    text += nlohmann::json(t.name).dump() + ":" + e.dump();
    off += n;
  }
  text += "}";
  while (text.size() % 8) text.push_back(' ');  // data section 8-byte aligned (as the reference writer does)
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create (" + errno_text() + ")");
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->path_ = path;
  w->fd_ = fd;
  w->tensors_ = std::move(tensors);
  w->header_len_ = text.size();
  w->data_size_ = off;
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(w->header_len_ >> (8 * i));
  DS41_RETURN_IF_ERROR(pwrite_all(fd, len, 8, 0, path));
  DS41_RETURN_IF_ERROR(pwrite_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 8, path));
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status SafetensorsStreamWriter::write_next(const uint8_t* data, uint64_t n) {
  if (next_ >= tensors_.size()) return failed_precondition(path_ + ": write past the last tensor");
  const TensorSpec& t = tensors_[next_];
  if (n != t.nbytes())
    return invalid_argument(path_ + ": tensor '" + t.name + "' needs " + std::to_string(t.nbytes()) +
                            " bytes, got " + std::to_string(n));
  DS41_RETURN_IF_ERROR(pwrite_all(fd_, data, n, 8 + header_len_ + cursor_, path_));
  cursor_ += n;
  ++next_;
  return ok_status();
}

Status SafetensorsStreamWriter::skip_next() {
  if (next_ >= tensors_.size()) return failed_precondition(path_ + ": skip past the last tensor");
  cursor_ += tensors_[next_].nbytes();  // never written: stays a hole after finish()'s ftruncate
  ++next_;
  return ok_status();
}

Status SafetensorsStreamWriter::finish() {
  if (fd_ < 0) return failed_precondition(path_ + ": already finished");
  if (next_ != tensors_.size())
    return failed_precondition(path_ + ": finish() with " + std::to_string(tensors_.size() - next_) +
                               " tensors neither written nor skipped");
  if (::ftruncate(fd_, static_cast<off_t>(file_size())) != 0)
    return io_error(path_ + ": ftruncate to " + std::to_string(file_size()) + " failed (" + errno_text() +
                    ")");
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return io_error(path_ + ": close failed (" + errno_text() + ")");
  return ok_status();
}

std::vector<int> assign_shards(const std::vector<uint64_t>& sizes, int shards) {
  const size_t n = sizes.size();
  std::vector<int> out(n, 0);
  if (n == 0 || shards <= 1) return out;
  const int k = static_cast<int>(std::min<size_t>(static_cast<size_t>(shards), n));
  long double total = 0;
  for (uint64_t s : sizes) total += static_cast<long double>(s);
  long double before = 0;
  int prev = 0;
  for (size_t i = 0; i < n; ++i) {
    // Target: the shard holding this tensor's midpoint in a byte-balanced split.
    long double mid = before + static_cast<long double>(sizes[i]) / 2;
    int target = total > 0 ? static_cast<int>(mid * k / total) : static_cast<int>(i * k / n);
    target = std::clamp(target, 0, k - 1);
    int s = i == 0 ? 0 : std::clamp(target, prev, prev + 1);  // contiguous, no skipped shard
    // Leave at least one tensor for every remaining shard.
    const int min_s = k - static_cast<int>(n - i);
    s = std::max(s, min_s);
    out[i] = s;
    prev = s;
    before += static_cast<long double>(sizes[i]);
  }
  return out;
}

std::string shard_file_name(int i, int k) {
  if (k <= 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i + 1, k);
  return buf;
}

Status write_text_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error(path + ": cannot create (" + errno_text() + ")");
  Status s = pwrite_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 0, path);
  if (::close(fd) != 0 && s.ok()) return io_error(path + ": close failed (" + errno_text() + ")");
  return s;
}

Status write_checkpoint(const std::string& dir, const std::vector<TensorSpec>& tensors,
                        const CheckpointWriteOptions& options, const TensorFillFn& fill) {
  if (options.shards < 1)
    return invalid_argument("shards must be >= 1, got " + std::to_string(options.shards));
  if (!options.layout_only && !fill)
    return invalid_argument("write_checkpoint: no fill function and not layout-only");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create directory (" + ec.message() + ")");
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    sizes.push_back(t.nbytes());
    total += sizes.back();
  }
  std::vector<int> shard_of = assign_shards(sizes, options.shards);
  const int k = tensors.empty() ? 1 : shard_of.back() + 1;
  if (tensors.size() >= static_cast<size_t>(options.shards) && k != options.shards)
    return internal_error("shard assignment produced " + std::to_string(k) + " shards");
  nlohmann::json weight_map = nlohmann::json::object();  // sorted, as in the release
  std::vector<uint8_t> buf;
  uint64_t done = 0;
  size_t i = 0;
  for (int s = 0; s < k; ++s) {
    std::vector<TensorSpec> part;
    std::vector<size_t> idx;
    for (size_t j = i; j < tensors.size() && shard_of[j] == s; ++j) {
      part.push_back(tensors[j]);
      idx.push_back(j);
    }
    const std::string fname = shard_file_name(s, k);
    DS41_ASSIGN_OR_RETURN(auto w, SafetensorsStreamWriter::create(dir + "/" + fname, part));
    for (size_t j : idx) {
      weight_map[tensors[j].name] = fname;
      if (options.layout_only) {
        DS41_RETURN_IF_ERROR(w->skip_next());
      } else {
        if (buf.size() < sizes[j]) buf.resize(sizes[j]);  // fill writes every byte
        DS41_RETURN_IF_ERROR(fill(j, buf.data(), sizes[j]).with_context("tensor '" + tensors[j].name + "'"));
        DS41_RETURN_IF_ERROR(w->write_next(buf.data(), sizes[j]));
      }
      done += sizes[j];
      if (options.progress) options.progress(done, total);
    }
    DS41_RETURN_IF_ERROR(w->finish());
    i += idx.size();
  }
  if (k > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    DS41_RETURN_IF_ERROR(write_text_file(dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  return ok_status();
}

}  // namespace ds41::model
