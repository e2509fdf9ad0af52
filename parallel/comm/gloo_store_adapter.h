// Gloo's rendezvous store interface (set/get/wait) on a dtrain Store, with every key under a
// prefix so that each group's rendezvous (and each communicator created with a distinct
// prefix) has its own namespace. Failures throw gloo::IoException, the only way Gloo's
// interface can report them; GlooCommunicator catches them at its boundary. Thread-safe as the
// underlying Store is.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "parallel/store/store.h"

namespace dtrain {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and wait(); a wait given a longer one waits that long.
  GlooStoreAdapter(std::shared_ptr<dtrain::Store> store, std::string prefix,
                   absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<dtrain::Store> store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace dtrain
