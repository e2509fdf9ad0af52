#include "parallel/planner/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

// How much a layout asks of its operators, compared lexicographically: a pipeline changes the
// schedule and the failure surface most, then tensor parallelism (the model's code path), then
// sharding (ddp < zero1 < zero2 < zero3/fsdp), offload and recomputation; then a pipeline
// schedule other than 1F1B (the recipe's default, as Megatron-LM's), chosen only where it pays;
// last, more and smaller micro-batches than fit (the cost model times a step's GEMMs alike at
// any size, where on a GPU larger ones run closer to its peak and launch fewer kernels).
std::tuple<bool, bool, int, bool, int, bool, int> Complexity(const Layout& layout) {
  const int strategy = layout.strategy == Strategy::kFsdp ? static_cast<int>(Strategy::kZero3)
                                                          : static_cast<int>(layout.strategy);
  return {layout.pp > 1,
          layout.tp > 1,
          strategy,
          layout.offload,
          static_cast<int>(layout.recompute),
          layout.schedule != PipelineSchedule::kOneFOneB,
          -layout.micro_batch};
}

// What `layout` adds over `base`, for "faster, but needs ..." reasons.
std::string ExtraComplexity(const Layout& layout, const Layout& base) {
  std::vector<std::string> extras;
  if (Complexity(Layout{.strategy = layout.strategy}) >
      Complexity(Layout{.strategy = base.strategy})) {
    extras.push_back(std::string(StrategyName(layout.strategy)));
  }
  if (layout.tp > base.tp) extras.push_back(absl::StrCat("tp ", layout.tp));
  if (layout.pp > base.pp) extras.push_back(absl::StrCat("pp ", layout.pp));
  if (layout.recompute > base.recompute) {
    extras.push_back(absl::StrCat(RecomputeName(layout.recompute), " recomputation"));
  }
  if (layout.micro_batch < base.micro_batch) {
    extras.push_back(absl::StrCat("micro-batches of ", layout.micro_batch));
  }
  if (layout.offload && !base.offload) {
    extras.push_back("optimizer offload (which the trainer does not run yet)");
  }
  return extras.empty() ? "a more complex layout" : absl::StrJoin(extras, ", ");
}

std::vector<int> MicroBatches(int per_replica) {
  std::vector<int> sizes;
  for (int b = 1; b <= std::min(per_replica, 64); b *= 2) {
    if (per_replica % b == 0) sizes.push_back(b);
  }
  return sizes;
}

absl::Status CheckWorkload(const Workload& workload, const ClusterSpec& cluster) {
  if (cluster.world_size() < 1) {
    return absl::InvalidArgumentError("cluster.nodes and cluster.gpus_per_node must be >= 1");
  }
  if (cluster.gpu_memory_gib <= 0 || cluster.peak_tflops <= 0 || cluster.memory_gbps <= 0 ||
      cluster.intra_gbps <= 0 || cluster.nic_gbps <= 0) {
    return absl::InvalidArgumentError(
        "cluster: GPU memory, peak TFLOP/s, memory bandwidth and link bandwidths must be "
        "positive; check the cluster section's overrides");
  }
  if (workload.batch_size < 1 || workload.seq_len < 1 || workload.model.n_layer < 1) {
    return absl::InvalidArgumentError(
        "train.batch_size, train.seq_len and model.n_layer must be "
        ">= 1");
  }
  return absl::OkStatus();
}

