// ds41 kvcache: PosixIo, FaultInjectingIo and the atomic publish / whole-file read helpers.
#include "kvcache/io_layer.h"

#include <dirent.h>
#include <liburing.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ds41 {
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

// ---------------------------------------------------------------- PosixIo

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
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return errno_status("opendir", path, errno);
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names->emplace_back(e->d_name);
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return errno_status("readdir", path, err);
  return ok_status();
}

Status FileIo::list_dir_stats(const std::string& path, std::vector<std::pair<std::string, FileStat>>* entries) {
  std::vector<std::string> names;
  DS41_RETURN_IF_ERROR(list_dir(path, &names));
  for (auto& n : names) {
    auto st = stat(path + "/" + n);
    if (st.ok()) entries->emplace_back(std::move(n), *st);
  }
  return ok_status();
}

Status PosixIo::list_dir_stats(const std::string& path, std::vector<std::pair<std::string, FileStat>>* entries) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return errno_status("opendir", path, errno);
  const int dfd = ::dirfd(d);
  errno = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat s;
    if (::fstatat(dfd, e->d_name, &s, AT_SYMLINK_NOFOLLOW) == 0) entries->emplace_back(e->d_name, to_file_stat(s));
    errno = 0;  // a vanished entry is skipped, not a readdir error
  }
  int err = errno;
  ::closedir(d);
  if (err != 0) return errno_status("readdir", path, err);
  return ok_status();
}

std::vector<Status> FileIo::fsync_many(std::span<const int> fds) {
  std::vector<Status> out;
  out.reserve(fds.size());
  for (int fd : fds) out.push_back(fsync(fd));
  return out;
}

std::vector<Status> FileIo::fsync_dirs(std::span<const std::string> dirs) {
  std::vector<Status> out;
  out.reserve(dirs.size());
  for (const auto& d : dirs) out.push_back(fsync_dir(d));
  return out;
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
  io_uring_queue_exit(&ring);
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
  std::vector<int> fds;
  std::vector<size_t> which;
  for (size_t i = 0; i < dirs.size(); ++i) {
    int fd = ::open(dirs[i].c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
      out[i] = errno_status("open dir", dirs[i], errno);
      continue;
    }
    fds.push_back(fd);
    which.push_back(i);
  }
  std::vector<int> res;
  if (!uring_fsync_all(fds, &res)) {
    res.assign(fds.size(), 0);
    for (size_t j = 0; j < fds.size(); ++j) res[j] = ::fsync(fds[j]) == 0 ? 0 : -errno;
  }
  for (size_t j = 0; j < fds.size(); ++j) {
    ::close(fds[j]);
    if (res[j] < 0 && !dir_fsync_unsupported(-res[j])) out[which[j]] = errno_status("fsync dir", dirs[which[j]], -res[j]);
  }
  return out;
}

Status PosixIo::fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status("open dir", dir, errno);
  int r = ::fsync(fd);
  int err = errno;
  ::close(fd);
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

// ---------------------------------------------------------------- FaultInjectingIo

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

// ---------------------------------------------------------------- helpers

Status FaultInjectingIo::fsync_dir(const std::string& dir) {
  FaultKind k;
  if (take(Op::kDirFsync, &k)) return io_error("fsync dir " + dir + ": injected EIO");
  return base_.fsync_dir(dir);
}

Status write_fully(FileIo& io, int fd, std::span<const uint8_t> data, uint64_t offset,
                   const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    auto r = io.pwrite(fd, data.data() + done, data.size() - done, offset + done);
    if (!r.ok()) return r.status().with_context(path);
    if (*r == 0) return io_error(path + ": write made no progress");
    done += *r;
  }
  return ok_status();
}

Status stage_temp_file(FileIo& io, PendingPublish* p, std::span<const std::span<const uint8_t>> parts,
                       int64_t time_ns, bool sync) {
  DS41_ASSIGN_OR_RETURN(p->fd, io.open(p->tmp_path, O_WRONLY | O_CREAT | O_EXCL, 0644));
  auto fail = [&](Status s) {
    abort_temp_file(io, p);
    return s;
  };
  uint64_t off = 0;
  for (auto part : parts) {
    Status s = write_fully(io, p->fd, part, off, p->tmp_path);
    if (!s.ok()) return fail(s);
    off += part.size();
  }
  if (time_ns != kTimeOmit) {
    Status s = io.set_times_fd(p->fd, time_ns, time_ns);
    if (!s.ok()) return fail(s);
  }
  if (sync) {
    // A failure here is not fatal by itself (the fsync decides), but it is unexpected: report it.
    Status s = io.start_writeback(p->fd);
    if (!s.ok()) return fail(s.with_context(p->tmp_path));
  }
  return ok_status();
}

void abort_temp_file(FileIo& io, PendingPublish* p) {
  if (p->fd >= 0) (void)io.close(p->fd);
  p->fd = -1;
  (void)io.unlink(p->tmp_path);
}

Status commit_temp_file(FileIo& io, PendingPublish* p, bool sync) {
  if (sync) {
    Status s = io.fsync(p->fd);
    if (!s.ok()) {
      abort_temp_file(io, p);
      return s.with_context(p->tmp_path);
    }
  }
  Status c = io.close(p->fd);
  p->fd = -1;
  if (!c.ok()) {
    (void)io.unlink(p->tmp_path);
    return c.with_context(p->tmp_path);
  }
  Status r = io.rename(p->tmp_path, p->final_path);
  if (!r.ok()) {
    (void)io.unlink(p->tmp_path);
    return r;
  }
  return ok_status();
}

Status publish_file_atomic(FileIo& io, const std::string& tmp_path, const std::string& final_path,
                           std::span<const std::span<const uint8_t>> parts, int64_t time_ns, bool sync,
                           bool sync_dir) {
  PendingPublish p{tmp_path, final_path};
  DS41_RETURN_IF_ERROR(stage_temp_file(io, &p, parts, time_ns, sync));
  DS41_RETURN_IF_ERROR(commit_temp_file(io, &p, sync));
  if (sync && sync_dir) {
    std::string dir = final_path.substr(0, final_path.find_last_of('/'));
    DS41_RETURN_IF_ERROR(io.fsync_dir(dir.empty() ? "/" : dir));
  }
  return ok_status();
}

Result<std::vector<uint8_t>> read_whole_file(FileIo& io, const std::string& path, FileStat* st_out) {
  DS41_ASSIGN_OR_RETURN(int fd, io.open(path, O_RDONLY | O_NOATIME, 0));
  auto st = io.fstat(fd);
  if (!st.ok()) {
    (void)io.close(fd);
    return st.status();
  }
  if (st_out) *st_out = *st;
  std::vector<uint8_t> buf(st->size);
  size_t done = 0;
  while (done < buf.size()) {
    auto r = io.pread(fd, buf.data() + done, buf.size() - done, done);
    if (!r.ok()) {
      (void)io.close(fd);
      return r.status().with_context(path);
    }
    if (*r == 0) break;  // shrank under us: caller's checksum/size check rejects it
    done += *r;
  }
  buf.resize(done);
  (void)io.close(fd);
  return buf;
}

}  // namespace ds41
