// ds41 gpu: pread -> pinned staging -> cudaMemcpyAsync, double-buffered, N workers
// (device_weight_upload.h).
#include "gpu/device_weight_upload.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cuda/cuda_status.h"
#include "gpu/device_buffer.h"

namespace ds41::gpu {
namespace {

// Gaps up to this size between wanted ranges are read through rather than seeked over.
constexpr uint64_t kMaxGap = 1ull << 20;

struct Unit {
  int file = 0;
  uint64_t begin = 0, end = 0;  // file byte range read by one worker
  std::vector<int> jobs;        // jobs overlapping [begin, end)
};

std::vector<Unit> make_units(const std::vector<UploadJob>& jobs, uint64_t unit_bytes) {
  std::vector<int> order(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return jobs[a].file != jobs[b].file ? jobs[a].file < jobs[b].file : jobs[a].offset < jobs[b].offset;
  });
  // Spans: runs of jobs of one file with small gaps.
  struct Span {
    int file;
    uint64_t begin, end;
    std::vector<int> jobs;
  };
  std::vector<Span> spans;
  for (int j : order) {
    const UploadJob& u = jobs[j];
    if (u.bytes == 0) continue;
    if (!spans.empty() && spans.back().file == u.file && u.offset <= spans.back().end + kMaxGap) {
      spans.back().end = std::max(spans.back().end, u.offset + u.bytes);
      spans.back().jobs.push_back(j);
    } else {
      spans.push_back({u.file, u.offset, u.offset + u.bytes, {j}});
    }
  }
  std::vector<Unit> units;
  for (const Span& s : spans) {
    for (uint64_t b = s.begin; b < s.end; b += unit_bytes) {
      Unit u{s.file, b, std::min(s.end, b + unit_bytes), {}};
      for (int j : s.jobs)
        if (jobs[j].offset < u.end && jobs[j].offset + jobs[j].bytes > u.begin) u.jobs.push_back(j);
      units.push_back(std::move(u));
    }
  }
  // Largest first: workers finish together.
  std::stable_sort(units.begin(), units.end(),
                   [](const Unit& a, const Unit& b) { return a.end - a.begin > b.end - b.begin; });
  return units;
}

Status pread_full(int fd, uint8_t* dst, uint64_t bytes, uint64_t offset, const std::string& path) {
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, dst + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return io_error(path + ": read of " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(offset) + " failed (" + std::strerror(errno) + ")");
    if (n == 0)
      return io_error(path + ": unexpected end of file at offset " + std::to_string(offset + done) +
                      " (truncated shard?)");
    done += static_cast<uint64_t>(n);
  }
  return ok_status();
}

class Uploader {
 public:
  Uploader(const std::vector<std::string>& paths, const std::vector<UploadJob>& jobs,
           const UploadOptions& opt)
      : paths_(paths),
        jobs_(jobs),
        opt_(opt),
        units_(make_units(jobs, std::max<uint64_t>(opt.unit_bytes, 1))) {
    // CUDA (streams, pinned staging) only when some destination is device memory: reads into host
    // destinations and the read-only baseline run without a device.
    for (const UploadJob& j : jobs_) device_ |= opt_.copy && j.dst && !j.dst_host;
  }

