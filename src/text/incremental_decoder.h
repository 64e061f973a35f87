// ds41 text: streaming detokenization. Owns the bytes of a token stream that do not yet form
// complete UTF-8 characters, so that a streamed response never contains a partial UTF-8
// sequence (a multi-byte character split over several byte-level tokens is emitted once its
// last byte arrives).
//
// Guarantee: the concatenation of every push() result and flush() equals
// Tokenizer::decode(all ids) for the same skip_special setting; every chunk is valid UTF-8.
// Byte sequences that can never become valid are emitted at once as U+FFFD (one per maximal
// ill-formed subpart, text/utf8.h); an incomplete sequence left at the end becomes one U+FFFD
// in flush().
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "text/tokenizer.h"

namespace ds41::text {

class IncrementalDecoder {
 public:
  // `tok` must outlive the decoder.
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(&tok), skip_special_(skip_special) {}

  // Adds one token; returns the text completed by it (possibly empty). An unknown id is an
  // OutOfRange error and leaves the decoder unchanged.
  Result<std::string> push(int32_t id);
  // Ends the stream: returns what is still pending (repaired) and resets the decoder.
  std::string flush();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace ds41::text
