// ds41 kvcache: UniqueFd, the owner of one open file descriptor. Every descriptor kvcache holds
// beyond a single call lives in one, so no error path can leak it and none is closed twice.
#pragma once

#include <utility>

#include "core/status.h"
#include "kvcache/file_io.h"

namespace ds41::kvcache {

// Closes its descriptor exactly once: through the FileIo that opened it (decorators see the
// close), or with close(2) when `io` is null (descriptors PosixIo opens for its own use).
class UniqueFd {
 public:
  UniqueFd() = default;
  UniqueFd(FileIo* io, int fd) : io_(io), fd_(fd) {}
  ~UniqueFd() { (void)close(); }
  UniqueFd(UniqueFd&& o) noexcept : io_(o.io_), fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      (void)close();
      io_ = o.io_;
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  // Closes now (the descriptor is released even when this reports an error); ok when empty.
  Status close();

 private:
  FileIo* io_ = nullptr;
  int fd_ = -1;
};

// io.open() with the result owned by a UniqueFd that closes through `io`.
inline Result<UniqueFd> open_fd(FileIo& io, const std::string& path, int flags, int mode = 0644) {
  DS41_ASSIGN_OR_RETURN(int fd, io.open(path, flags, mode));
  return UniqueFd(&io, fd);
}

}  // namespace ds41::kvcache
