#include "parallel/store/prefix_store.h"

#include <utility>

namespace dtrain {

PrefixStore::PrefixStore(Store& base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {}

std::string PrefixStore::Full(std::string_view key) const {
  std::string full;
  full.reserve(prefix_.size() + 1 + key.size());
  full.append(prefix_).append("/").append(key);
  return full;
}

absl::Status PrefixStore::Set(std::string_view key, std::string_view value) {
  return base_.Set(Full(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(std::string_view key, absl::Duration timeout) {
  return base_.Get(Full(key), timeout);
}

absl::StatusOr<int64_t> PrefixStore::Add(std::string_view key, int64_t delta) {
  return base_.Add(Full(key), delta);
}

absl::StatusOr<std::string> PrefixStore::CompareSet(std::string_view key, std::string_view expected,
                                                    std::string_view desired) {
  return base_.CompareSet(Full(key), expected, desired);
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(Full(key));
  return base_.Wait(full, timeout);
}

absl::StatusOr<bool> PrefixStore::Delete(std::string_view key) { return base_.Delete(Full(key)); }

absl::StatusOr<int64_t> PrefixStore::NumKeys() { return base_.NumKeys(); }

absl::Status PrefixStore::Ping() { return base_.Ping(); }

}  // namespace dtrain
