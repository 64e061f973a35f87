// ds41 kvcache: the two-stage atomic publish (docs/formats/kv_block.md "Group commit").
#include "kvcache/atomic_publish.h"

#include <fcntl.h>

namespace ds41::kvcache {

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
  DS41_ASSIGN_OR_RETURN(p->fd, open_fd(io, p->tmp_path, O_WRONLY | O_CREAT | O_EXCL, 0644));
  auto fail = [&](Status s) {
    abort_temp_file(io, p);
    return s;
  };
  uint64_t off = 0;
  for (auto part : parts) {
    Status s = write_fully(io, p->fd.get(), part, off, p->tmp_path);
    if (!s.ok()) return fail(s);
    off += part.size();
  }
  if (time_ns != kTimeOmit) {
    Status s = io.set_times_fd(p->fd.get(), time_ns, time_ns);
    if (!s.ok()) return fail(s);
  }
  if (sync) {
    // A failure here is not fatal by itself (the fsync decides), but it is unexpected: report it.
    Status s = io.start_writeback(p->fd.get());
    if (!s.ok()) return fail(s.with_context(p->tmp_path));
  }
  return ok_status();
}

void abort_temp_file(FileIo& io, PendingPublish* p) {
  (void)p->fd.close();
  (void)io.unlink(p->tmp_path);
}

Status commit_temp_file(FileIo& io, PendingPublish* p, bool sync) {
  if (sync) {
    Status s = io.fsync(p->fd.get());
    if (!s.ok()) {
      abort_temp_file(io, p);
      return s.with_context(p->tmp_path);
    }
  }
  Status c = p->fd.close();
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
  PendingPublish p{tmp_path, final_path, {}};
  DS41_RETURN_IF_ERROR(stage_temp_file(io, &p, parts, time_ns, sync));
  DS41_RETURN_IF_ERROR(commit_temp_file(io, &p, sync));
  if (sync && sync_dir) {
    std::string dir = final_path.substr(0, final_path.find_last_of('/'));
    DS41_RETURN_IF_ERROR(io.fsync_dir(dir.empty() ? "/" : dir));
  }
  return ok_status();
}

}  // namespace ds41::kvcache
