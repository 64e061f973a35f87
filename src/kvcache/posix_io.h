// ds41 kvcache: PosixIo, the real FileIo: POSIX calls with EINTR retries and errno-named errors,
// fstatat-relative directory listing, and the batched fsyncs of group commit submitted together
// through io_uring (with a plain-loop fallback where io_uring is unavailable).
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvcache/file_io.h"

namespace ds41::kvcache {

class PosixIo final : public FileIo {
 public:
  Result<int> open(const std::string& path, int flags, int mode) override;
  Result<size_t> pwrite(int fd, const void* buf, size_t n, uint64_t offset) override;
  Result<size_t> pread(int fd, void* buf, size_t n, uint64_t offset) override;
  Status fsync(int fd) override;
  Status start_writeback(int fd) override;
  Status advise_willneed(int fd) override;
  Status close(int fd) override;
  Result<FileStat> fstat(int fd) override;
  Result<FileStat> stat(const std::string& path) override;
  Status rename(const std::string& from, const std::string& to) override;
  Status unlink(const std::string& path) override;
  Status mkdir(const std::string& path) override;
  Status list_dir(const std::string& path, std::vector<std::string>* names) override;
  Status list_dir_stats(const std::string& path,
                        std::vector<std::pair<std::string, FileStat>>* entries) override;
  Status fsync_dir(const std::string& dir) override;
  std::vector<Status> fsync_many(std::span<const int> fds) override;
  std::vector<Status> fsync_dirs(std::span<const std::string> dirs) override;
  Status set_times_fd(int fd, int64_t atime_ns, int64_t mtime_ns) override;
  Status set_times(const std::string& path, int64_t atime_ns, int64_t mtime_ns) override;
  static PosixIo& instance();
};

}  // namespace ds41::kvcache
