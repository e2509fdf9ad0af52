#include "parallel/comm/collective_progress.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace dtrain {

CollectiveProgress::CollectiveProgress(std::shared_ptr<Store> store, std::string key_prefix,
                                       int rank, int size, std::vector<int> world_ranks)
    : store_(std::move(store)),
      key_prefix_(std::move(key_prefix)),
      rank_(rank),
      size_(size),
      world_ranks_(std::move(world_ranks)) {
  publisher_ = std::thread([this] { PublisherLoop(); });
}

CollectiveProgress::~CollectiveProgress() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  publisher_.join();
}

void CollectiveProgress::Started(int64_t seq) {
  bool wake;
  {
    std::lock_guard lock(mu_);
    started_ = seq;
    wake = idle_;
  }
  // Only when it sleeps idle: on two cores every needless wake-up of a thread preempts the one
  // running a collective.
  if (wake) wake_.notify_one();
}

void CollectiveProgress::PublisherLoop() {
  int64_t published = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    if (!stopping_ && started_ == published) {
      idle_ = true;
      wake_.wait(lock, [&] { return stopping_ || started_ > published; });
      idle_ = false;
    }
    if (stopping_) return;
    const int64_t target = started_;
    lock.unlock();
    if (store_->Add(StartedKey(rank_), target - published).ok()) published = target;
    lock.lock();
    wake_.wait_for(lock, absl::ToChronoMilliseconds(kPublishInterval), [&] { return stopping_; });
  }
}

std::string CollectiveProgress::Diagnose(int64_t seq, bool timed_out, std::vector<int>& blamed) {
  absl::SleepFor(kPublishSettle);
  // (last collective started, world rank) of each peer that never started this one.
  std::vector<std::pair<int64_t, int>> behind;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    absl::StatusOr<int64_t> started = store_->Add(StartedKey(r), 0);
    if (!started.ok()) {
      return absl::StrCat("could not read the peers' progress from the store: ",
                          started.status().message());
    }
    if (*started < seq) behind.emplace_back(*started, WorldRank(r));
  }
  // Furthest behind first: a rank that died or stopped published its progress last, so the ranks
  // only stuck behind it (waiting on it in another group) come after it.
  std::sort(behind.begin(), behind.end());
  std::vector<std::string> missing;
  for (const auto& [started, world_rank] : behind) {
    blamed.push_back(world_rank);
    missing.push_back(started == 0
                          ? absl::StrFormat("rank %d (started no collective)", world_rank)
                          : absl::StrFormat("rank %d (last started #%d)", world_rank, started));
  }
  if (!missing.empty()) {
    return absl::StrCat("never started by ", absl::StrJoin(missing, ", "),
                        " (exited, crashed, hung, or issued different collectives)");
  }
  if (timed_out && size_ == 2) {
    // Both started it and this rank's wait ran out: only the peer can have held it up (stopped
    // or hung inside the operation, or in another one of the same number).
    blamed.push_back(WorldRank(1 - rank_));
    return absl::StrCat("every rank started this operation; its one peer, rank ", blamed.back(),
                        ", never completed its part (hung or stopped inside the operation)");
  }
  return "every rank started this operation";
}

int CollectiveProgress::WorldRank(int group_rank) const {
  return world_ranks_.empty() ? group_rank : world_ranks_[group_rank];
}

std::string CollectiveProgress::StartedKey(int group_rank) const {
  return absl::StrCat(key_prefix_, "started/", group_rank);
}

}  // namespace dtrain
