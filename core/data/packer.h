// Packs documents into training windows of seq_len + 1 tokens.
//
// Documents are concatenated, each followed by eos_id (none when eos_id < 0), and the stream is
// cut every seq_len tokens: neighbouring windows share one boundary token, so every token after
// the first is a target exactly once. Tokens that do not fill a window carry over to the next
// document; that carry is the packer's whole state. Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/token_decode.h"

namespace dtrain {

class Packer {
 public:
  Packer(int seq_len, int eos_id) : seq_len_(seq_len), eos_id_(eos_id) {}

  // Tokens of `document` with its EOS: size() + 1, or size() without an EOS id.
  int64_t Length(const std::vector<int32_t>& document) const {
    return static_cast<int64_t>(document.size()) + (eos_id_ >= 0 ? 1 : 0);
  }
  int64_t Length(const TokenDocument& document) const {
    return document.size() + (eos_id_ >= 0 ? 1 : 0);
  }
  // Appends tokens of `document` + EOS from *position (0 <= *position <= Length) until the
  // window is full or the document is used up, advancing *position. True when the window is full.
  // A TokenDocument's ids are widened to int32 as they are copied into the window.
  bool Fill(const std::vector<int32_t>& document, int64_t* position);
  bool Fill(const TokenDocument& document, int64_t* position);
  // With a full window: writes inputs (seq_len) and targets (seq_len, shifted by one) and keeps
  // the window's last token as the first of the next.
  void Emit(int32_t* inputs, int32_t* targets);

  const std::vector<int32_t>& carry() const { return window_; }
  void set_carry(std::vector<int32_t> carry) { window_ = std::move(carry); }

 private:
  // Fill over `doc_size` tokens, of which copy(first, count, out) writes a range.
  template <typename CopyFn>
  bool FillFrom(int64_t doc_size, int64_t* position, const CopyFn& copy);

  int seq_len_;
  int eos_id_;
  std::vector<int32_t> window_;  // the window in progress, at most seq_len + 1 tokens
};

}  // namespace dtrain
