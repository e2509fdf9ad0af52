// The data-parallel engine: one family for DDP, ZeRO-1, ZeRO-2, ZeRO-3 and FSDP, differing in
// what is sharded (sharding.h). It holds the parameters, gradients and optimizer state of this
// rank and is the model's BlockParameters: it gathers sharded parameters right before a region
// computes (prefetching the next unit) and frees them after, and reduces (all-reduce) or
// reduce-scatters each unit's gradients on the communicator's thread as soon as backward has
// produced them, so communication overlaps the rest of backward. FinishStep waits for what is
// left, clips on the global norm, runs AdamW on this rank's slices and gathers parameters.
//
// Every rank must make the same calls in the same order. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/backend/backend.h"
#include "core/checkpoint/format.h"
#include "core/model/block_parameters.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"
#include "core/optim/adamw.h"
#include "core/recipe/recipe.h"
#include "parallel/comm/communicator.h"
#include "parallel/sharding.h"

namespace dtrain {

// Bytes this rank holds for the model state (what ZeRO's 1/N claims are about): what it keeps
// for the whole run, and the peak of what it holds for a moment (gathered parameter units,
// gradient units waiting for their reduce-scatter, copies of gradients on the wire).
struct EngineMemory {
  size_t parameter_bytes = 0;
  size_t gradient_bytes = 0;
  size_t optimizer_bytes = 0;
  size_t gathered_peak_bytes = 0;
  size_t gradient_buffer_peak_bytes = 0;
  // ddp and zero1: the reductions' bf16 copies (parallel.reduce_dtype) and zero1's reduced
  // shards in flight.
  size_t reduction_peak_bytes = 0;
  size_t kept() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};

struct StepTotals {
  double loss = 0;             // mean token loss over the global batch's trained tokens
  double grad_norm = 0;        // before clipping
  int64_t trained_tokens = 0;  // the global batch's targets that count in the loss
  // Time this rank waited on communication during the step: on the host, and (NCCL) the compute
  // stream's waits on the device.
  double exposed_comm_ms = 0;
};

// Table positions [begin, end) of one kind of model state that this rank stores at `values`, in
// the engine's backend's memory (DataParallelEngine::backend()).
struct StateRange {
  StateKind kind = StateKind::kParameters;
  size_t begin = 0;
  size_t end = 0;
  float* values = nullptr;
};

struct GradientSlice {
  size_t begin = 0;
  size_t end = 0;
  const float* values = nullptr;
};

class DataParallelEngine : public BlockParameters {
 public:
  // `comm` is the data-parallel group (null for one process). `tensor_parallel` is the group of
  // the ranks holding the other tensor-parallel shards of the model (null without tensor
  // parallelism), `pipeline` the group of the other pipeline stages (null without): the
  // gradient norm sums over them too, each rank counting its table's CountedRanges so that
  // replicated tensors count once. `table` must outlive the engine.
  DataParallelEngine(const ParamTable& table, const ShardingStrategy& strategy,
                     const TrainSection& train, Backend& backend, Communicator* comm,
                     Communicator* tensor_parallel = nullptr, Communicator* pipeline = nullptr);

  // Fills this rank's parameters from the whole model's, given in table layout. At bf16
  // parameters (ShardingStrategy::param_type) these are the float32 masters, and the model
  // computes with bf16 copies of them (as after InitParameters and a checkpoint's load).
  void LoadParameters(const float* full);
  // Initialises this rank's parameters (GPT-2 style, see core/model/init.h) on `threads` host
  // threads (0: every usable CPU), the same values on any number.
  void InitParameters(const ModelConfig& config, uint64_t seed, int threads = 1);
  // The whole model's parameters in table layout, the float32 masters (gathered when sharded;
  // every rank calls).
  absl::StatusOr<std::vector<float>> GatherParameters();
  // The full gradient in table layout; only for one rank, without a data-parallel group whose
  // reductions may still be writing it (for tests and the PyTorch parity probe); else null.
  const float* full_gradients() const;

  // Before the step's first micro-batch: zero the gradients.
  void BeginStep();
  // Before each micro-batch; gradients are reduced across ranks only after the last one.
  void BeginMicroBatch(bool last);

