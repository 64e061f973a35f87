// ds41 model/loader: safetensors parsing (bounds-checked, fuzzed) and mmap-backed access.
#include "model/loader/safetensors.h"

#include "core/json_depth.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace ds41::model {

using json = nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(std::string_view text, uint64_t data_size) {
  // A header nests 3 levels (root -> entry -> shape). Deeper input is refused before parsing, so
  // a 256 MB header of '[' cannot build a tree of hundreds of millions of nodes first. (A linear
  // pre-scan, not a parser callback: nlohmann's callback parser rescans the parent object after
  // every member, which made a 2,000-tensor shard header quadratic — 6 s for the released layout.)
  constexpr int kMaxHeaderDepth = 8;
  if (json_nesting_exceeds(text, kMaxHeaderDepth))
    return invalid_argument("header JSON nests deeper than " + std::to_string(kMaxHeaderDepth) + " levels");
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("header is not valid JSON");
  if (!j.is_object()) return invalid_argument("header JSON is not an object");
  SafetensorsHeader h;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return invalid_argument("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return invalid_argument("__metadata__." + m.key() + " is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return invalid_argument("tensor '" + name + "': entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return invalid_argument("tensor '" + name + "': missing or non-string dtype");
    if (sh == v.end() || !sh->is_array()) return invalid_argument("tensor '" + name + "': missing or non-array shape");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return invalid_argument("tensor '" + name + "': data_offsets must be [begin, end]");
    TensorInfo t;
    t.name = name;
    auto parsed = dtype_from_name(dt->get<std::string>());
    if (!parsed) return invalid_argument("tensor '" + name + "': unknown dtype '" + dt->get<std::string>() + "'");
    t.dtype = *parsed;
    if (sh->size() > 8) return invalid_argument("tensor '" + name + "': rank " + std::to_string(sh->size()) + " > 8");
    // numel with overflow guard (each dim < 2^40, product < 2^62).
    unsigned __int128 numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        return invalid_argument("tensor '" + name + "': shape entries must be non-negative integers");
      uint64_t dv = d.get<uint64_t>();
      if (dv > (1ull << 40)) return invalid_argument("tensor '" + name + "': absurd dimension " + std::to_string(dv));
      t.shape.push_back(static_cast<int64_t>(dv));
      numel *= dv;
      if (numel > (static_cast<unsigned __int128>(1) << 62))
        return invalid_argument("tensor '" + name + "': element count overflows");
    }
    for (const json& o : *off)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        return invalid_argument("tensor '" + name + "': data_offsets must be non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.end < t.begin)
      return invalid_argument("tensor '" + name + "': data_offsets end " + std::to_string(t.end) + " < begin " +
                              std::to_string(t.begin));
    unsigned __int128 want = numel * dtype_size(t.dtype);
    if (want != t.end - t.begin)
      return invalid_argument("tensor '" + name + "': " + std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape) +
                              " needs " + std::to_string(static_cast<uint64_t>(want)) + " bytes but data_offsets span " +
                              std::to_string(t.end - t.begin));
    if (t.end > data_size)
      return out_of_range("tensor '" + name + "': data_offsets end " + std::to_string(t.end) +
                          " beyond the data section (" + std::to_string(data_size) + " bytes; file truncated?)");
    h.tensors.emplace(name, std::move(t));
  }
  // Overlap check: sort by begin; zero-sized tensors never overlap.
  std::vector<const TensorInfo*> order;
  for (auto& [n, t] : h.tensors)
    if (t.nbytes() > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      return invalid_argument("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap (bytes " +
                              std::to_string(order[i]->begin) + ".." + std::to_string(order[i - 1]->end) + ")");
  return h;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error(path + ": fstat failed");
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return data_loss(path + ": file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  }
  uint8_t lenb[8];
  if (pread(fd, lenb, 8, 0) != 8) {
    ::close(fd);
    return io_error(path + ": cannot read header length");
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenb[i];
  if (hlen > kMaxSafetensorsHeader) {
    ::close(fd);
    return invalid_argument(path + ": header length " + std::to_string(hlen) + " is absurd (limit " +
                            std::to_string(kMaxSafetensorsHeader) + ")");
  }
  if (hlen > size - 8) {
    ::close(fd);
    return data_loss(path + ": header length " + std::to_string(hlen) + " exceeds the file (" +
                     std::to_string(size) + " bytes)");
  }
  std::string text(hlen, '\0');
  if (hlen > 0 && pread(fd, text.data(), hlen, 8) != static_cast<ssize_t>(hlen)) {
    ::close(fd);
    return io_error(path + ": cannot read header");
  }
  auto header = parse_safetensors_header(text, size - 8 - hlen);
  if (!header.ok()) {
    ::close(fd);
    return header.status().with_context(path);
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return io_error(path + ": mmap failed (" + std::strerror(errno) + ")");
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->header_ = std::move(header).value();
  f->file_size_ = size;
  f->map_ = map;
  f->data_base_ = static_cast<const uint8_t*>(map) + 8 + hlen;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, file_size_);
}

const TensorRef* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t Checkpoint::payload_bytes() const {
  uint64_t s = 0;
  for (auto& [n, t] : tensors_) s += t.info->nbytes();
  return s;
}

namespace {

// A symlink checked out where symlinks are not kept (git core.symlinks=false, copies through
// tools that flatten links) becomes a small text file holding the link's target. The golden
// DSpark set links its text weights as ../v41-tiny-public/model.safetensors this way. Such a
// stub (under 1 KiB, one line naming an existing *.safetensors file relative to the stub's
// folder) is followed; anything else is opened as is.
std::string follow_link_stub(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) >= 1024 || ec) return path;
  std::ifstream in(path);
  std::string target((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!target.empty() && (target.back() == '\n' || target.back() == '\r')) target.pop_back();
  if (target.empty() || target.find('\n') != std::string::npos || !target.ends_with(".safetensors"))
    return path;
  const fs::path resolved = fs::path(path).parent_path() / target;
  if (!fs::is_regular_file(resolved, ec) || fs::file_size(resolved, ec) < 1024) return path;
  return resolved.string();
}

}  // namespace

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto ck = std::make_unique<Checkpoint>();
  ck->dir_ = dir;
  std::string index = dir + "/model.safetensors.index.json";
  std::string single = dir + "/model.safetensors";
  std::error_code ec;
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_files;
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return invalid_argument(index + ": not valid JSON");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) return invalid_argument(index + ": missing object 'weight_map'");
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) return invalid_argument(index + ": weight_map['" + it.key() + "'] is not a string");
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || shard.empty())
        return invalid_argument(index + ": weight_map['" + it.key() + "'] names an invalid shard '" + shard + "'");
      weight_map[it.key()] = shard;
      if (std::find(shard_files.begin(), shard_files.end(), shard) == shard_files.end()) shard_files.push_back(shard);
    }
    std::sort(shard_files.begin(), shard_files.end());
  } else if (fs::exists(single, ec)) {
    shard_files.push_back("model.safetensors");
  } else {
    return not_found(dir + ": neither model.safetensors nor model.safetensors.index.json exists");
  }
  std::string errors;
  for (const std::string& sf : shard_files) {
    auto f = SafetensorsFile::open(follow_link_stub(dir + "/" + sf));
    if (!f.ok()) {
      errors += f.status().message() + "\n";
      continue;
    }
    ck->files_.push_back(std::move(f).value());
    const SafetensorsFile* file = ck->files_.back().get();
    for (auto& [name, info] : file->header().tensors) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(name);
        if (w == weight_map.end()) {
          errors += dir + "/" + sf + ": tensor '" + name + "' is not listed in the index weight_map\n";
          continue;
        }
        if (w->second != sf) {
          errors += dir + "/" + sf + ": tensor '" + name + "' is mapped to shard '" + w->second + "' in the index\n";
          continue;
        }
      }
      if (ck->tensors_.count(name)) {
        errors += dir + "/" + sf + ": tensor '" + name + "' appears in more than one shard\n";
        continue;
      }
      ck->tensors_[name] = TensorRef{&info, file->data(info), file};
    }
  }
  for (auto& [name, shard] : weight_map)
    if (!ck->tensors_.count(name) && errors.find("'" + name + "'") == std::string::npos &&
        errors.find(dir + "/" + shard + ":") == std::string::npos)
      errors += index + ": tensor '" + name + "' listed for shard '" + shard + "' is missing from it\n";
  if (!errors.empty()) {
    if (errors.back() == '\n') errors.pop_back();
    return invalid_argument(errors);
  }
  return ck;
}

}  // namespace ds41::model
