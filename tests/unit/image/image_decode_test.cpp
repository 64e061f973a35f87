// ds41_image decoding against what the reference's loading produces with Pillow (exif_transpose,
// convert_to_rgb over white): every fixture decodes to the same RGB bytes. Corrupt inputs and
// limits give errors with a message.
#include "image/image_decode.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "image/bicubic_resize.h"

namespace ds41::image {
namespace {

namespace fs = std::filesystem;

std::string src_dir() { return std::string(DS41_SOURCE_DIR); }
std::string corpus(const std::string& name) { return src_dir() + "/tests/fuzz/corpus/image/" + name; }
std::string fixture(const std::string& name) { return src_dir() + "/tests/unit/image/fixtures/" + name; }

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// "W H\n" + RGB bytes.
RgbImage read_rgb(const std::string& path) {
  std::vector<uint8_t> b = read_bytes(path);
  RgbImage im;
  auto nl = std::find(b.begin(), b.end(), '\n');
  std::istringstream hdr(std::string(b.begin(), nl));
  hdr >> im.width >> im.height;
  im.rgb.assign(nl + 1, b.end());
  EXPECT_EQ(static_cast<int64_t>(im.rgb.size()), im.width * im.height * 3) << path;
  return im;
}

void expect_same(const RgbImage& want, const RgbImage& got, const std::string& what) {
  ASSERT_EQ(want.width, got.width) << what;
  ASSERT_EQ(want.height, got.height) << what;
  int64_t differ = 0, max_d = 0;
  for (size_t i = 0; i < want.rgb.size(); ++i) {
    const int64_t d = std::abs(int64_t(want.rgb[i]) - int64_t(got.rgb[i]));
    differ += d != 0;
    max_d = std::max(max_d, d);
  }
  EXPECT_EQ(differ, 0) << what << ": max difference " << max_d << " levels";
}

TEST(ImageDecode, EveryFixtureMatchesPillowLoading) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(src_dir() + "/tests/fuzz/corpus/image")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("bad_", 0) == 0) continue;
    const std::string stem = e.path().stem().string();
    SCOPED_TRACE(name);
    auto d = decode_image(read_bytes(e.path().string()));
    ASSERT_TRUE(d.ok()) << d.status().message();
    expect_same(read_rgb(fixture(stem + ".rgb")), d->rgb, name);
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST(ImageDecode, FormatsAndOrientationAreReported) {
  auto j = decode_image(read_bytes(corpus("jpeg_exif_orient6.jpg")));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->format, ImageFormat::kJpeg);
  EXPECT_EQ(j->exif_orientation, 6);
  EXPECT_EQ(j->rgb.width, 23);  // 37x23 rotated
  auto p = decode_image(read_bytes(corpus("png_rgba.png")));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->had_alpha);
  EXPECT_EQ(sniff_image_format(read_bytes(corpus("webp_lossy.webp"))), ImageFormat::kWebp);
  EXPECT_EQ(sniff_image_format(read_bytes(corpus("gif_palette.gif"))), ImageFormat::kGif);
}

TEST(ImageDecode, CorruptAndOversizedInputsAreErrorsWithMessages) {
  for (const char* name : {"bad_png_truncated.png", "bad_png_crc.png", "bad_png_huge.png",
                           "bad_jpeg_truncated.jpg", "bad_empty.bin", "bad_text.bin"}) {
    auto d = decode_image(read_bytes(corpus(name)));
    EXPECT_FALSE(d.ok()) << name;
    EXPECT_FALSE(d.status().message().empty()) << name;
  }
  auto huge = decode_image(read_bytes(corpus("bad_png_huge.png")));
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().message();
  ImageLimits tiny;
  tiny.max_pixels = 100;
  auto small = decode_image(read_bytes(corpus("jpeg_rgb.jpg")), tiny);
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(small.status().message().find("over the limit of 100 pixels"), std::string::npos);
  tiny = ImageLimits{};
  tiny.max_bytes = 10;
  auto big = decode_image(read_bytes(corpus("jpeg_rgb.jpg")), tiny);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  auto missing = decode_image_file("/nonexistent/x.png");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(BicubicResize, MatchesPillowBitForBitDownAndUp) {
  const RgbImage src = read_rgb(fixture("resize_src.rgb"));
  int n = 0;
  for (const auto& e : fs::directory_iterator(src_dir() + "/tests/unit/image/fixtures")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("resize_57_41_to_", 0) != 0) continue;
    const RgbImage want = read_rgb(e.path().string());
    expect_same(want, resize_bicubic_u8(src, want.width, want.height), name);
    ++n;
  }
  EXPECT_EQ(n, 7);
}

}  // namespace
}  // namespace ds41::image