  // A pipelined step instead (BeginStep and BeginMicroBatch are the single-stage path): the
  // forwards and backwards of the step's `micro_batches` micro-batches through each of the
  // table's model chunks may interleave on this stage (1F1B: F0 F1 B0 F2 B1 B2 ...; interleaved
  // schedules alternate chunks), each backward announced by BeginBackward. Every strategy
  // accumulates the stage's gradients locally, as DDP's no_sync does, and reduces each unit once
  // per step (all-reduce, or reduce-scatter under any sharding), as soon as its regions are
  // ready in their chunk's last backward (a unit never spans chunks): the stage's whole gradient
  // is held during the step under ZeRO-2/3 and FSDP too. Under parameter sharding with
  // `keep_gathered`, a unit is gathered at its first Acquire of the step and kept until its last
  // use in its chunk's last backward (torchtitan's reshard_after_forward = false under
  // pipelining): one all-gather per unit per step instead of two per micro-batch, for holding
  // the stage's whole parameters.
  void BeginPipelinedStep(int micro_batches, bool keep_gathered);
  // Before the backward of micro-batch `micro_batch` through model chunk `chunk` (an index into
  // the table's chunks()) of a pipelined step: each pair once, in any order; the one that
  // completes a chunk's micro-batches is that chunk's last backward. Forwards of later
  // micro-batches may follow. InvalidArgument for a pair out of range or announced twice;
  // FinishStep fails unless every pair was announced.
  absl::Status BeginBackward(int micro_batch, int chunk);
  // After the last micro-batch: wait for the reductions, reduce the loss (this rank's sum of
  // token losses over `global_tokens`), clip, AdamW, gather. Errors name the failed collective.
  // Masked targets (SFT: prompts, padding): `local_trained_tokens` is this rank's count of
  // targets >= 0, summed over the replicas with the loss; the loss is then the mean over the
  // global batch's trained tokens, and the gradients, scaled by 1 / global_tokens in backward,
  // are rescaled by global_tokens / trained before clipping, so the step is the same at any
  // split into ranks and micro-batches. -1: every target counts (trained = global_tokens). A
  // step without a trained token has zero gradients and loss 0.
  absl::StatusOr<StepTotals> FinishStep(double local_loss_sum, int64_t global_tokens,
                                        double grad_clip, double lr,
                                        int64_t local_trained_tokens = -1);
  // Checks that every rank holds the same replicated parameters (no-op when sharded).
  absl::Status CheckReplicas();

  // Checkpoints (parallel/checkpointing.h). What this rank saves: its own slices of sharded
  // state, and of replicated state an equal 1/N share of each unit (the slice a ZeRO rank of
  // this world would own), so the ranks together save every value once, in parallel.
  std::vector<StateRange> SavedState();
  // Everything this rank holds (parameters, whole or its shard, and its moments), to be filled
  // from a checkpoint of any layout. Call LoadedState after filling it.
  std::vector<StateRange> HeldState();
  // After HeldState's parameters were filled with float32 masters: at bf16 parameters held
  // whole, keeps this rank's slices of them as its masters and rounds them into the bf16 copies
  // the model computes with (HeldState handed out a float32 staging buffer for them, freed
  // here). Local (no communication).
  void LoadedState();
  // AdamW's step count (the same for every slice).
  int64_t optimizer_step() const { return optimizers_.front().step(); }
  void SetOptimizerStep(int64_t step);

  // This rank's reduced gradient after FinishStep (unscaled: AdamW applies the mean over the
  // trained tokens and the clipping as it reads it): for each unit,
  // the table positions [begin, end) of its optimizer slice and their values.
  std::vector<GradientSlice> ReducedGradients();

  EngineMemory memory() const;
  const ShardingStrategy& strategy() const { return strategy_; }
  // The backend whose memory SavedState's, HeldState's and ReducedGradients' values are.
  Backend& backend() const { return backend_; }

