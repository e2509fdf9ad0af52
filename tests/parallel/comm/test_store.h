// An in-memory Store for tests whose ranks are threads of one process: a map under a mutex,
// with a condition variable for the blocking calls. Thread-safe; not shareable across processes.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "parallel/comm/gloo_communicator.h"
#include "parallel/store/store.h"

namespace dtrain::testing {

class InMemoryStore : public Store {
 public:
  absl::Status Set(std::string_view key, std::string_view value) override {
    {
      std::lock_guard lock(mu_);
      map_[std::string(key)] = std::string(value);
    }
    changed_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    std::unique_lock lock(mu_);
    if (!changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                           [&] { return map_.count(std::string(key)) > 0; })) {
      return absl::DeadlineExceededError(
          absl::StrCat("store key '", std::string(key), "' never appeared"));
    }
    return map_[std::string(key)];
  }

  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    int64_t value = 0;
    {
      std::lock_guard lock(mu_);
      std::string& stored = map_[std::string(key)];
      if (!stored.empty() && !absl::SimpleAtoi(stored, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("store key '", std::string(key), "' is not a number"));
      }
      value += delta;
      stored = absl::StrCat(value);
    }
    changed_.notify_all();
    return value;
  }

  absl::StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                         std::string_view desired) override {
    std::lock_guard lock(mu_);
    auto it = map_.find(std::string(key));
    const std::string current = it == map_.end() ? "" : it->second;
    if (current == expected) map_[std::string(key)] = std::string(desired);
    changed_.notify_all();
    return map_.count(std::string(key)) ? map_[std::string(key)] : "";
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::unique_lock lock(mu_);
    auto all_present = [&] {
      for (const std::string& key : keys) {
        if (map_.count(key) == 0) return false;
      }
      return true;
    };
    if (!changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), all_present)) {
      std::vector<std::string> missing;
      for (const std::string& key : keys) {
        if (map_.count(key) == 0) missing.push_back(key);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("store keys never appeared: ", absl::StrJoin(missing, ", ")));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Delete(std::string_view key) override {
    std::lock_guard lock(mu_);
    return map_.erase(std::string(key)) > 0;
  }

  absl::StatusOr<int64_t> NumKeys() override {
    std::lock_guard lock(mu_);
    return static_cast<int64_t>(map_.size());
  }

  absl::Status Ping() override { return absl::OkStatus(); }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> map_;
};

// Runs body(comm) on `size` threads, one rank each, every rank with its own Gloo context on one
// in-memory store; returns when all are done.
template <typename Body>
void RunRanksInThreads(int size, absl::Duration timeout, Body body) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicatorOptions options;
      options.key_prefix = "comm/test/";
      options.rank = rank;
      options.size = size;
      options.timeout = timeout;
      absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm =
          GlooCommunicator::Create(store, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace dtrain::testing
