// ds41 kvcache: UniqueFd::close.
#include "kvcache/unique_fd.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ds41::kvcache {

Status UniqueFd::close() {
  if (fd_ < 0) return ok_status();
  const int fd = std::exchange(fd_, -1);
  if (io_ != nullptr) return io_->close(fd);
  // Linux releases the descriptor even when close reports an error: never retry.
  if (::close(fd) != 0 && errno != EINTR)
    return io_error("close fd " + std::to_string(fd) + ": " + std::strerror(errno));
  return ok_status();
}

}  // namespace ds41::kvcache