  // BlockParameters. At bf16 parameters the model computes with bf16 copies: the parameters
  // held whole, or each unit gathered in bf16 from the float32 shards.
  DataType compute_type() const override {
    return bf16_params() ? DataType::kBF16 : DataType::kF32;
  }
  ConstValues Acquire(int region, Pass pass) override;
  void Release(int region, Pass pass) override;
  float* Gradients(int region) override;
  void GradientsReady(int region) override;

 private:
  // A collective's bf16 copies, of gradients at parallel.reduce_dtype bf16 (or of the masters
  // gathered into bf16 parameters; empty at fp32): what the communicator reads (input) and, for a
  // reduce-scatter, writes (output).
  struct Wire {
    DeviceBuffer input;
    DeviceBuffer output;
  };
  // Each ends with its Work, destroyed (waited for) before the buffers it reads and writes.
  struct GatheredUnit {
    DeviceBuffer values;  // ranks * shard, in compute_type()
    Wire wire;
    int users = 0;
    std::unique_ptr<Work> pending;
  };
  struct GradientUnit {
    int unit = -1;
    DeviceBuffer values;   // ranks * shard, zeroed when handed out
    DeviceBuffer reduced;  // shard: this rank's part after the reduce-scatter
    Wire wire;
    std::unique_ptr<Work> pending;
    int regions_ready = 0;
  };
  // A full-gradient unit's reduction in flight: an all-reduce in place (ddp), or a
  // reduce-scatter into `shard` (zero1), copied into this rank's slice once done.
  struct PendingReduction {
    int unit = -1;
    DeviceBuffer shard;  // zero1 at fp32: the reduce-scatter's output
    Wire wire;
    std::unique_ptr<Work> work;  // last, as GatheredUnit's

    size_t held_bytes() const { return shard.bytes() + wire.input.bytes() + wire.output.bytes(); }
  };

