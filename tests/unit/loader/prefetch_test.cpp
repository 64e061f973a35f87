// Tests for model/loader/prefetch.h: prefetch_mapped() leaves the mapping's bytes as in the file,
// works for unaligned sub-ranges and for more threads than pages, and reports bad input and
// ranges beyond the end of the file as errors instead of crashing.
#include "model/loader/prefetch.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace ds41::model {
namespace {

class MappedFile {
 public:
  explicit MappedFile(const std::vector<uint8_t>& bytes, size_t map_len = 0) {
    path_ = (std::filesystem::temp_directory_path() /
             ("ds41_prefetch_test_" + std::to_string(getpid()) + "_" + std::to_string(counter_++)))
                .string();
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    len_ = map_len ? map_len : bytes.size();
    void* m = mmap(nullptr, len_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    EXPECT_NE(m, MAP_FAILED);
    data_ = static_cast<const uint8_t*>(m);
  }
  ~MappedFile() {
    munmap(const_cast<uint8_t*>(data_), len_);
    std::filesystem::remove(path_);
  }
  const uint8_t* data() const { return data_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t len_ = 0;
};

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = 0x243f6a8885a308d3ull;
  for (auto& b : v) b = static_cast<uint8_t>((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 56);
  return v;
}

TEST(Prefetch, BytesUnchangedForManyThreadCounts) {
  // 3 MB + 123 bytes: not a multiple of the page size or of the thread count.
  const auto bytes = pattern((3u << 20) + 123);
  MappedFile f(bytes);
  for (int threads : {1, 2, 3, 7, 16}) {
    PrefetchStats st;
    ThreadPool pool(threads);
    ASSERT_TRUE(prefetch_mapped(f.data(), bytes.size(), pool, &st).ok()) << threads;
    EXPECT_EQ(st.threads_used, threads);
    EXPECT_EQ(st.bytes, bytes.size());
    ASSERT_EQ(std::memcmp(f.data(), bytes.data(), bytes.size()), 0) << threads;
  }
}

TEST(Prefetch, UnalignedSubrangeAndMoreThreadsThanPages) {
  const auto bytes = pattern(5 * 4096 + 17);
  MappedFile f(bytes);
  PrefetchStats st;
  ThreadPool pool(64);
  ASSERT_TRUE(prefetch_mapped(f.data() + 4001, 9000, pool, &st).ok());
  // 9000 bytes from offset 4001 span pages 0..3: at most 4 threads are used.
  EXPECT_LE(st.threads_used, 4);
  EXPECT_GE(st.threads_used, 1);
  EXPECT_EQ(std::memcmp(f.data(), bytes.data(), bytes.size()), 0);
  ASSERT_TRUE(prefetch_mapped(f.data(), 0, pool).ok());  // empty range
}

TEST(Prefetch, BadArgumentsAreErrors) {
  const auto bytes = pattern(8192);
  MappedFile f(bytes);
  ThreadPool pool(2);
  Status s = prefetch_mapped(nullptr, 100, pool);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("null"), std::string::npos) << s.message();
}

TEST(Prefetch, RangeBeyondEndOfFileIsAnErrorNotACrash) {
  // Map 8 pages of a 2-page file: pages 2..7 have no file data behind them (touching them would SIGBUS).
  const auto bytes = pattern(2 * 4096);
  MappedFile f(bytes, 8 * 4096);
  PrefetchStats probe;
  ThreadPool pool(4);
  ASSERT_TRUE(prefetch_mapped(f.data(), bytes.size(), pool, &probe).ok());
  if (!probe.used_populate_read) GTEST_SKIP() << "kernel without MADV_POPULATE_READ: beyond-EOF would SIGBUS";
  Status s = prefetch_mapped(f.data(), 8 * 4096, pool);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("prefetch_mapped"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("failed at byte"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ds41::model
