// ds41 model/loader: a rank's slices by pread (shard_reader.h).
#include "model/loader/shard_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ds41::model {
namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status pread_exact(int fd, uint8_t* dst, uint64_t n, uint64_t off, const std::string& what) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error(what + ": " + std::strerror(errno));
    if (r == 0) return io_error(what + ": the file ends before the tensor does");
    done += static_cast<uint64_t>(r);
  }
  return ok_status();
}

}  // namespace

Status read_tensor_slice(const Checkpoint& ck, const TensorContract& contract, const TensorSlice& s,
                         std::vector<uint8_t>* out, SliceReadStats* stats) {
  if (s.tensor < 0 || static_cast<size_t>(s.tensor) >= contract.tensors.size())
    return invalid_argument("slice names tensor index " + std::to_string(s.tensor) + " outside the contract");
  const ExpectedTensor& t = contract.tensors[static_cast<size_t>(s.tensor)];
  const TensorRef* ref = ck.find(t.name);
  if (ref == nullptr) return not_found("tensor " + t.name + " is not in the checkpoint at " + ck.dir());
  const TensorInfo& info = *ref->info;
  const std::string& path = ref->file->path();
  const std::string what = "reading " + t.name + " from " + path;
  const uint64_t base = ref->file->data_section_offset() + info.begin;
  const int64_t rows = info.shape.empty() ? 1 : info.shape[0];
  const uint64_t row_bytes = rows > 0 ? info.nbytes() / static_cast<uint64_t>(rows) : 0;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return io_error(what + ": " + std::strerror(errno));
  SliceReadStats local;
  switch (s.axis) {
    case TensorSlice::Axis::kWhole:
      out->resize(info.nbytes());
      DS41_RETURN_IF_ERROR(pread_exact(fd.get(), out->data(), info.nbytes(), base, what));
      local.bytes_read += info.nbytes();
      local.reads += 1;
      break;
    case TensorSlice::Axis::kRows: {
      if (s.begin < 0 || s.end > rows || s.begin > s.end)
        return out_of_range(what + ": rows [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                            ") outside its " + std::to_string(rows) + " rows");
      const uint64_t n = row_bytes * static_cast<uint64_t>(s.end - s.begin);
      out->resize(n);
      DS41_RETURN_IF_ERROR(pread_exact(fd.get(), out->data(), n, base + row_bytes * static_cast<uint64_t>(s.begin), what));
      local.bytes_read += n;
      local.reads += 1;
      break;
    }
    case TensorSlice::Axis::kCols: {
      if (info.shape.size() != 2) return invalid_argument(what + ": a column slice needs a 2-D tensor");
      const int64_t cols = info.shape[1];
      if (s.begin < 0 || s.end > cols || s.begin > s.end)
        return out_of_range(what + ": columns [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                            ") outside its " + std::to_string(cols) + " columns");
      const uint64_t elem = cols > 0 ? row_bytes / static_cast<uint64_t>(cols) : 0;
      if (elem == 0 || elem * static_cast<uint64_t>(cols) != row_bytes)
        return invalid_argument(what + ": columns of a packed dtype cannot be sliced");
      const uint64_t seg = elem * static_cast<uint64_t>(s.end - s.begin);
      out->resize(seg * static_cast<uint64_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const uint64_t off = base + row_bytes * static_cast<uint64_t>(r) + elem * static_cast<uint64_t>(s.begin);
        DS41_RETURN_IF_ERROR(pread_exact(fd.get(), out->data() + seg * static_cast<uint64_t>(r), seg, off, what));
      }
      local.bytes_read += seg * static_cast<uint64_t>(rows);
      local.reads += static_cast<uint64_t>(rows);
      break;
    }
  }
  if (stats) {
    stats->bytes_read += local.bytes_read;
    stats->reads += local.reads;
  }
  return ok_status();
}

}  // namespace ds41::model
