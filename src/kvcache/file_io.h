// ds41 kvcache: the injectable file I/O interface under the persistent tier. FileIo is a thin
// POSIX-shaped interface (PosixIo in posix_io.h is the real one; tests wrap it to inject faults,
// the benchmark to time calls); ForwardingIo is the base of such decorators. Also owns the
// whole-file read every reader uses. Atomic publish is in atomic_publish.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ds41::kvcache {

struct FileStat {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t atime_ns = 0;
  uint64_t ino = 0;
  uint64_t dev = 0;
  bool is_regular = false;
  bool is_dir = false;
};

// Timestamp value meaning "leave unchanged" for set_times().
inline constexpr int64_t kTimeOmit = -1;

// All paths are absolute or relative to the process cwd. Every call returns an error Status
// naming the path and errno text instead of throwing. Thread-safe. Callers hold the descriptors
// open() returns in a UniqueFd (unique_fd.h), which closes them through the same FileIo.
class FileIo {
 public:
  virtual ~FileIo() = default;
  // open(2) flags; O_CLOEXEC is always added. kNotFound when the path does not exist.
  virtual Result<int> open(const std::string& path, int flags, int mode = 0644) = 0;
  // May write fewer bytes than asked (callers use write_fully).
  virtual Result<size_t> pwrite(int fd, const void* buf, size_t n, uint64_t offset) = 0;
  // Returns 0 at end of file; may read fewer bytes than asked.
  virtual Result<size_t> pread(int fd, void* buf, size_t n, uint64_t offset) = 0;
  virtual Status fsync(int fd) = 0;
  // Starts asynchronous writeback of the file's dirty pages without waiting (a hint: the later
  // fsync is what makes data durable and reports errors). Lets a batch of files reach the disk
  // together so that their fsyncs share one journal commit. Default: nothing.
  virtual Status start_writeback(int fd) {
    (void)fd;
    return ok_status();
  }
  // Asks the kernel to start reading the whole file into the page cache without waiting (a
  // hint; restores use it to keep many block reads in flight). Default: nothing.
  virtual Status advise_willneed(int fd) {
    (void)fd;
    return ok_status();
  }
  virtual Status close(int fd) = 0;
  virtual Result<FileStat> fstat(int fd) = 0;
  // kNotFound when absent.
  virtual Result<FileStat> stat(const std::string& path) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;
  // kNotFound when absent.
  virtual Status unlink(const std::string& path) = 0;
  // Creates one directory; ok when it already exists.
  virtual Status mkdir(const std::string& path) = 0;
  // Entry names of a directory (without "." and "..").
  virtual Status list_dir(const std::string& path, std::vector<std::string>* names) = 0;
  // Entry names of a directory with their stat (entries that vanish meanwhile are skipped).
  // The default lists then stats each path; PosixIo stats relative to the open directory
  // (no path walk per entry: the index rebuild stats every block file).
  virtual Status list_dir_stats(const std::string& path,
                                std::vector<std::pair<std::string, FileStat>>* entries);
  // Makes a rename inside `dir` durable.
  virtual Status fsync_dir(const std::string& dir) = 0;
  // Batched forms for group commit: one Status per element, in order. The defaults call
  // fsync / fsync_dir one after the other; PosixIo submits them all at once through io_uring
  // (they then wait for the same journal commit together instead of one after another) and
  // falls back to the loop where io_uring is unavailable.
  virtual std::vector<Status> fsync_many(std::span<const int> fds);
  virtual std::vector<Status> fsync_dirs(std::span<const std::string> dirs);
  // Explicit access/modification times in Unix ns (kTimeOmit keeps one unchanged).
  virtual Status set_times_fd(int fd, int64_t atime_ns, int64_t mtime_ns) = 0;
  virtual Status set_times(const std::string& path, int64_t atime_ns, int64_t mtime_ns) = 0;
};

// A FileIo that passes every call to `base`: decorators (the tests' fault injection and call
// recording, the benchmark's timing) derive from it and override only the calls they change.
class ForwardingIo : public FileIo {
 public:
  explicit ForwardingIo(FileIo& base) : base_(base) {}
  Result<int> open(const std::string& p, int flags, int mode) override { return base_.open(p, flags, mode); }
  Result<size_t> pwrite(int fd, const void* b, size_t n, uint64_t o) override {
    return base_.pwrite(fd, b, n, o);
  }
  Result<size_t> pread(int fd, void* b, size_t n, uint64_t o) override { return base_.pread(fd, b, n, o); }
  Status fsync(int fd) override { return base_.fsync(fd); }
  Status start_writeback(int fd) override { return base_.start_writeback(fd); }
  Status advise_willneed(int fd) override { return base_.advise_willneed(fd); }
  Status close(int fd) override { return base_.close(fd); }
  Result<FileStat> fstat(int fd) override { return base_.fstat(fd); }
  Result<FileStat> stat(const std::string& p) override { return base_.stat(p); }
  Status rename(const std::string& from, const std::string& to) override { return base_.rename(from, to); }
  Status unlink(const std::string& p) override { return base_.unlink(p); }
  Status mkdir(const std::string& p) override { return base_.mkdir(p); }
  Status list_dir(const std::string& p, std::vector<std::string>* names) override {
    return base_.list_dir(p, names);
  }
  Status list_dir_stats(const std::string& p, std::vector<std::pair<std::string, FileStat>>* e) override {
    return base_.list_dir_stats(p, e);
  }
  Status fsync_dir(const std::string& d) override { return base_.fsync_dir(d); }
  std::vector<Status> fsync_many(std::span<const int> fds) override { return base_.fsync_many(fds); }
  std::vector<Status> fsync_dirs(std::span<const std::string> dirs) override {
    return base_.fsync_dirs(dirs);
  }
  Status set_times_fd(int fd, int64_t a, int64_t m) override { return base_.set_times_fd(fd, a, m); }
  Status set_times(const std::string& p, int64_t a, int64_t m) override { return base_.set_times(p, a, m); }

 protected:
  FileIo& base_;
};

// Reads a whole file (size from fstat, then reads until EOF). kNotFound when absent.
// When `st` is non-null it receives the fstat of the opened file.
Result<std::vector<uint8_t>> read_whole_file(FileIo& io, const std::string& path, FileStat* st = nullptr);

}  // namespace ds41::kvcache
