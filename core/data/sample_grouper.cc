#include "core/data/sample_grouper.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/util/status.h"

namespace dtrain {

const SampleField* Sample::Find(const std::string& extension) const {
  for (const SampleField& field : fields) {
    if (field.extension == extension) return &field;
  }
  return nullptr;
}

bool SplitSampleName(const std::string& name, std::string* key, std::string* extension) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return false;  // no key, or a hidden file
  *key = name.substr(0, dot);
  *extension = absl::AsciiStrToLower(absl::string_view(name).substr(dot + 1));
  return true;
}

absl::StatusOr<bool> SampleGrouper::Next(Sample* sample) {
  sample->key.clear();
  sample->url = reader_->url();
  // Recycle the previous sample's buffers: the reader fills them without new allocations.
  for (SampleField& field : sample->fields) spare_.push_back(std::move(field.data));
  sample->fields.clear();
  std::string key;
  std::string extension;
  while (true) {
    if (!pending_) {
      ASSIGN_OR_RETURN(const bool more, reader_->Next(&member_));
      if (!more) return !sample->fields.empty();
    }
    pending_ = false;
    if (!SplitSampleName(member_.name, &key, &extension)) continue;
    if (!sample->fields.empty() && key != sample->key) {
      pending_ = true;  // first member of the next sample
      return true;
    }
    if (const SampleField* seen = sample->Find(extension)) {
      return absl::DataLossError(absl::StrCat("shard ", reader_->url(), ": members '", seen->member,
                                              "' (byte ", seen->offset, ") and '", member_.name,
                                              "' (byte ", member_.offset, ") both give extension '",
                                              extension, "' to sample '", key,
                                              "'; a sample holds one file per extension, so "
                                              "rename one of them"));
    }
    sample->key = key;
    sample->fields.push_back(SampleField{.extension = std::move(extension),
                                         .data = std::move(member_.data),
                                         .member = std::move(member_.name),
                                         .offset = member_.offset});
    extension.clear();
    member_.data.clear();
    if (!spare_.empty()) {
      member_.data = std::move(spare_.back());
      spare_.pop_back();
    }
  }
}

}  // namespace dtrain
