#include "core/data/tokenizers/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// One JIT stack per thread, grown past PCRE2's 32 KiB default: patterns like \s+(?!\S)
// backtrack over a whole whitespace run, and adversarial text makes runs of megabytes.
struct ThreadMatchContext {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchContext() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchContext() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

// Hugging Face's regexes are Oniguruma's, which write a code point \uHHHH where PCRE2 writes
// \x{HHHH}; an escaped backslash (\\u) stays as it is.
std::string WithPcre2CodePoints(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const std::string_view digits = pattern.substr(i + 2, 4);
    if (pattern[i + 1] == 'u' && digits.size() == 4 &&
        std::all_of(digits.begin(), digits.end(),
                    [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
      out.append("\\x{").append(digits).append("}");
      i += 5;
    } else {
      out.append(pattern.substr(i, 2));
      ++i;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Compile(const std::string& written) {
  const std::string pattern = WithPcre2CodePoints(written);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("the split regex does not compile at offset ",
                                                   offset, ": ", Pcre2Message(error)));
  }
  // Without JIT (a platform PCRE2 lacks it for) matching is slower but the same.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<RegexSplitter>(new RegexSplitter(code));
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status RegexSplitter::Split(std::string_view text,
                                  const std::function<void(std::string_view)>& piece) const {
  thread_local ThreadMatchContext match;
  pcre2_code* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;  // where the next search begins; text before it is emitted
  absl::Status status;
  while (start < text.size()) {
    // Empty matches are no pieces (Hugging Face drops them too).
    const int rc =
        pcre2_match(code, subject, text.size(), start, PCRE2_NOTEMPTY, data, match.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = absl::ResourceExhaustedError(
          absl::StrCat("the split regex failed at byte ", start, ": ", Pcre2Message(rc)));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    if (ovector[0] > start) piece(text.substr(start, ovector[0] - start));
    piece(text.substr(ovector[0], ovector[1] - ovector[0]));
    start = ovector[1];
  }
  if (status.ok() && start < text.size()) piece(text.substr(start));
  pcre2_match_data_free(data);
  return status;
}

}  // namespace dtrain