// Orders the estimated candidates, picks the recommendation and writes every reason.
void Rank(Plan& plan) {
  std::vector<Candidate>& all = plan.candidates;
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    if ((a.verdict == Verdict::kInvalid) != (b.verdict == Verdict::kInvalid)) {
      return b.verdict == Verdict::kInvalid;
    }
    // Equally fast: the simpler first, so that it counts as the fastest.
    return std::make_pair(a.estimate.time.step_ms, Complexity(a.layout)) <
           std::make_pair(b.estimate.time.step_ms, Complexity(b.layout));
  });
  // The trainer has no optimizer offload: an offload layout is never recommended (its recipe
  // lines would not train), and where only such layouts fit, nothing is (WhyNoLayout names them
  // and the nodes that fit without).
  int fastest = -1;
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    if (all[i].verdict == Verdict::kFits && !all[i].layout.offload) {
      fastest = i;
      break;
    }
  }
  if (fastest < 0) {
    for (Candidate& candidate : all) {
      if (candidate.verdict == Verdict::kFits) {
        candidate.reason = "fits only with optimizer offload, which the trainer does not run yet";
      }
    }
    return;
  }
  const double fastest_ms = all[fastest].estimate.time.step_ms;
  const double limit_ms = std::max(fastest_ms * (1 + plan.options.simpler_within),
                                   fastest_ms + plan.options.simpler_within_ms);
  int best = fastest;
  for (int i = fastest; i < static_cast<int>(all.size()); ++i) {
    if (all[i].verdict != Verdict::kFits || all[i].layout.offload) continue;
    if (all[i].estimate.time.step_ms > limit_ms) break;
    if (Complexity(all[i].layout) < Complexity(all[best].layout)) best = i;
  }
  plan.recommended = best;
  Candidate& chosen = all[best];
  chosen.verdict = Verdict::kRecommended;
  const double chosen_ms = chosen.estimate.time.step_ms;
  chosen.reason =
      best == fastest ? "the fastest layout that fits"
      : std::isinf(plan.options.simpler_within)
          ? "the simplest layout that fits"
          : absl::StrFormat("the simplest layout within %.0f%% or %g ms of the fastest (%s, %s ms)",
                            100 * plan.options.simpler_within, plan.options.simpler_within_ms,
                            DescribeLayout(all[fastest].layout), FormatMs(fastest_ms));
  // Simpler can hold more (ddp a whole optimizer where zero1 a shard): what it costs, and why,
  // in the tenths of a GiB that the table prints.
  const auto gib = [](const Candidate& candidate) {
    return absl::StrFormat("%.1f", candidate.estimate.memory.device_bytes() / kGiB);
  };
  if (best != fastest &&
      chosen.estimate.memory.device_bytes() > all[fastest].estimate.memory.device_bytes() &&
      gib(chosen) != gib(all[fastest])) {
    absl::StrAppend(&chosen.reason, "; it holds ", gib(chosen), " GiB a GPU to the fastest's ",
                    gib(all[fastest]),
                    " GiB: while both fit, the simpler is preferred (less sharding to tune and "
                    "debug)");
  }
  for (Candidate& candidate : all) {
    if (candidate.verdict != Verdict::kFits) continue;
    const double ms = candidate.estimate.time.step_ms;
    candidate.reason =
        ms < chosen_ms
            ? absl::StrFormat("%.1f%% faster, but needs %s", 100 * (chosen_ms - ms) / chosen_ms,
                              ExtraComplexity(candidate.layout, chosen.layout))
            : absl::StrFormat("%.1f%% slower (%s ms vs %s ms per step)%s",
                              100 * (ms - chosen_ms) / chosen_ms, FormatMs(ms), FormatMs(chosen_ms),
                              candidate.layout.offload
                                  ? ", and needs optimizer offload, which the trainer does not "
                                    "run yet"
                                  : "");
  }
}

// Why the batch does not split into `layout`'s data-parallel ranks and micro-batches; empty when
// it does.
std::string BatchSplitProblem(const Workload& workload, const Layout& layout) {
  if (workload.batch_size % layout.sequences_per_micro_step() == 0) return "";
  return absl::StrCat("batch ", workload.batch_size, " sequences is not a multiple of dp ",
                      layout.dp, " x micro-batch ", layout.micro_batch);
}

