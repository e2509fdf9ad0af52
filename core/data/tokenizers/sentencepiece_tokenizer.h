// SentencePiece models (tokenizer.model of Llama 2 and others) through Debian's
// libsentencepiece. Special pieces (control and unknown: <s>, </s>, <unk>) written in the text
// become their ids, as in Hugging Face's Llama tokenizer; the stretches between them are
// encoded by the library, each as a text of its own. Text must be UTF-8 (the library's input);
// an invalid byte is an error naming its offset. Thread-safe; one thread per Encode call.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/data/tokenizer.h"

namespace dtrain {

// InvalidArgument with the library's message when `serialized` is not a model.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeSentencePiece(const std::string& serialized,
                                                             std::string name);

}  // namespace dtrain