  Status run(UploadStats* stats) {
    uint64_t total = 0;
    for (const UploadJob& j : jobs_) total += j.bytes;
    const int n =
        std::max(1, std::min<int>(opt_.io_threads, std::max<int>(1, static_cast<int>(units_.size()))));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int i = 0; i < n; ++i) workers.emplace_back([this] { worker(); });
    uint64_t last = ~0ull;
    {
      std::unique_lock<std::mutex> lk(mu_);
      while (finished_ < n) {
        cv_.wait_for(lk, std::chrono::milliseconds(100));
        const uint64_t d = done_.load();
        if (opt_.progress && d != last) {
          lk.unlock();
          opt_.progress(d, total);
          lk.lock();
          last = d;
        }
      }
    }
    for (auto& t : workers) t.join();
    if (opt_.progress) opt_.progress(done_.load(), total);
    if (stats) {
      stats->bytes = done_.load();
      stats->read_bytes = read_.load();
      stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      stats->threads = n;
    }
    return error_;
  }

 private:
  void fail(Status s) {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_.ok()) error_ = std::move(s);
    stop_ = true;
  }

  void worker() {
    Status s = work();
    if (!s.ok()) fail(std::move(s));
    std::lock_guard<std::mutex> lk(mu_);
    ++finished_;
    cv_.notify_all();
  }

  Status work() {
    std::map<int, int> fds;
    struct Closer {
      std::map<int, int>& f;
      ~Closer() {
        for (auto& [k, fd] : f) ::close(fd);
      }
    } closer{fds};
    cudaStream_t stream = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    PinnedBuffer buf[2];
    if (device_) {
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaSetDevice(opt_.device), "cudaSetDevice"));
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                             "cudaStreamCreate (loader)"));
      for (auto& e : ev)
        DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                                               "cudaEventCreate (loader)"));
    }
    struct CudaCleanup {
      cudaStream_t& s;
      cudaEvent_t* e;
      ~CudaCleanup() {
        if (s) {
          cudaStreamSynchronize(s);
          cudaStreamDestroy(s);
        }
        for (int i = 0; i < 2; ++i)
          if (e[i]) cudaEventDestroy(e[i]);
      }
    } cleanup{stream, ev};
    std::vector<uint8_t> plain;  // no device destination: ordinary memory
    for (auto& b : buf) {
      if (!device_) break;
      DS41_ASSIGN_OR_RETURN(b, PinnedBuffer::allocate(opt_.stage_bytes, "loader staging buffer"));
    }
    if (!device_) plain.resize(opt_.stage_bytes);
    bool recorded[2] = {false, false};
    int slot = 0;
    while (!stop_) {
      const size_t ui = next_unit_.fetch_add(1);
      if (ui >= units_.size()) break;
      const Unit& u = units_[ui];
      auto it = fds.find(u.file);
      if (it == fds.end()) {
        const int f = ::open(paths_[u.file].c_str(), O_RDONLY | O_CLOEXEC);
        if (f < 0) return io_error(paths_[u.file] + ": cannot open (" + std::strerror(errno) + ")");
        ::posix_fadvise(f, 0, 0, POSIX_FADV_SEQUENTIAL);
        it = fds.emplace(u.file, f).first;
      }
      const int fd = it->second;
      for (uint64_t pos = u.begin; pos < u.end && !stop_; pos += opt_.stage_bytes) {
        const uint64_t len = std::min(opt_.stage_bytes, u.end - pos);
        uint8_t* b = device_ ? static_cast<uint8_t*>(buf[slot].data()) : plain.data();
        if (recorded[slot])
          DS41_RETURN_IF_ERROR(
              cuda::cuda_status(cudaEventSynchronize(ev[slot]), "cudaEventSynchronize (loader)"));
        DS41_RETURN_IF_ERROR(pread_full(fd, b, len, pos, paths_[u.file]));
        read_ += len;
        uint64_t moved = 0;
        for (int j : u.jobs) {
          const UploadJob& job = jobs_[j];
          const uint64_t lo = std::max(pos, job.offset), hi = std::min(pos + len, job.offset + job.bytes);
          if (lo >= hi) continue;
          moved += hi - lo;
          if (!opt_.copy || !job.dst) continue;
          uint8_t* dst = static_cast<uint8_t*>(job.dst) + (lo - job.offset);
          if (job.dst_host) {
            std::memcpy(dst, b + (lo - pos), hi - lo);
          } else {
            DS41_RETURN_IF_ERROR(cuda::cuda_status(
                cudaMemcpyAsync(dst, b + (lo - pos), hi - lo, cudaMemcpyHostToDevice, stream),
                ("cudaMemcpyAsync of " + paths_[u.file] + " at offset " + std::to_string(lo)).c_str()));
          }
        }
        if (device_) {
          DS41_RETURN_IF_ERROR(
              cuda::cuda_status(cudaEventRecord(ev[slot], stream), "cudaEventRecord (loader)"));
          recorded[slot] = true;
          slot ^= 1;
        }
        done_ += moved;
      }
    }
    if (stream) DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(stream), "loader stream"));
    return ok_status();
  }

  const std::vector<std::string>& paths_;
  const std::vector<UploadJob>& jobs_;
  const UploadOptions& opt_;
  std::vector<Unit> units_;
  bool device_ = false;  // some job copies to device memory
  std::atomic<size_t> next_unit_{0};
  std::atomic<uint64_t> done_{0}, read_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards error_, finished_
  std::condition_variable cv_;
  Status error_ = ok_status();
  int finished_ = 0;
};

}  // namespace

Status upload_file_ranges(const std::vector<std::string>& paths, const std::vector<UploadJob>& jobs,
                          const UploadOptions& opt, UploadStats* stats) {
  for (const UploadJob& j : jobs)
    if (j.file < 0 || j.file >= static_cast<int>(paths.size()))
      return invalid_argument("upload_file_ranges: job names file " + std::to_string(j.file) + " of " +
                              std::to_string(paths.size()));
  if (opt.stage_bytes == 0) return invalid_argument("upload_file_ranges: stage_bytes is 0");
  Uploader u(paths, jobs, opt);
  return u.run(stats);
}

}  // namespace ds41::gpu
