// A thin wall around Debian's libsentencepiece. Its header declares its own absl::string_view,
// which clashes with Abseil's, so only sentencepiece_library.cc includes it and this interface
// uses the standard library alone. Errors are returned as text for the caller to wrap.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::spm {

class Processor {
 public:
  // A model from the bytes of a .model file (a serialized ModelProto); nullptr and *error set
  // when they are not one.
  static std::unique_ptr<Processor> Load(const std::string& serialized, std::string* error);
  virtual ~Processor() = default;

  virtual int vocab_size() const = 0;
  virtual std::string Piece(int id) const = 0;
  // Control pieces (<s>, </s>) and the unknown piece: the ones Hugging Face treats as special.
  virtual bool IsSpecial(int id) const = 0;
  // Thread-safe (the library's encoder and decoder are const).
  virtual bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  virtual bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;
};

}  // namespace dtrain::spm
