// ds41 server: image content parts -> RequestImages (see image_inputs.h).
#include "server/image_inputs.h"

#include <httplib.h>
#include <xxhash.h>

#include <cstdio>

#include "image/image_decode.h"
#include "image/preprocess.h"

namespace ds41::server {
namespace {

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // standard and URL-safe alphabets
  if (c == '/' || c == '_') return 63;
  return -1;
}

// http:// only (no TLS in the server build); bounded by the byte limit and a timeout.
Result<std::vector<uint8_t>> fetch_http(const std::string& url, const ImageInputOptions& opt) {
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  const std::string host = rest.substr(0, slash),
                    path = slash == std::string::npos ? "/" : rest.substr(slash);
  httplib::Client cli("http://" + host);
  cli.set_connection_timeout(opt.fetch_timeout_s, 0);
  cli.set_read_timeout(opt.fetch_timeout_s, 0);
  std::vector<uint8_t> body;
  bool too_big = false;
  auto res = cli.Get(path, [&](const char* data, size_t n) {
    if (static_cast<int64_t>(body.size() + n) > opt.limits.max_bytes) {
      too_big = true;
      return false;
    }
    body.insert(body.end(), data, data + n);
    return true;
  });
  if (too_big)
    return resource_exhausted("the image at " + url + " is over the limit of " +
                              std::to_string(opt.limits.max_bytes) + " bytes");
  if (!res) return unavailable("cannot fetch " + url + ": " + httplib::to_string(res.error()));
  if (res->status != 200)
    return invalid_argument("fetching " + url + " answered HTTP " + std::to_string(res->status));
  return body;
}

}  // namespace

Result<std::vector<uint8_t>> decode_data_url(const std::string& url) {
  if (url.rfind("data:", 0) != 0) return invalid_argument("not a data: URL");
  const size_t comma = url.find(',');
  if (comma == std::string::npos) return invalid_argument("data: URL without a ',' before its payload");
  const std::string meta = url.substr(5, comma - 5);
  if (meta.size() < 7 || meta.compare(meta.size() - 7, 7, ";base64") != 0)
    return invalid_argument("data: URL is not base64 (expected data:image/...;base64,...)");
  std::vector<uint8_t> out;
  out.reserve((url.size() - comma) * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = comma + 1; i < url.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(url[i]);
    if (c == '=') break;
    if (c == '\n' || c == '\r' || c == ' ') continue;
    const int v = base64_value(c);
    if (v < 0)
      return invalid_argument("data: URL payload is not valid base64 (character " + std::to_string(i) + ")");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>((acc >> bits) & 0xff));
    }
  }
  if (out.empty()) return invalid_argument("data: URL has an empty payload");
  return out;
}

engine::ImageContentHash image_content_hash(const std::vector<uint8_t>& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return engine::ImageContentHash{h.high64, h.low64};
}

std::string vision_cache_key(const std::vector<uint8_t>& bytes, const std::string& config_key) {
  const engine::ImageContentHash h = image_content_hash(bytes);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                static_cast<unsigned long long>(h.lo));
  return std::string(buf) + "/" + config_key;
}

ApiResult<std::vector<engine::RequestImage>> resolve_request_images(const std::vector<std::string>& sources,
                                                                    const VisionModelInfo& vm,
                                                                    const ImageInputOptions& opt,
                                                                    std::vector<int32_t>* ids,
                                                                    int64_t* image_tokens) {
  *image_tokens = 0;
  std::vector<engine::RequestImage> out;
  if (sources.empty()) return out;
  if (!vm.enabled)
    return bad_request("this model has no vision tower: image content parts are not supported", "messages",
                       "vision_not_supported");
  for (size_t k = 0; k < sources.size(); ++k) {
    const std::string& src = sources[k];
    const std::string which = "image " + std::to_string(k + 1) + " of " + std::to_string(sources.size());
    Result<std::vector<uint8_t>> bytes = invalid_argument("");
    if (src.rfind("data:", 0) == 0) {
      bytes = decode_data_url(src);
    } else if (src.rfind("http://", 0) == 0 || src.rfind("https://", 0) == 0) {
      if (!opt.allow_remote_urls)
        return bad_request(which +
                               ": remote image URLs are disabled on this server (send the image as a "
                               "data: URL, or start the server with --allow-image-urls)",
                           "messages", "image_url_not_allowed");
      if (src.rfind("https://", 0) == 0)
        return bad_request(which + ": https image URLs cannot be fetched by this build; send a data: URL",
                           "messages", "image_url_not_supported");
      bytes = fetch_http(src, opt);
    } else {
      return bad_request(which + ": unsupported image URL (expected data:image/...;base64,... )", "messages",
                         "invalid_image_url");
    }
    if (!bytes.ok()) return bad_request(which + ": " + bytes.status().message(), "messages", "invalid_image");
    Result<image::DecodedImage> d = image::decode_image(bytes.value(), opt.limits);
    if (!d.ok()) return bad_request(which + ": " + d.status().message(), "messages", "invalid_image");
    Result<image::PreparedImage> p = image::prepare_image(d->rgb, vm.plan);
    if (!p.ok()) return bad_request(which + ": " + p.status().message(), "messages", "invalid_image");
    engine::RequestImage ri;
    ri.cache_key = vision_cache_key(bytes.value(), vm.config_key);
    ri.content_hash = image_content_hash(bytes.value());
    ri.span_length = p->plan.n_tokens;
    ri.prepared = std::make_shared<const image::PreparedImage>(std::move(p).value());
    out.push_back(std::move(ri));
  }
  // Expand the k-th placeholder into the k-th image's span.
  std::vector<int32_t> expanded;
  size_t k = 0;
  for (int32_t t : *ids) {
    if (t != vm.placeholder_id) {
      expanded.push_back(t);
      continue;
    }
    if (k >= out.size()) return bad_request("the prompt has more image placeholders than images", "messages");
    out[k].span_start = static_cast<int64_t>(expanded.size());
    expanded.insert(expanded.end(), static_cast<size_t>(out[k].span_length), vm.image_token_id);
    *image_tokens += out[k].span_length;
    ++k;
  }
  if (k != out.size())
    return bad_request(
        std::to_string(out.size()) + " images but " + std::to_string(k) + " placeholders in the prompt",
        "messages");
  *ids = std::move(expanded);
  return out;
}

}  // namespace ds41::server
