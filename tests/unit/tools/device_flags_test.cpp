// tools/device_flags: --device / --load-format parsing and the default device (issue 10). Built
// without DS41_HAVE_CUDA_ENGINE here, so the binary's own facts say "no CUDA"; the pure
// resolve_device(flag, built_with_cuda, gpus) covers the CUDA cases.
#include "device_flags.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

namespace ds41::cli {
namespace {

TEST(DeviceFlags, DefaultIsCudaOnlyWithCudaAndAGpu) {
  EXPECT_EQ(*resolve_device("", true, 1), DeviceKind::kCuda);
  EXPECT_EQ(*resolve_device("", true, 0), DeviceKind::kCpu);
  EXPECT_EQ(*resolve_device("", false, 0), DeviceKind::kCpu);
  EXPECT_EQ(*resolve_device("", false, 2), DeviceKind::kCpu);
}

TEST(DeviceFlags, ExplicitDevices) {
  EXPECT_EQ(*resolve_device("cpu", true, 1), DeviceKind::kCpu);
  EXPECT_EQ(*resolve_device("cuda", true, 1), DeviceKind::kCuda);
  auto no_build = resolve_device("cuda", false, 1);
  ASSERT_FALSE(no_build.ok());
  EXPECT_NE(no_build.status().message().find("built without CUDA"), std::string::npos);
  auto no_gpu = resolve_device("cuda", true, 0);
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_NE(no_gpu.status().message().find("no CUDA device"), std::string::npos);
  auto bad = resolve_device("tpu", true, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
}

TEST(DeviceFlags, LoadFormats) {
  EXPECT_EQ(*parse_load_format("auto"), LoadFormatFlag::kAuto);
  EXPECT_EQ(*parse_load_format("safetensors"), LoadFormatFlag::kSafetensors);
  EXPECT_EQ(*parse_load_format("dummy"), LoadFormatFlag::kDummy);
  auto bad = parse_load_format("gguf");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto, safetensors or dummy"), std::string::npos);
}

TEST(DeviceFlags, ParsedFromTheCommandLine) {
  CLI::App app;
  DeviceFlags f;
  add_device_flags(&app, &f);
  app.parse("--device cuda --load-format dummy --seed 42 --engram-host-pinned",
            /*program_name_included=*/false);
  EXPECT_EQ(f.device, "cuda");
  EXPECT_EQ(f.load_format, "dummy");
  EXPECT_EQ(f.seed, 42u);
  EXPECT_TRUE(f.engram_host_pinned);
  if (!built_with_cuda()) {
    auto k = resolve_device(f);
    ASSERT_FALSE(k.ok());
    EXPECT_NE(k.status().message().find("built without CUDA"), std::string::npos);
  }
}

TEST(DeviceFlags, NoSeedFlagWhenTheCommandHasItsOwn) {
  CLI::App app;
  DeviceFlags f;
  add_device_flags(&app, &f, true, /*seed_flag=*/false);
  EXPECT_THROW(app.parse("--seed 3", false), CLI::ParseError);
}

}  // namespace
}  // namespace ds41::cli
