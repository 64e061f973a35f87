// ds41 kvcache: atomic publish of a file over FileIo — temp file, write, fsync, rename, fsync of
// the directory — in two stages so that a batch of files can be staged first and made durable
// together (DiskTier::put_batch, docs/formats/kv_block.md "Group commit").
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"
#include "kvcache/file_io.h"
#include "kvcache/unique_fd.h"

namespace ds41::kvcache {

// Writes all of `data` at `offset`, retrying short writes; an error or a zero-byte write fails.
Status write_fully(FileIo& io, int fd, std::span<const uint8_t> data, uint64_t offset,
                   const std::string& path);

// stage_temp_file creates `tmp_path` exclusively, writes the parts back to back, stamps
// atime/mtime (unless kTimeOmit) and, when `sync`, starts writeback; it leaves the temp file open
// in `p->fd`. commit_temp_file fsyncs it (when `sync`), closes it and renames it onto
// `final_path`. abort_temp_file closes and removes an uncommitted temp file. On any failure of
// either stage the temp file is removed and `final_path` is untouched, so a reader sees either no
// file or the complete file. The rename is durable only once the final directory is fsynced: the
// caller does that (once per directory for a batch) and must not acknowledge the block before it.
struct PendingPublish {
  std::string tmp_path;
  std::string final_path;
  UniqueFd fd;  // the open temp file between the stages, else empty
};
Status stage_temp_file(FileIo& io, PendingPublish* p, std::span<const std::span<const uint8_t>> parts,
                       int64_t time_ns, bool sync);
Status commit_temp_file(FileIo& io, PendingPublish* p, bool sync);
void abort_temp_file(FileIo& io, PendingPublish* p);

// Both stages for one file, then (when `sync` and `sync_dir`) the fsync of the final directory.
Status publish_file_atomic(FileIo& io, const std::string& tmp_path, const std::string& final_path,
                           std::span<const std::span<const uint8_t>> parts, int64_t time_ns, bool sync,
                           bool sync_dir = true);

}  // namespace ds41::kvcache
