#include "core/data/tokenizers/sentencepiece_style.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/util/utf8.h"

namespace dtrain {
namespace {

// Debian's Abseil has its own string_view class.
absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

const icu::Normalizer2* IcuForm(const std::string& form) {
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  if (form == "NFC") normalizer = icu::Normalizer2::getNFCInstance(error);
  if (form == "NFD") normalizer = icu::Normalizer2::getNFDInstance(error);
  if (form == "NFKC") normalizer = icu::Normalizer2::getNFKCInstance(error);
  if (form == "NFKD") normalizer = icu::Normalizer2::getNFKDInstance(error);
  return U_SUCCESS(error) ? normalizer : nullptr;
}

void AppendNormalized(const icu::Normalizer2& form, std::string_view valid, std::string* out) {
  icu::StringByteSink<std::string> sink(out);
  UErrorCode error = U_ZERO_ERROR;
  form.normalizeUTF8(0, icu::StringPiece(valid.data(), static_cast<int32_t>(valid.size())), sink,
                     nullptr, error);
  // ICU fails only on a length past int32 or memory; the text stays as it was then.
  if (U_FAILURE(error)) out->append(valid);
}

std::string ApplyForm(const icu::Normalizer2& form, std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t begin = 0;  // start of the valid stretch not yet normalized
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(View(text), i);
    if (length > 0) {
      i += length;
      continue;
    }
    AppendNormalized(form, text.substr(begin, i - begin), &out);
    out.push_back(text[i]);
    begin = ++i;
  }
  AppendNormalized(form, text.substr(begin), &out);
  return out;
}

// Bytes of the character at text[i]: a byte that is not UTF-8 is one character of its own.
size_t CharLength(std::string_view text, size_t i) {
  return std::max<size_t>(1, Utf8SequenceLength(View(text), i));
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

std::string Strip(const DecoderStep& step, const std::string& token) {
  const std::string_view content = step.content;
  size_t begin = 0;
  for (int i = 0;
       i < step.strip_start && StartsWith(std::string_view(token).substr(begin), content); ++i) {
    begin += content.size();
  }
  size_t end = token.size();
  for (int i = 0; i < step.strip_stop && end >= begin + content.size() &&
                  std::string_view(token).substr(end - content.size(), content.size()) == content;
       ++i) {
    end -= content.size();
  }
  return token.substr(begin, end - begin);
}

// Runs of byte-fallback tokens become their bytes, one token per run.
std::vector<std::string> FuseBytes(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  std::string bytes;
  bool in_run = false;
  for (std::string& token : tokens) {
    const int byte = ByteFallbackByte(token);
    if (byte >= 0) {
      bytes.push_back(static_cast<char>(byte));
      in_run = true;
      continue;
    }
    if (in_run) out.push_back(std::move(bytes));
    bytes.clear();
    in_run = false;
    out.push_back(std::move(token));
  }
  if (in_run) out.push_back(std::move(bytes));
  return out;
}

std::string MetaspaceDecode(const MetaspaceSpec& spec, const std::string& token, bool first) {
  // Hugging Face drops every replacement of the first token (not only a leading one).
  const std::string space = first && spec.prepend_scheme != PrependScheme::kNever ? "" : " ";
  return absl::StrReplaceAll(View(token), {{View(spec.replacement), space}});
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::Make(std::vector<NormalizerStep> steps) {
  Normalizer normalizer;
  for (const NormalizerStep& step : steps) {
    const icu::Normalizer2* form = nullptr;
    if (step.kind == NormalizerStep::Kind::kUnicode) {
      form = IcuForm(step.form);
      if (form == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("Unicode normalization form '", step.form,
                         "' is unknown (NFC, NFD, NFKC and NFKD are) or ICU lacks its data"));
      }
    }
    normalizer.forms_.push_back(form);
  }
  normalizer.steps_ = std::move(steps);
  return normalizer;
}

std::string Normalizer::Apply(std::string_view text) const {
  std::string out(text);
  for (size_t s = 0; s < steps_.size(); ++s) {
    const NormalizerStep& step = steps_[s];
    switch (step.kind) {
      case NormalizerStep::Kind::kUnicode:
        out = ApplyForm(*static_cast<const icu::Normalizer2*>(forms_[s]), out);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!out.empty()) out.insert(0, step.content);
        break;
      case NormalizerStep::Kind::kReplace:
        if (!step.pattern.empty()) {
          out = absl::StrReplaceAll(out, {{View(step.pattern), View(step.content)}});
        }
        break;
    }
  }
  return out;
}

void MetaspaceWords(const MetaspaceSpec& spec, std::string_view text, bool at_text_start,
                    const std::function<void(std::string_view)>& word) {
  std::string replaced = absl::StrReplaceAll(View(text), {{" ", View(spec.replacement)}});
  const bool prepend = spec.prepend_scheme == PrependScheme::kAlways ||
                       (spec.prepend_scheme == PrependScheme::kFirst && at_text_start);
  if (prepend && !StartsWith(replaced, spec.replacement)) replaced.insert(0, spec.replacement);
  const std::string_view all = replaced;
  if (!spec.split) {
    if (!all.empty()) word(all);
    return;
  }
  size_t begin = 0;
  for (size_t i = 0; i < all.size(); i += CharLength(all, i)) {
    if (i > begin && StartsWith(all.substr(i), spec.replacement)) {
      word(all.substr(begin, i - begin));
      begin = i;
    }
  }
  if (begin < all.size()) word(all.substr(begin));
}

std::string DecodeTokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens) {
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        for (std::string& token : tokens) {
          token = absl::StrReplaceAll(token, {{View(step.pattern), View(step.content)}});
        }
        break;
      case DecoderStep::Kind::kByteFallback:
        tokens = FuseBytes(std::move(tokens));
        break;
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& token : tokens) all += token;
        tokens = {std::move(all)};
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& token : tokens) token = Strip(step, token);
        break;
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = MetaspaceDecode(step.metaspace, tokens[i], i == 0);
        }
        break;
    }
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

int ByteFallbackByte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int byte = 0;
  for (const char c : token.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    byte = byte * 16 + digit;
  }
  return byte;
}

}  // namespace dtrain
