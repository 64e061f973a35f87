// ds41 kvcache: PosixIo — the real FileIo over POSIX calls and io_uring.
#include "kvcache/posix_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "kvcache/unique_fd.h"

namespace ds41::kvcache {
namespace {

Status errno_status(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return not_found(msg);
  if (err == ENOSPC || err == EDQUOT) return resource_exhausted(msg);
  return io_error(msg);
}
std::string fd_name(int fd) { return "fd " + std::to_string(fd); }
// Some filesystems (e.g. certain network mounts) do not support fsync on a directory: not an error.
bool dir_fsync_unsupported(int err) { return err == EINVAL || err == EROFS; }

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};
using DirHandle = std::unique_ptr<DIR, DirCloser>;

int64_t ts_ns(const struct timespec& t) { return static_cast<int64_t>(t.tv_sec) * 1000000000LL + t.tv_nsec; }
FileStat to_file_stat(const struct stat& s) {
  FileStat f;
  f.size = static_cast<uint64_t>(s.st_size);
  f.mtime_ns = ts_ns(s.st_mtim);
  f.atime_ns = ts_ns(s.st_atim);
  f.ino = s.st_ino;
  f.dev = s.st_dev;
  f.is_regular = S_ISREG(s.st_mode);
  f.is_dir = S_ISDIR(s.st_mode);
  return f;
}
struct timespec to_ts(int64_t ns) {
  struct timespec t;
  if (ns == kTimeOmit) {
    t.tv_sec = 0;
    t.tv_nsec = UTIME_OMIT;
  } else {
    t.tv_sec = ns / 1000000000LL;
    t.tv_nsec = ns % 1000000000LL;
  }
  return t;
}

}  // namespace

PosixIo& PosixIo::instance() {
  static PosixIo io;
  return io;
}

Result<int> PosixIo::open(const std::string& path, int flags, int mode) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  // O_NOATIME is refused (EPERM) on files owned by another user: fall back to a plain open.
  if (fd < 0 && errno == EPERM && (flags & O_NOATIME)) return open(path, flags & ~O_NOATIME, mode);
  if (fd < 0) return errno_status("open", path, errno);
  return fd;
}

Result<size_t> PosixIo::pwrite(int fd, const void* buf, size_t n, uint64_t offset) {
  ssize_t r;
  do r = ::pwrite(fd, buf, n, static_cast<off_t>(offset));
  while (r < 0 && errno == EINTR);
  if (r < 0) return errno_status("write", fd_name(fd), errno);
  return static_cast<size_t>(r);
}

Result<size_t> PosixIo::pread(int fd, void* buf, size_t n, uint64_t offset) {
  ssize_t r;
  do r = ::pread(fd, buf, n, static_cast<off_t>(offset));
  while (r < 0 && errno == EINTR);
  if (r < 0) return errno_status("read", fd_name(fd), errno);
  return static_cast<size_t>(r);
}

Status PosixIo::fsync(int fd) {
  if (::fsync(fd) != 0) return errno_status("fsync", fd_name(fd), errno);
  return ok_status();
}

Status PosixIo::start_writeback(int fd) {
  // Only a hint: filesystems without it (EINVAL, ESPIPE, ENOSYS) just wait for the fsync.
  if (::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0 && errno != EINVAL && errno != ESPIPE &&
      errno != ENOSYS)
    return errno_status("sync_file_range", fd_name(fd), errno);
  return ok_status();
}

Status PosixIo::advise_willneed(int fd) {
  int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);  // returns the error number
  if (err != 0) return errno_status("posix_fadvise", fd_name(fd), err);
  return ok_status();
}

Status PosixIo::close(int fd) {
  // Linux: the fd is released even when close reports an error; never retry.
  if (::close(fd) != 0 && errno != EINTR) return errno_status("close", fd_name(fd), errno);
  return ok_status();
}

Result<FileStat> PosixIo::fstat(int fd) {
  struct stat s;
  if (::fstat(fd, &s) != 0) return errno_status("fstat", fd_name(fd), errno);
  return to_file_stat(s);
}

Result<FileStat> PosixIo::stat(const std::string& path) {
  struct stat s;
  if (::stat(path.c_str(), &s) != 0) return errno_status("stat", path, errno);
  return to_file_stat(s);
}

Status PosixIo::rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return errno_status("rename", from + " -> " + to, errno);
  return ok_status();
}

Status PosixIo::unlink(const std::string& path) {
  if (::unlink(path.c_str()) != 0) return errno_status("unlink", path, errno);
  return ok_status();
}

Status PosixIo::mkdir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("mkdir", path, errno);
  return ok_status();
}

Status PosixIo::list_dir(const std::string& path, std::vector<std::string>* names) {
  DirHandle d(::opendir(path.c_str()));
  if (d == nullptr) return errno_status("opendir", path, errno);
  errno = 0;
  while (struct dirent* e = ::readdir(d.get())) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names->emplace_back(e->d_name);
  }
  int err = errno;
  if (err != 0) return errno_status("readdir", path, err);
  return ok_status();
}