  bool sharded_params() const { return strategy_.sharding == Sharding::kParameters; }
  bool sharded_grads() const { return strategy_.sharding >= Sharding::kGradients; }
  bool bf16_params() const { return strategy_.param_type == DataType::kBF16; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int ranks() const { return comm_ ? comm_->size() : 1; }
  // work's Wait, or with `on_device` its WaitOnDevice: the host's time in it counts as exposed
  // communication, and a failure is kept for FinishStep.
  absl::Status TimedWait(Work& work, bool on_device);
  absl::Status Wait(std::unique_ptr<Work>& work);
  // Makes the compute stream wait for `work` without blocking the host where the communicator
  // can (Work::WaitOnDevice), and keeps it in settling_ for a host wait at the next BeginStep or
  // FinishStep (Settle), which reports its outcome (a failure known now is kept at once).
  absl::Status WaitOnDevice(std::unique_ptr<Work>& work);
  void Settle();
  // Gradient reductions over comm_ in strategy_.reduce_type: grads (count) summed in place, or
  // input (ranks * shard) -> output (shard). At bf16 the values go through `wire`, and Land,
  // after the Work's wait, widens the result into `result` (count values; nothing at fp32).
  std::unique_ptr<Work> AllReduceGradients(float* grads, size_t count, Wire& wire);
  std::unique_ptr<Work> ReduceScatterGradients(const float* input, float* output, size_t shard,
                                               Wire& wire);
  void Land(Wire& wire, float* result, size_t count);
  // All-gathers this rank's `shard` float32 parameters `own` into `output` (ranks * shard): in
  // output's type, at bf16 rounded into `wire` first.
  std::unique_ptr<Work> GatherParams(const float* own, Values output, size_t shard, Wire& wire);
  // The step's loss, squared norm and token count (up to 3 values) summed over `group` (null:
  // unchanged) through scalars_; unlike SumOverGroup (host_values.h) it waits through Wait, so
  // the time counts as exposed communication in the step log.
  absl::Status ReduceStepSums(Communicator* group, absl::Span<double> values);
  GatheredUnit& Gather(int unit);
  void Prefetch(int region, Pass pass);
  // Returns a unit-gradient buffer whose reduction finished, folding the result into the shard.
  absl::Status Retire(GradientUnit& buffer);
  // Makes the compute stream wait for `reduction` and puts its result in this rank's gradients.
  void LandReduction(PendingReduction& reduction);
  GradientUnit& GradientBufferFor(int unit);
  // Where this rank's slice of `unit` is in the parameter storage (full or shard), and the
  // slice's float32 values (the storage must hold float32).
  size_t OwnOffset(const Unit& unit) const;
  float* OwnParams(const Unit& unit);
  // The float32 parameters in params_'s layout that loading (InitParameters, LoadParameters,
  // HeldState) fills: params_ itself, or at bf16 parameters held whole loaded_, which
  // LoadedState rounds into params_ and frees.
  float* LoadedParams();
  // This rank's optimizer slice of `unit`'s float32 masters, which AdamW updates: in masters_
  // when it is held, else OwnParams.
  float* MasterParams(const Unit& unit);
  // Where table position `position` of unit `u`'s optimizer slice is among the masters.
  float* MasterAt(size_t u, size_t position);
  float* OwnGrads(const Unit& unit);
  // Where table position `position` of `unit` is among the float32 parameters loading fills
  // (LoadedParams, or the shard; it must be held).
  float* ParamAt(const Unit& unit, size_t position);
  // Table range of the optimizer slice of unit `u` (the whole unit when unsharded).
  std::pair<size_t, size_t> OptimizerRange(size_t u) const;
  // Whether the current backward (or micro-batch, outside a pipelined step) is the last of the
  // step to reach `region`: its gradient is then complete.
  bool LastBackward(int region) const;
  // This rank's share of the squared gradient norm: its gradient slices' counted elements.
  double CountedSumSquares();

  const ParamTable& table_;
  ShardingStrategy strategy_;
  Backend& backend_;
  Communicator* comm_;
  Communicator* tensor_parallel_;
  Communicator* pipeline_;
  std::vector<std::pair<size_t, size_t>> counted_;  // table_.CountedRanges()
  UnitLayout layout_;
  // The backend's memory: the padded full buffer, or this rank's shard (kParameters; kGradients+
  // for the gradients). Held whole the parameters are in compute_type(), the gradients and a
  // shard always float32.
  DeviceBuffer params_;
  DeviceBuffer grads_;
  // At bf16 parameters held whole (ddp, zero1, zero2), params_ holds the bf16 copies and this the
  // float32 masters of this rank's optimizer slices, in shard layout (Megatron's distributed
  // optimizer under ZeRO; the whole model under ddp). Empty otherwise: under parameter sharding
  // the shard is the masters, rounded as it is gathered.
  DeviceBuffer masters_;
  DeviceBuffer loaded_;   // LoadedParams' staging, between a load and LoadedState
  DeviceBuffer scalars_;  // 3 doubles: CountedSumSquares' sum, read once a step; ReduceStepSums'
  std::vector<AdamW> optimizers_;         // one per unit slice this rank owns (one when unsharded)
  std::map<int, GatheredUnit> gathered_;  // kParameters: unit -> gathered values
  std::deque<GradientUnit> gradient_units_;  // kGradients+: buffers in use, oldest first
  std::vector<GradientUnit> spare_gradient_units_;
  // Gathers the compute stream waits for on the device, not yet waited on the host (Settle).
  std::vector<std::unique_ptr<Work>> settling_;
  std::vector<int> regions_ready_;           // unsharded gradients: per unit, this micro-batch
  std::deque<PendingReduction> reductions_;  // oldest first
  bool last_micro_batch_ = true;
  // The pipelined step (BeginPipelinedStep); `backwards_` has one flag per (chunk, micro-batch),
  // set by its BeginBackward, and `chunk_backwards_` counts each chunk's.
  bool pipelined_ = false;
  bool keep_gathered_ = false;
  int micro_batches_ = 0;
  std::vector<bool> backwards_;
  std::vector<int> chunk_backwards_;
  int backwards_begun_ = 0;
  size_t units_completed_ = 0;  // units whose regions were all ready in the last backward
  absl::Status error_;          // the first communication failure; reported by FinishStep
  bool updated_ = false;  // an optimizer step has changed the parameters this process began with
  double exposed_comm_ms_ = 0;
  size_t peak_gathered_values_ = 0;
  size_t peak_gradient_unit_values_ = 0;
  size_t peak_reduction_bytes_ = 0;
};

}  // namespace dtrain
