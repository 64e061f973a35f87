// ds41 text: streaming detokenization (see incremental_decoder.h).
#include "text/incremental_decoder.h"

#include "text/utf8.h"

namespace ds41::text {

Result<std::string> IncrementalDecoder::push(int32_t id) {
  if (!tok_->valid_id(id))
    return out_of_range("incremental decode: token id " + std::to_string(id) + " is not in the vocabulary");
  if (skip_special_ && tok_->is_special(id)) return std::string();
  pending_ += tok_->token_bytes(id);
  const size_t k = utf8_complete_prefix(pending_);
  if (k == 0) return std::string();
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, k));
  pending_.erase(0, k);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace ds41::text
