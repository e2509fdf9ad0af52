// WebDataset samples from tar members: consecutive members sharing a key form one sample.
//
// Key = directory + basename up to the first dot; extension = the rest, lowercased
// ("d/x.Input.npy" -> key "d/x", extension "input.npy"). Members without a dot in their basename
// are skipped; a key seen again later starts a new sample; a repeated extension inside a sample
// is an error naming both members. Borrows the reader; one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/data/tar_reader.h"

namespace dtrain {

struct SampleField {
  std::string extension;
  std::string data;
  std::string member;  // the tar member it came from, for messages
  int64_t offset = 0;  // byte offset of that member's header
};

struct Sample {
  std::string key;                  // __key__
  std::string url;                  // __url__: the shard it came from
  std::vector<SampleField> fields;  // in archive order

  // The field with this (lowercase) extension, or null.
  const SampleField* Find(const std::string& extension) const;
};

class SampleGrouper {
 public:
  explicit SampleGrouper(TarReader* reader) : reader_(reader) {}

  // The next sample into *sample: true, or false at the end of the archive.
  absl::StatusOr<bool> Next(Sample* sample);

 private:
  TarReader* reader_;
  TarMember member_;
  bool pending_ = false;            // member_ holds the first member of the next sample
  std::vector<std::string> spare_;  // buffers of earlier samples, reused for member data
};

// Splits a member name into key and lowercased extension; false for names without a dot in
// their basename.
bool SplitSampleName(const std::string& name, std::string* key, std::string* extension);

}  // namespace dtrain
