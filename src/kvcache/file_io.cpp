// ds41 kvcache: FileIo's default batched/listing calls and the whole-file read.
#include "kvcache/file_io.h"

#include <fcntl.h>

#include "kvcache/unique_fd.h"

namespace ds41::kvcache {

Status FileIo::list_dir_stats(const std::string& path,
                              std::vector<std::pair<std::string, FileStat>>* entries) {
  std::vector<std::string> names;
  DS41_RETURN_IF_ERROR(list_dir(path, &names));
  for (auto& n : names) {
    auto st = stat(path + "/" + n);
    if (st.ok()) entries->emplace_back(std::move(n), *st);
  }
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

Result<std::vector<uint8_t>> read_whole_file(FileIo& io, const std::string& path, FileStat* st_out) {
  DS41_ASSIGN_OR_RETURN(UniqueFd fd, open_fd(io, path, O_RDONLY | O_NOATIME, 0));
  DS41_ASSIGN_OR_RETURN(FileStat st, io.fstat(fd.get()));
  if (st_out) *st_out = st;
  std::vector<uint8_t> buf(st.size);
  size_t done = 0;
  while (done < buf.size()) {
    auto r = io.pread(fd.get(), buf.data() + done, buf.size() - done, done);
    if (!r.ok()) return r.status().with_context(path);
    if (*r == 0) break;  // shrank under us: caller's checksum/size check rejects it
    done += *r;
  }
  buf.resize(done);
  return buf;
}

}  // namespace ds41::kvcache