// When nothing fits `plan`'s cluster: the plan of the first cluster of 2, 4, 8, ... (up to 256)
// times its nodes that has a recommendation, if any.
std::optional<Plan> SmallestLargerClusterThatFits(const Plan& plan) {
  for (int factor = 2; factor <= 256; factor *= 2) {
    ClusterSpec larger = plan.cluster;
    larger.nodes = plan.cluster.nodes * factor;
    absl::StatusOr<Plan> found = SearchLayouts(plan.workload, larger, plan.options);
    if (found.ok() && found->recommendation() != nullptr) return *std::move(found);
  }
  return std::nullopt;
}

}  // namespace

std::string DescribeLayout(const Layout& layout) {
  std::string out =
      absl::StrCat(StrategyName(layout.strategy), " tp", layout.tp, " pp", layout.pp,
                   layout.dp > 0 ? absl::StrCat(" dp", layout.dp) : "", " mb", layout.micro_batch);
  if (layout.pp > 1) absl::StrAppend(&out, " ", PipelineScheduleName(layout.schedule));
  if (layout.virtual_stages > 1) absl::StrAppend(&out, " v", layout.virtual_stages);
  if (layout.recompute != Recompute::kNone) {
    absl::StrAppend(&out, " recompute=", RecomputeName(layout.recompute));
  }
  if (layout.sequence_parallel) absl::StrAppend(&out, " sp");
  if (layout.offload) absl::StrAppend(&out, " offload");
  return out;
}

absl::Status WhyNoLayout(const Plan& plan) {
  const bool estimated = absl::c_any_of(plan.candidates, [](const Candidate& candidate) {
    return candidate.verdict != Verdict::kInvalid;
  });
  if (estimated) {
    std::string fix = "add nodes or GPUs with more memory";
    if (const std::optional<Plan> larger = SmallestLargerClusterThatFits(plan)) {
      const Candidate& chosen = *larger->recommendation();
      fix = absl::StrFormat(
          "of %d, %d, %d, ... nodes, %d (%d GPUs) are the first that fit it (%s at %.1f GiB "
          "per GPU): plan with cluster.nodes %d, or GPUs with more memory",
          2 * plan.cluster.nodes, 4 * plan.cluster.nodes, 8 * plan.cluster.nodes,
          larger->cluster.nodes, larger->cluster.world_size(), DescribeLayout(chosen.layout),
          chosen.estimate.memory.device_bytes() / kGiB, larger->cluster.nodes);
    }
    // The fastest layout that fits with optimizer offload, if one does (candidates are sorted).
    const auto offloaded = absl::c_find_if(plan.candidates, [](const Candidate& candidate) {
      return candidate.verdict == Verdict::kFits;
    });
    const std::string with_offload =
        offloaded == plan.candidates.end()
            ? ""
            : absl::StrFormat(
                  " (%s fits with optimizer offload, at %.1f GiB, which the trainer does not run "
                  "yet)",
                  DescribeLayout(offloaded->layout),
                  offloaded->estimate.memory.device_bytes() / kGiB);
    return absl::FailedPreconditionError(absl::StrFormat("no layout fits %.1f GiB per GPU%s; %s",
                                                         plan.usable_gib, with_offload, fix));
  }
  // One reason per cause: the batch's, for every data-parallel size that does not divide it, in
  // one line (a large cluster has dozens).
  std::vector<std::string> reasons;
  std::set<int> batch_dps;
  for (const Candidate& candidate : plan.candidates) {
    if (candidate.reason == BatchSplitProblem(plan.workload, candidate.layout)) {
      batch_dps.insert(candidate.layout.dp);
      continue;
    }
    if (absl::c_find(reasons, candidate.reason) == reasons.end()) {
      reasons.push_back(candidate.reason);
    }
  }
  // A huge cluster's tp sizes each give their own reason: the first few say what is wrong.
  constexpr size_t kShownReasons = 5;
  if (reasons.size() > kShownReasons + 1) {
    const size_t more = reasons.size() - kShownReasons;
    reasons.resize(kShownReasons);
    reasons.push_back(absl::StrCat(more, " more of the same kinds"));
  }
  if (!batch_dps.empty()) {
    std::vector<int> shown(batch_dps.begin(), batch_dps.end());
    const size_t more = shown.size() > 5 ? shown.size() - 5 : 0;
    shown.resize(shown.size() - more);
    reasons.push_back(absl::StrCat(
        "batch ", plan.workload.batch_size, " sequences is not a multiple of dp ",
        absl::StrJoin(shown, ", "), more > 0 ? absl::StrCat(" or ", more, " larger") : "",
        shown[0] > plan.workload.batch_size
            ? absl::StrCat(" (each has more data-parallel ranks than the batch has sequences: a "
                           "batch of ",
                           shown[0], " at least)")
            : ""));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no layout splits the model and the batch over ", plan.cluster.world_size(),
                   " GPUs: ", absl::StrJoin(reasons, "; "),
                   "; change cluster.gpus_per_node or cluster.nodes, or train.batch_size"));
}

