#include "core/data/tokenizers/sentencepiece_library.h"

#include <sentencepiece_processor.h>

namespace dtrain::spm {
namespace {

class LibraryProcessor final : public Processor {
 public:
  sentencepiece::SentencePieceProcessor processor;

  int vocab_size() const override { return processor.GetPieceSize(); }
  std::string Piece(int id) const override { return processor.IdToPiece(id); }
  bool IsSpecial(int id) const override {
    return processor.IsControl(id) || processor.IsUnknown(id);
  }
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    const sentencepiece::util::Status status = processor.Encode(text, ids);
    if (!status.ok()) *error = status.error_message();
    return status.ok();
  }
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    const sentencepiece::util::Status status = processor.Decode(ids, text);
    if (!status.ok()) *error = status.error_message();
    return status.ok();
  }
};

}  // namespace

std::unique_ptr<Processor> Processor::Load(const std::string& serialized, std::string* error) {
  auto loaded = std::make_unique<LibraryProcessor>();
  const sentencepiece::util::Status status = loaded->processor.LoadFromSerializedProto(serialized);
  if (!status.ok()) {
    *error = status.error_message();
    return nullptr;
  }
  return loaded;
}

}  // namespace dtrain::spm
