// gpu::upload_file_ranges (issue 10 loading): the span merging, work-unit cutting and per-chunk
// overlap arithmetic, checked with host destinations (which need no device, so these run
// everywhere): every job's bytes equal the file's, for ranges that straddle staging chunks and
// work units, adjacent and overlapping ranges, several files and threads; progress is monotonic
// and ends at the total; a range past the end of a file is an io_error naming the file.
#include "gpu/device_weight_upload.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

namespace ds41::gpu {
namespace {

std::string write_file(const std::string& name, size_t bytes, uint32_t seed, std::vector<uint8_t>* content) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ds41_upload_" + std::to_string(::getpid()) + "_" + name))
          .string();
  std::mt19937 g(seed);
  content->resize(bytes);
  for (auto& b : *content) b = static_cast<uint8_t>(g());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(content->data()), bytes);
  return path;
}

TEST(DeviceWeightUpload, HostDestinationsReceiveExactlyTheirRanges) {
  std::vector<uint8_t> a, b;
  const std::vector<std::string> paths = {write_file("a", 5'000'000, 1, &a),
                                          write_file("b", 3'000'001, 2, &b)};
  const std::vector<const std::vector<uint8_t>*> content = {&a, &b};
  std::mt19937_64 g(7);
  struct Want {
    int file;
    uint64_t off, len;
  };
  std::vector<Want> want = {
      {0, 0, 1},         {0, 1, 4096},         {0, 4097, 70'000}, {1, 3'000'000, 1},
      {1, 0, 3'000'001}, {0, 4'999'000, 1000}, {0, 100, 200}};  // adjacent, overlapping, whole file, last
                                                                // byte
  for (int i = 0; i < 200; ++i) {
    const int f = static_cast<int>(g() % 2);
    const uint64_t size = content[f]->size();
    const uint64_t off = g() % size, len = 1 + g() % std::min<uint64_t>(size - off, 300'000);
    want.push_back({f, off, len});
  }
  std::vector<std::vector<uint8_t>> dst(want.size());
  std::vector<UploadJob> jobs;
  uint64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    dst[i].assign(want[i].len, 0xee);
    jobs.push_back({want[i].file, want[i].off, want[i].len, dst[i].data(), true});
    total += want[i].len;
  }
  for (int threads : {1, 3}) {
    for (auto& d : dst) std::fill(d.begin(), d.end(), 0xee);
    UploadOptions o;
    o.io_threads = threads;
    o.stage_bytes = 65'536;    // many chunks per job
    o.unit_bytes = 1'000'003;  // units cut inside jobs
    uint64_t last = 0;
    o.progress = [&](uint64_t d, uint64_t t) {
      EXPECT_GE(d, last);
      EXPECT_EQ(t, total);
      last = d;
    };
    UploadStats st;
    Status s = upload_file_ranges(paths, jobs, o, &st);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(last, total);
    EXPECT_EQ(st.bytes, total);
    for (size_t i = 0; i < want.size(); ++i) {
      const uint8_t* src = content[want[i].file]->data() + want[i].off;
      ASSERT_EQ(std::memcmp(dst[i].data(), src, want[i].len), 0)
          << "job " << i << " file " << want[i].file << " [" << want[i].off << ", +" << want[i].len << ")";
    }
  }
  // Read only (the raw-disk baseline): nothing written, every byte read once.
  UploadOptions ro;
  ro.copy = false;
  ro.io_threads = 2;
  std::vector<UploadJob> whole = {{0, 0, a.size(), nullptr, false}, {1, 0, b.size(), nullptr, false}};
  UploadStats st;
  ASSERT_TRUE(upload_file_ranges(paths, whole, ro, &st).ok());
  EXPECT_EQ(st.read_bytes, a.size() + b.size());
  for (const auto& p : paths) std::filesystem::remove(p);
}

TEST(DeviceWeightUpload, RangePastTheEndIsAnIoErrorNamingTheFile) {
  std::vector<uint8_t> a;
  const std::vector<std::string> paths = {write_file("short", 10'000, 3, &a)};
  std::vector<uint8_t> dst(20'000);
  UploadOptions o;
  Status s = upload_file_ranges(paths, {{0, 5'000, 10'000, dst.data(), true}}, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find(paths[0]), std::string::npos) << s.message();
  Status bad = upload_file_ranges(paths, {{1, 0, 1, dst.data(), true}}, o);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  Status missing = upload_file_ranges({paths[0] + ".missing"}, {{0, 0, 1, dst.data(), true}}, o);
  EXPECT_EQ(missing.code(), StatusCode::kIoError);
  std::filesystem::remove(paths[0]);
}

}  // namespace
}  // namespace ds41::gpu
