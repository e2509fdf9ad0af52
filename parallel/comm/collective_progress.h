// Which collectives each member of a group has started, kept in the rendezvous store, so that a
// rank whose collective fails or times out names the peers that never started it (and blames
// them: faulty_ranks.h) instead of only itself. Every communicator of a group numbers its
// collectives 1, 2, ... in issue order; each member publishes the newest it started as the
// counter "<key_prefix>started/<rank>".
//
// Started is cheap: a background thread publishes, coalescing bursts into at most one store
// round trip per kPublishInterval (a round trip per collective would cost ~50-100 us on the
// critical path), woken only when it sleeps idle. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "parallel/store/store.h"

namespace dtrain {

class CollectiveProgress {
 public:
  // Progress records reach the store at most every kPublishInterval; Diagnose waits
  // kPublishSettle, one interval and a round trip, before reading the peers' records. The
  // interval is long because every publish wakes two threads (the publisher, the store's) on a
  // machine whose cores run the collectives: at 10 ms, Gloo all-reduces on two ranks sharing 2
  // cores ran at 0.2-0.7x of gloo::allreduce below 1 MiB and 0.74-0.86x at 1-2 MiB; diagnosis is
  // paid once, at failure.
  static constexpr absl::Duration kPublishInterval = absl::Milliseconds(250);
  static inline const absl::Duration kPublishSettle = kPublishInterval + absl::Milliseconds(100);

  // This member is `rank` of `size`; `world_ranks` maps group ranks to world ranks for messages
  // and blame (empty: the identity).
  CollectiveProgress(std::shared_ptr<Store> store, std::string key_prefix, int rank, int size,
                     std::vector<int> world_ranks);
  ~CollectiveProgress();
  CollectiveProgress(const CollectiveProgress&) = delete;
  CollectiveProgress& operator=(const CollectiveProgress&) = delete;

  // This member started collective number `seq` (increasing).
  void Started(int64_t seq);

  // Why collective `seq` failed here, as far as the peers' records tell (after waiting
  // kPublishSettle): the ranks that never started it, furthest behind first (a dead rank's
  // record is older than those of the ranks waiting on it), or that every rank did. When it
  // `timed_out` and the group has two members that both started it, the peer never completed
  // its part. Appends the world ranks to blame to `blamed`, in that order.
  std::string Diagnose(int64_t seq, bool timed_out, std::vector<int>& blamed);

  int WorldRank(int group_rank) const;

 private:
  std::string StartedKey(int group_rank) const;
  void PublisherLoop();

  const std::shared_ptr<Store> store_;
  const std::string key_prefix_;
  const int rank_;
  const int size_;
  const std::vector<int> world_ranks_;

  std::mutex mu_;
  std::condition_variable wake_;  // a collective started, or stopping_
  int64_t started_ = 0;           // the newest collective started
  bool idle_ = false;             // the publisher waits for a collective to start
  bool stopping_ = false;
  std::thread publisher_;
};

}  // namespace dtrain