std::string BatchLimitNote(const Plan& plan) {
  const Candidate* chosen = plan.recommendation();
  if (chosen == nullptr) return "";
  const int batch = plan.workload.batch_size;
  std::set<int> blocked;
  for (const Candidate& candidate : plan.candidates) {
    if (candidate.layout.dp > chosen->layout.dp && batch % candidate.layout.dp != 0) {
      blocked.insert(candidate.layout.dp);
    }
  }
  if (blocked.empty()) return "";
  const int largest = *blocked.rbegin();
  const int below = batch / largest * largest;
  const std::string nearest =
      below > 0 ? absl::StrCat(below, " or ", below + largest) : absl::StrCat(largest);
  return absl::StrCat("train.batch_size ", batch, " does not divide over dp ",
                      absl::StrJoin(blocked, ", "),
                      ", so the layouts with more data-parallel ranks are out; a batch of ",
                      nearest, " sequences (a multiple of ", largest, ") lets them in");
}

const Candidate* ClosestToFitting(const Plan& plan) {
  const Candidate* closest = nullptr;
  for (const Candidate& candidate : plan.candidates) {
    if (candidate.verdict == Verdict::kInvalid) continue;
    if (closest == nullptr ||
        candidate.estimate.memory.device_bytes() < closest->estimate.memory.device_bytes()) {
      closest = &candidate;
    }
  }
  return closest;
}

absl::Status CheckLayout(const Workload& workload, const ClusterSpec& cluster,
                         const Layout& layout) {
  const ModelConfig& model = workload.model;
  const auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (layout.world_size() != cluster.world_size()) {
    return invalid("tp ", layout.tp, " x pp ", layout.pp, " x dp ", layout.dp, " = ",
                   layout.world_size(), " ranks, but the cluster has ", cluster.world_size());
  }
  if (cluster.gpus_per_node % layout.tp != 0) {
    return invalid("tp ", layout.tp, " does not divide the ", cluster.gpus_per_node,
                   " GPUs of a node (tensor parallelism stays inside a node)");
  }
  // The model's own rule: heads and d_ff split, kv heads split or are replicated.
  RETURN_IF_ERROR(CheckTensorParallel(model, layout.tp));
  // Stages need not hold equal numbers of blocks (the trainer balances them by FLOPs,
  // AssignStages), only one block a model chunk at least.
  if (layout.pp * layout.virtual_stages > model.n_layer) {
    return invalid("pp ", layout.pp, " x ", layout.virtual_stages, " model chunks exceed the ",
                   model.n_layer, " layers");
  }
  // Interleaved chunks are equal, as the trainer's recipe requires (parallel.pp_virtual_stages).
  if (layout.virtual_stages > 1 && model.n_layer % (layout.pp * layout.virtual_stages) != 0) {
    return invalid("pp ", layout.pp, " x ", layout.virtual_stages,
                   " interleaved model chunks do not divide the ", model.n_layer, " layers evenly");
  }
  if (const std::string problem = BatchSplitProblem(workload, layout); !problem.empty()) {
    return invalid(problem);
  }
  if (layout.sequence_parallel && (layout.tp == 1 || workload.seq_len % layout.tp != 0)) {
    return invalid("sequence parallelism needs tp > 1 dividing the sequence length");
  }
  if (layout.offload && layout.strategy == Strategy::kDdp) {
    return invalid("offload needs a sharded optimizer (zero1, zero2, zero3 or fsdp)");
  }
  return absl::OkStatus();
}

