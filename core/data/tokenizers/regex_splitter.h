// A pre-tokenizer's split regex through PCRE2 (Unicode classes such as \p{L}, JIT-compiled):
// text is cut into the regex's matches and the stretches between them, in order, as Hugging
// Face's Split with behavior "Isolated" does. Invalid UTF-8 never matches (PCRE2's
// MATCH_INVALID_UTF), so it lands in the stretches between matches and no byte is lost.
// Thread-safe: matching state is per call and per thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain {

class RegexSplitter {
 public:
  // InvalidArgument with PCRE2's message and offset when `pattern` does not compile. Oniguruma's
  // \uHHHH (Hugging Face's regexes are Oniguruma's) reads as the code point.
  static absl::StatusOr<std::unique_ptr<RegexSplitter>> Compile(const std::string& pattern);
  ~RegexSplitter();

  // Calls piece(p) for each piece of `text` (never empty), in order. An error only when PCRE2
  // gives up (its match or stack limits, on pathological input).
  absl::Status Split(std::string_view text,
                     const std::function<void(std::string_view)>& piece) const;

 private:
  explicit RegexSplitter(void* code) : code_(code) {}

  void* code_;  // pcre2_code_8*
};

}  // namespace dtrain
