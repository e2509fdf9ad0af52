#include "parallel/comm/gloo_store_adapter.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "gloo/common/error.h"

namespace dtrain {
namespace {

[[noreturn]] void Throw(const absl::Status& status) {
  throw gloo::IoException("rendezvous store: " + std::string(status.message()));
}

}  // namespace

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<dtrain::Store> store, std::string prefix,
                                   absl::Duration timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(Key(key), std::string_view(data.data(), data.size()));
  if (!status.ok()) Throw(status);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  absl::StatusOr<std::string> value = store_->Get(Key(key), timeout_);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, absl::ToChronoMilliseconds(timeout_));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  // Never less than this adapter's timeout: Gloo passes its context's, which the communicator
  // shortens for the connect alone (GlooCommunicator::Create).
  absl::Status status = store_->Wait(prefixed, std::max(absl::FromChrono(timeout), timeout_));
  if (!status.ok()) Throw(status);
}

}  // namespace dtrain