absl::StatusOr<Plan> SearchLayouts(const Workload& workload, const ClusterSpec& cluster,
                                   const SearchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckWorkload(workload, cluster));
  Plan plan{.workload = workload, .cluster = cluster, .options = options};
  plan.usable_gib = cluster.gpu_memory_gib * (1 - options.memory_margin);
  const int world = cluster.world_size();
  const int max_tp = options.max_tp > 0 ? options.max_tp : cluster.gpus_per_node;
  const int max_pp = options.max_pp > 0 ? options.max_pp : workload.model.n_layer;
  StepBufferMemo memo;
  for (int tp = 1; tp <= std::min(max_tp, cluster.gpus_per_node); ++tp) {
    if (cluster.gpus_per_node % tp != 0 || world % tp != 0) continue;
    for (int pp = 1; pp <= std::min(max_pp, world / tp); ++pp) {
      if ((world / tp) % pp != 0) continue;
      const int dp = world / (tp * pp);
      // Without a pipeline the schedule means nothing: one candidate, the default's.
      const std::vector<PipelineSchedule> schedules =
          pp > 1 ? options.pp_schedules : std::vector<PipelineSchedule>{Layout().schedule};
      for (PipelineSchedule schedule : schedules) {
        Layout shape{.tp = tp,
                     .pp = pp,
                     .dp = dp,
                     .schedule = schedule,
                     .virtual_stages =
                         schedule == PipelineSchedule::kInterleaved ? options.pp_virtual_stages : 1,
                     // Where tp divides the sequence (its rows split over the group); plain
                     // tensor parallelism otherwise, as Megatron-LM without --sequence-parallel.
                     .sequence_parallel =
                         tp > 1 && options.allow_sequence_parallel && workload.seq_len % tp == 0};
        if (absl::Status status = CheckLayout(workload, cluster, shape); !status.ok()) {
          plan.candidates.push_back({.layout = shape, .reason = std::string(status.message())});
          continue;
        }
        for (Strategy strategy : options.strategies) {
          for (int micro_batch : MicroBatches(workload.batch_size / dp)) {
            for (Recompute recompute : options.recompute) {
              for (bool offload : {false, true}) {
                if (offload && (!options.allow_offload || strategy == Strategy::kDdp)) continue;
                Layout layout = shape;
                layout.strategy = strategy;
                layout.micro_batch = micro_batch;
                layout.recompute = recompute;
                layout.offload = offload;
                Candidate candidate{.layout = layout,
                                    .estimate = EstimateLayout(workload, cluster, layout,
                                                               options.assumptions, &memo),
                                    .verdict = Verdict::kFits};
                const double gib = candidate.estimate.memory.device_bytes() / kGiB;
                if (gib > plan.usable_gib) {
                  candidate.verdict = Verdict::kOverMemory;
                  candidate.reason = absl::StrFormat(
                      "%s: %.1f GiB > %.1f GiB usable per GPU (%.1f GiB less %.0f%% margin)",
                      StrategyName(strategy), gib, plan.usable_gib, cluster.gpu_memory_gib,
                      100 * options.memory_margin);
                }
                plan.candidates.push_back(std::move(candidate));
              }
            }
          }
        }
      }
    }
  }
  Rank(plan);
  plan.search_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace dtrain