Status PosixIo::list_dir_stats(const std::string& path,
                               std::vector<std::pair<std::string, FileStat>>* entries) {
  DirHandle d(::opendir(path.c_str()));
  if (d == nullptr) return errno_status("opendir", path, errno);
  const int dfd = ::dirfd(d.get());
  errno = 0;
  while (struct dirent* e = ::readdir(d.get())) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat s;
    if (::fstatat(dfd, e->d_name, &s, AT_SYMLINK_NOFOLLOW) == 0)
      entries->emplace_back(e->d_name, to_file_stat(s));
    errno = 0;  // a vanished entry is skipped, not a readdir error
  }
  int err = errno;
  if (err != 0) return errno_status("readdir", path, err);
  return ok_status();
}

namespace {

// fsyncs every fd through one io_uring (the kernel runs them concurrently). False when a ring
// cannot be set up (old kernel, seccomp): the caller falls back to plain fsync calls.
bool uring_fsync_all(std::span<const int> fds, std::vector<int>* results) {
  constexpr unsigned kMaxEntries = 64;
  unsigned entries = 1;
  while (entries < fds.size() && entries < kMaxEntries) entries <<= 1;
  struct io_uring ring;
  if (io_uring_queue_init(entries, &ring, 0) < 0) return false;
  struct RingExit {
    struct io_uring* r;
    ~RingExit() { io_uring_queue_exit(r); }
  } ring_exit{&ring};
  results->assign(fds.size(), 0);
  bool ok = true;
  for (size_t base = 0; base < fds.size() && ok; base += entries) {
    const size_t n = std::min<size_t>(entries, fds.size() - base);
    for (size_t i = 0; i < n; ++i) {
      struct io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_fsync(sqe, fds[base + i], 0);
      io_uring_sqe_set_data64(sqe, base + i);
    }
    int sub = io_uring_submit(&ring);
    if (sub < 0 || static_cast<size_t>(sub) != n) {
      ok = false;  // nothing half-known: fall back for the whole set (fsync is idempotent)
      break;
    }
    for (size_t got = 0; got < n; ++got) {
      struct io_uring_cqe* cqe = nullptr;
      int w;
      do w = io_uring_wait_cqe(&ring, &cqe);
      while (w == -EINTR);
      if (w < 0) {
        ok = false;
        break;
      }
      (*results)[io_uring_cqe_get_data64(cqe)] = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
    }
  }
  return ok;
}

}  // namespace

std::vector<Status> PosixIo::fsync_many(std::span<const int> fds) {
  std::vector<int> res;
  if (fds.size() < 2 || !uring_fsync_all(fds, &res)) return FileIo::fsync_many(fds);
  std::vector<Status> out;
  out.reserve(fds.size());
  for (size_t i = 0; i < fds.size(); ++i)
    out.push_back(res[i] < 0 ? errno_status("fsync", fd_name(fds[i]), -res[i]) : ok_status());
  return out;
}

std::vector<Status> PosixIo::fsync_dirs(std::span<const std::string> dirs) {
  if (dirs.size() < 2) return FileIo::fsync_dirs(dirs);
  std::vector<Status> out(dirs.size());
  std::vector<UniqueFd> owned;
  std::vector<int> fds;
  std::vector<size_t> which;
  for (size_t i = 0; i < dirs.size(); ++i) {
    int fd = ::open(dirs[i].c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      out[i] = errno_status("open dir", dirs[i], errno);
      continue;
    }
    owned.emplace_back(nullptr, fd);
    fds.push_back(fd);
    which.push_back(i);
  }
  std::vector<int> res;
  if (!uring_fsync_all(fds, &res)) {
    res.assign(fds.size(), 0);
    for (size_t j = 0; j < fds.size(); ++j) res[j] = ::fsync(fds[j]) == 0 ? 0 : -errno;
  }
  for (size_t j = 0; j < fds.size(); ++j) {
    (void)owned[j].close();
    if (res[j] < 0 && !dir_fsync_unsupported(-res[j]))
      out[which[j]] = errno_status("fsync dir", dirs[which[j]], -res[j]);
  }
  return out;
}

Status PosixIo::fsync_dir(const std::string& dir) {
  UniqueFd fd(nullptr, ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open dir", dir, errno);
  int r = ::fsync(fd.get());
  int err = errno;
  (void)fd.close();
  if (r != 0 && !dir_fsync_unsupported(err)) return errno_status("fsync dir", dir, err);
  return ok_status();
}

Status PosixIo::set_times_fd(int fd, int64_t atime_ns, int64_t mtime_ns) {
  struct timespec t[2] = {to_ts(atime_ns), to_ts(mtime_ns)};
  if (::futimens(fd, t) != 0) return errno_status("futimens", fd_name(fd), errno);
  return ok_status();
}

Status PosixIo::set_times(const std::string& path, int64_t atime_ns, int64_t mtime_ns) {
  struct timespec t[2] = {to_ts(atime_ns), to_ts(mtime_ns)};
  if (::utimensat(AT_FDCWD, path.c_str(), t, 0) != 0) return errno_status("utimensat", path, errno);
  return ok_status();
}

}  // namespace ds41::kvcache
