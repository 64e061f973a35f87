// ds41 kvcache test support: FaultInjectingIo wraps another FileIo and injects failed/short
// writes, ENOSPC, fsync errors, torn or corrupted writes and corrupted reads on a schedule, so the
// reliability tests can prove nothing corrupt is ever served. Built as ds41_kvcache_testing,
// linked only by tests: fault injection is not part of the production library.
#pragma once

#include <atomic>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kvcache/file_io.h"

namespace ds41::kvcache {

enum class FaultKind {
  kFailWrite,     // pwrite returns EIO, nothing written
  kShortWrite,    // pwrite writes only half and reports that (legal POSIX behaviour)
  kNoSpace,       // pwrite returns ENOSPC
  kTornWrite,     // pwrite writes only half but reports full success (lost data)
  kCorruptWrite,  // pwrite writes everything with one byte flipped, reports success
  kFailFsync,     // fsync returns EIO
  kFailRename,    // rename returns EIO
  kFailDirFsync,  // fsync_dir returns EIO (the rename happened but is not known durable)
  kFailRead,      // pread returns EIO
  kCorruptRead,   // pread flips one byte of what it returns
};

// Wraps `base`. A rule fires on the eligible calls (writes for the write kinds, fsync, rename,
// reads) numbered [skip, skip+times) counted from when it was added; times < 0 = forever.
class FaultInjectingIo final : public ForwardingIo {
 public:
  explicit FaultInjectingIo(FileIo& base) : ForwardingIo(base) {}
  void inject(FaultKind kind, int skip = 0, int times = 1);
  void clear();
  // How many faults fired so far.
  int fired() const { return fired_.load(); }

  Result<size_t> pwrite(int fd, const void* buf, size_t n, uint64_t offset) override;
  Result<size_t> pread(int fd, void* buf, size_t n, uint64_t offset) override;
  Status fsync(int fd) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status fsync_dir(const std::string& dir) override;
  // The batched forms go through this object's fsync / fsync_dir one by one, so their faults apply.
  std::vector<Status> fsync_many(std::span<const int> fds) override { return FileIo::fsync_many(fds); }
  std::vector<Status> fsync_dirs(std::span<const std::string> dirs) override {
    return FileIo::fsync_dirs(dirs);
  }

 private:
  enum class Op { kWrite, kFsync, kRename, kRead, kDirFsync };
  struct Rule {
    FaultKind kind;
    Op op;
    int skip;
    int times;
    int seen = 0;
  };
  // Returns the fault to apply to this call of `op`, if any (advances rule counters).
  bool take(Op op, FaultKind* kind);

  std::mutex mu_;  // guards rules_
  std::vector<Rule> rules_;
  std::atomic<int> fired_{0};
};

}  // namespace ds41::kvcache
