// ds41 kvcache test support: FaultInjectingIo.
#include "support/kvcache/fault_injecting_io.h"

#include <string>

namespace ds41::kvcache {

void FaultInjectingIo::inject(FaultKind kind, int skip, int times) {
  Op op = Op::kWrite;
  switch (kind) {
    case FaultKind::kFailFsync: op = Op::kFsync; break;
    case FaultKind::kFailRename: op = Op::kRename; break;
    case FaultKind::kFailDirFsync: op = Op::kDirFsync; break;
    case FaultKind::kFailRead:
    case FaultKind::kCorruptRead: op = Op::kRead; break;
    default: op = Op::kWrite; break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(Rule{kind, op, skip, times});
}

void FaultInjectingIo::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.clear();
}

bool FaultInjectingIo::take(Op op, FaultKind* kind) {
  std::lock_guard<std::mutex> lock(mu_);
  bool hit = false;
  for (Rule& r : rules_) {
    if (r.op != op) continue;
    int n = r.seen++;
    if (!hit && n >= r.skip && (r.times < 0 || n < r.skip + r.times)) {
      *kind = r.kind;
      hit = true;
    }
  }
  if (hit) fired_.fetch_add(1);
  return hit;
}

Result<size_t> FaultInjectingIo::pwrite(int fd, const void* buf, size_t n, uint64_t offset) {
  FaultKind k;
  if (!take(Op::kWrite, &k)) return base_.pwrite(fd, buf, n, offset);
  switch (k) {
    case FaultKind::kFailWrite: return io_error("write fd " + std::to_string(fd) + ": injected EIO");
    case FaultKind::kNoSpace:
      return resource_exhausted("write fd " + std::to_string(fd) +
                                ": injected ENOSPC (No space left on device)");
    case FaultKind::kShortWrite: return base_.pwrite(fd, buf, n / 2 > 0 ? n / 2 : n, offset);
    case FaultKind::kTornWrite: {
      auto r = base_.pwrite(fd, buf, n / 2, offset);
      if (!r.ok()) return r;
      return n;  // lie: the rest never reached the disk
    }
    case FaultKind::kCorruptWrite: {
      std::vector<uint8_t> copy(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + n);
      if (!copy.empty()) copy[copy.size() / 2] ^= 0x40;
      return base_.pwrite(fd, copy.data(), n, offset);
    }
    default: return base_.pwrite(fd, buf, n, offset);
  }
}

Result<size_t> FaultInjectingIo::pread(int fd, void* buf, size_t n, uint64_t offset) {
  FaultKind k;
  if (!take(Op::kRead, &k)) return base_.pread(fd, buf, n, offset);
  if (k == FaultKind::kFailRead) return io_error("read fd " + std::to_string(fd) + ": injected EIO");
  auto r = base_.pread(fd, buf, n, offset);
  if (r.ok() && *r > 0) static_cast<uint8_t*>(buf)[*r / 2] ^= 0x01;
  return r;
}

Status FaultInjectingIo::fsync(int fd) {
  FaultKind k;
  if (take(Op::kFsync, &k)) return io_error("fsync fd " + std::to_string(fd) + ": injected EIO");
  return base_.fsync(fd);
}

Status FaultInjectingIo::rename(const std::string& from, const std::string& to) {
  FaultKind k;
  if (take(Op::kRename, &k)) return io_error("rename " + from + ": injected EIO");
  return base_.rename(from, to);
}

Status FaultInjectingIo::fsync_dir(const std::string& dir) {
  FaultKind k;
  if (take(Op::kDirFsync, &k)) return io_error("fsync dir " + dir + ": injected EIO");
  return base_.fsync_dir(dir);
}

}  // namespace ds41::kvcache
