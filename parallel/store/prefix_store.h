// A view of another Store in which every key becomes "<prefix>/<key>": one namespace per process
// group or restart generation on a shared store. Does not own `base`, which must outlive it.
// Thread-safe when `base` is. Errors come from `base` and name the full, prefixed keys.
#pragma once

#include <string>

#include "parallel/store/store.h"

namespace dtrain {

class PrefixStore final : public Store {
 public:
  PrefixStore(Store& base, std::string prefix);

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;
  // Counts the keys of the whole base store: a store cannot count one prefix cheaply.
  absl::StatusOr<int64_t> NumKeys() override;
  absl::Status Ping() override;

  const std::string& prefix() const { return prefix_; }

 private:
  std::string Full(std::string_view key) const;

  Store& base_;
  const std::string prefix_;
};

}  // namespace dtrain
