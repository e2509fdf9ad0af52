// Checkpoints of a training run (format: core/checkpoint/format.h): the data-parallel engine's
// state, the data cursor and the step, saved by every rank in parallel and loaded into any world
// size, strategy or tensor-parallel size. The checkpoint holds the whole model's tensors: each
// rank writes the boxes of them that its slice holds (a tensor-parallel shard's rows and column
// block), a value held by several ranks (data-parallel replicas, tensors or kv heads replicated
// over tensor-parallel ranks) written by one of them; each rank reads back the boxes it holds.
//
// Resume (checkpoint.resume): auto takes the newest complete checkpoint in checkpoint.dir (no
// checkpoint: a fresh start; checkpoints of which none loads: an error, never a fresh start that
// would lose the run's history and prune its checkpoints); never starts fresh; a path loads that
// step-<N> folder (or the newest complete one in that checkpoint folder). A checkpoint that is
// incomplete or corrupt (missing manifest, truncated or missing rank file, a chunk whose CRC32C
// does not match) is skipped with a warning naming it and the previous one is tried: every rank
// checks the chunks it reads, and the ranks agree collectively, so all of them load the same one. A
// stale `latest` is reported, not trusted: the folders themselves are the truth.
//
// Recipe changes across a resume: keys that change the shape of the saved state or of the data
// position (model.family, n_layer, n_head, n_kv_head, d_model, d_ff, vocab_size, max_seq_len;
// train.seq_len; data.format) stop the run with an error naming them, since nothing meaningful
// can load. Any other change (learning rate, steps, strategy, world size, batch split, logging,
// ...) is allowed and listed in one warning: fine-tuning a schedule or moving to another cluster
// are the reasons to resume with a different recipe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/writer.h"
#include "core/data/loader.h"
#include "core/model/param_table.h"
#include "core/recipe/recipe.h"
#include "core/util/folder_lock.h"
#include "parallel/comm/communicator.h"
#include "parallel/data_parallel.h"

namespace dtrain {

// NotFound (exit 2) when checkpoint.resume names a path that does not exist (auto and never
// always do), saying where a relative one was looked for: checked before a run writes anything.
absl::Status CheckResumePathExists(const std::string& resume);

class TrainingCheckpoints {
 public:
  // `comm` is the world (null for one process); the ranks agree on a nonce naming this attempt's
  // stage folders (a collective: every rank calls Create). With checkpoint.async the staging
  // memory (this rank's saved share of parameters and moments) is allocated here.
  static absl::StatusOr<std::unique_ptr<TrainingCheckpoints>> Create(const Recipe& recipe,
                                                                     const ParamTable& table,
                                                                     DataParallelEngine& engine,
                                                                     Communicator* comm);

  // Loads per checkpoint.resume into the engine and `loader` and returns the step to continue at;
  // 0 when nothing was loaded (the engine's moments are then zero; the caller initialises the
  // parameters). A restart (`restart_count` > 0: dtrain launch's, or a requeued Slurm job's)
  // resumes as `auto` once checkpoint.dir holds checkpoints: what its earlier attempts saved.
  // Collective.
  absl::StatusOr<int64_t> Resume(SequenceLoader& loader, int restart_count);

  // Saves the state after `step` steps. Returns the milliseconds training was blocked: the whole
  // write when synchronous; waiting for the previous save plus the copy into staging memory when
  // asynchronous. Every rank calls it at the same step (no collective inside).
  absl::StatusOr<double> Save(int64_t step, double lr, const LoaderState& data,
                              const std::string& metrics_line);
  // Waits for the save in flight.
  absl::Status Finish() { return writer_.Wait(); }
  // The error of a background save that has failed (OK while it runs): the run ends at the step
  // it failed, not at the next save.
  absl::Status CheckBackgroundSave() { return writer_.Poll(); }

  // A start that failed before the first step: lets go of the checkpoint folder, leaving it as it
  // was found where this run wrote nothing there (FolderLock::Abandon).
  void AbandonFolder() {
    if (folder_lock_) folder_lock_->Abandon();
  }

  const std::string& dir() const { return dir_; }
  // After Resume: the metrics.jsonl line of the resumed step ("" when none was saved).
  const std::string& resumed_metrics_line() const { return resumed_metrics_line_; }

 private:
  TrainingCheckpoints(const Recipe& recipe, const ParamTable& table, DataParallelEngine& engine,
                      Communicator* comm, uint64_t nonce);
  // What a checkpoint that loaded held besides the engine's state.
  struct Loaded {
    LoaderState data;  // to restore into the loader
    int64_t step = 0;
    std::string origin;  // the layout that saved it, for the log
    // Recipe keys saved with other values, each with both: "train.lr (0.001, now 0.0003)".
    std::vector<std::string> changed_keys;
    bool init_from_changed = false;  // train.init_from was another (or none)
    std::string run_name;            // the run.name that saved it
    std::string metrics_line;        // of the saved step
  };
  // Fills the engine from `step_dir`. A fatal error (an incompatible recipe) sets `fatal`.
  absl::StatusOr<Loaded> TryLoad(const std::string& step_dir, bool& fatal);
  // Resume's search: the step the run starts from, its checkpoint loaded.
  absl::StatusOr<int64_t> LoadResumeStep(SequenceLoader& loader, const std::string& resume);
  // Rank 0 moves the checkpoints of dir_ past `start_step` aside (AsideName): an earlier run's,
  // when checkpoint.resume is never or names an older checkpoint, or damaged ones auto skipped.
  // Left there, they would mix with this run's: a later auto resume would take them over its
  // own, and pruning would keep them.
  void SetAsideLaterCheckpoints(int64_t start_step);

  const Recipe& recipe_;
  const ParamTable& table_;
  DataParallelEngine& engine_;
  Communicator* comm_;
  int rank_ = 0;
  int world_ = 1;
  uint64_t nonce_ = 0;
  std::string dir_;
  std::optional<FolderLock> folder_lock_;  // rank 0's, of dir_
  std::string recipe_yaml_;
  CheckpointWriter writer_;
  std::string resumed_metrics_line_;
};

}  // namespace dtrain
