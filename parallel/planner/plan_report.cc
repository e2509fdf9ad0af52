#include "parallel/planner/plan_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "parallel/pipeline/stage_assignment.h"

namespace dtrain {
namespace {

absl::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kRecommended:
      return "recommended";
    case Verdict::kFits:
      return "fits";
    case Verdict::kOverMemory:
      return "over memory";
    case Verdict::kInvalid:
      return "invalid";
  }
  return "?";
}

// What a GPU sends over its links in a step, as the trainer's step log counts it (a ring
// all-reduce of B bytes over n ranks sends 2 (n - 1) / n B).
double CommSentGb(const Estimate& estimate) {
  return (estimate.dp.sent_bytes + estimate.tp.sent_bytes + estimate.pp.sent_bytes) / 1e9;
}

double ExposedCommMs(const Estimate& estimate) {
  return estimate.dp.exposed_ms + estimate.tp.exposed_ms + estimate.pp.exposed_ms;
}

// The peak the GEMMs of `matmul` run at, named: "989 TFLOP/s bf16".
std::string GemmPeak(const ClusterSpec& c, MatmulPrecision matmul) {
  return absl::StrFormat("%.3g TFLOP/s %s", c.GemmPeakTflops(matmul),
                         matmul == MatmulPrecision::kHighest ? "float32"
                         : matmul == MatmulPrecision::kHigh  ? "TF32"
                                                             : "bf16");
}

std::string ClusterLine(const ClusterSpec& c, MatmulPrecision matmul) {
  std::string line = absl::StrFormat(
      "%d node%s x %d %s (%.1f GiB at %.0f GB/s, %s); %s %.0f GB/s busbw inside a node", c.nodes,
      c.nodes == 1 ? "" : "s", c.gpus_per_node, c.gpu_name, c.gpu_memory_gib, c.memory_gbps,
      GemmPeak(c, matmul), c.intra_name, c.intra_gbps);
  if (c.nodes > 1) {
    absl::StrAppendFormat(&line, "; %s %.1f GB/s x %d NICs per node", c.network_name, c.nic_gbps,
                          c.nics_per_node);
  }
  return line;
}

std::string TableRow(const Candidate& c) {
  const Layout& l = c.layout;
  if (c.verdict == Verdict::kInvalid) {
    return absl::StrFormat("  %-8s %3d %3d %5d %3s %-9s %-7s %8s %8s %10s %9s %6s  %s\n", "-", l.tp,
                           l.pp, l.dp, "-", "-", "-", "-", "-", "-", "-", "-", c.reason);
  }
  const Estimate& e = c.estimate;
  return absl::StrFormat("  %-8s %3d %3d %5d %3d %-9s %-7s %8.1f %8.2f %10s %9s %6.1f  %s\n",
                         StrategyName(l.strategy), l.tp, l.pp, l.dp, l.micro_batch,
                         RecomputeName(l.recompute), l.offload ? "yes" : "no",
                         e.memory.device_bytes() / kGiB, CommSentGb(e), FormatMs(ExposedCommMs(e)),
                         FormatMs(e.time.step_ms), 100 * e.time.mfu, c.reason);
}

nlohmann::json TrafficJson(const Traffic& traffic) {
  return {{"payload_gb", traffic.payload_bytes / 1e9},
          {"sent_gb", traffic.sent_bytes / 1e9},
          {"time_ms", traffic.time_ms},
          {"exposed_ms", traffic.exposed_ms}};
}

nlohmann::json CandidateJson(const Candidate& c) {
  const Layout& l = c.layout;
  nlohmann::json out = {{"strategy", StrategyName(l.strategy)},
                        {"tp", l.tp},
                        {"pp", l.pp},
                        {"dp", l.dp},
                        {"micro_batch", l.micro_batch},
                        {"recompute", RecomputeName(l.recompute)},
                        {"sequence_parallel", l.sequence_parallel},
                        {"offload", l.offload},
                        {"verdict", VerdictName(c.verdict)},
                        {"reason", c.reason}};
  if (l.pp > 1) out["pp_schedule"] = PipelineScheduleName(l.schedule);
  if (l.virtual_stages > 1) out["pp_virtual_stages"] = l.virtual_stages;
  if (c.verdict == Verdict::kInvalid) return out;
  const Estimate& e = c.estimate;
  const MemoryEstimate& m = e.memory;
  out["memory_gib"] = {
      {"params", m.param_bytes / kGiB},        {"grads", m.grad_bytes / kGiB},
      {"optimizer", m.optimizer_bytes / kGiB}, {"activations", m.activation_bytes / kGiB},
      {"temporary", m.temporary_bytes / kGiB}, {"runtime", m.runtime_bytes / kGiB},
      {"total", m.device_bytes() / kGiB},      {"host", m.host_bytes / kGiB}};
  out["communication"] = {
      {"dp", TrafficJson(e.dp)}, {"tp", TrafficJson(e.tp)}, {"pp", TrafficJson(e.pp)}};
  out["time"] = {
      {"compute_ms", e.time.compute_ms},     {"bubble_ms", e.time.bubble_ms},
      {"optimizer_ms", e.time.optimizer_ms}, {"offload_ms", e.time.offload_ms},
      {"exposed_comm_ms", ExposedCommMs(e)}, {"step_ms", e.time.step_ms},
      {"mfu_pct", 100 * e.time.mfu},         {"compute_pct", 100 * e.time.compute_fraction},
      {"tokens_per_s", e.time.tokens_per_s}};
  out["micro_batches"] = e.micro_batches;
  return out;
}

std::string AssumptionsLine(const Plan& plan) {
  const CostAssumptions& a = plan.options.assumptions;
  const Precision& p = plan.workload.precision;
  return absl::StrFormat(
      "bytes a value: parameters %g, gradients %g, activations %g, optimizer state %g (under "
      "zero3 and fsdp its float32 master shard is counted as the parameters), gradients reduced "
      "%g, parameters gathered %g; GEMMs at %.0f%% of the %s peak "
      "(half that at width %.0f), at least %g us a kernel (%g a block per micro-batch), the "
      "optimizer step at %.0f%% of the memory bandwidth (%g bytes "
      "a parameter), %s pipeline schedule, DP communication overlapped with "
      "backward except the last bucket, TP not overlapped; the engine's buffers in buckets of %g "
      "MiB (zero3 units of %g MiB, fsdp's a block); %.0f%% of GPU memory kept free; a "
      "simpler layout within %.0f%% or %g ms a step of the fastest is preferred",
      p.param_bytes, p.grad_bytes, p.activation_bytes, p.optimizer_bytes, p.reduce_bytes,
      p.gather_bytes, 100 * a.gemm_peak_fraction, GemmPeak(plan.cluster, plan.workload.matmul),
      a.gemm_half_efficiency_width, a.kernel_launch_us, a.kernels_per_block,
      100 * a.memory_bandwidth_fraction, p.OptimizerStepBytes(),
      absl::StrJoin(plan.options.pp_schedules, " or ",
                    [&plan](std::string* out, PipelineSchedule schedule) {
                      absl::StrAppend(out, PipelineScheduleName(schedule));
                      if (schedule == PipelineSchedule::kInterleaved) {
                        const int v = plan.options.pp_virtual_stages;
                        absl::StrAppend(out, " (", v, v == 1 ? " model chunk" : " model chunks",
                                        " per stage)");
                      }
                    }),
      a.bucket_mib, a.prefetch_bucket_mib, 100 * plan.options.memory_margin,
      100 * plan.options.simpler_within, plan.options.simpler_within_ms);
}

int CountInvalid(const Plan& plan) {
  return static_cast<int>(
      std::count_if(plan.candidates.begin(), plan.candidates.end(),
                    [](const Candidate& c) { return c.verdict == Verdict::kInvalid; }));
}

// The layout the search lists for `layout`: itself, or where the planner does not search zero3 (by
// default), fsdp's of the same layout, which shards alike at the same cost.
Layout SearchedLayout(const Plan& plan, Layout layout) {
  if (layout.strategy == Strategy::kZero3 &&
      !absl::c_linear_search(plan.options.strategies, Strategy::kZero3)) {
    layout.strategy = Strategy::kFsdp;
  }
  return layout;
}

// Why the plan has no candidate of `layout` (SearchedLayout's): the trainer would refuse it, or
// the search does not try it.
std::string WhyNotSearched(const Plan& plan, const Layout& recipe_layout) {
  const Layout layout = SearchedLayout(plan, recipe_layout);
  if (layout.dp == 0) {
    return absl::StrFormat(
        "parallel.tp x parallel.pp = %d does not divide the cluster's %d GPUs, which the trainer "
        "refuses",
        layout.tp * layout.pp, plan.cluster.world_size());
  }
  if (plan.workload.batch_size % layout.sequences_per_micro_step() != 0) {
    return absl::StrFormat(
        "train.batch_size %d is not a multiple of dp %d x train.micro_batch %d, which the "
        "trainer refuses",
        plan.workload.batch_size, layout.dp, layout.micro_batch);
  }
  if (const absl::Status status = CheckLayout(plan.workload, plan.cluster, layout); !status.ok()) {
    return std::string(status.message());
  }
  if (!absl::c_linear_search(plan.options.strategies, layout.strategy)) {
    return absl::StrCat(StrategyName(recipe_layout.strategy),
                        layout.strategy == recipe_layout.strategy ? "" : " (listed as fsdp)",
                        " is not among the strategies the planner searches");
  }
  return "not among the layouts the planner searches (micro-batches of powers of two up to 64; "
         "sequence parallelism wherever tp divides train.seq_len)";
}

// The candidate of plan.recipe_layout (SearchedLayout's); nullptr when the plan has none or did
// not search it.
const Candidate* RecipeCandidate(const Plan& plan) {
  if (!plan.recipe_layout) return nullptr;
  const Layout layout = SearchedLayout(plan, *plan.recipe_layout);
  const auto own = absl::c_find_if(
      plan.candidates, [&](const Candidate& candidate) { return candidate.layout == layout; });
  return own == plan.candidates.end() ? nullptr : &*own;
}

// Where the recipe's zero3 is shown as fsdp (RecipeCandidate), a line that says so.
std::string ListedAsFsdp(const Plan& plan, const Candidate& own) {
  return own.layout.strategy == plan.recipe_layout->strategy
             ? ""
             : "zero3 shards as fsdp does and costs the same, so the planner lists it as fsdp";
}

}  // namespace

std::vector<const Candidate*> Alternatives(const Plan& plan, int top_n) {
  std::vector<const Candidate*> shown;
  const auto add = [&](const Candidate* candidate) {
    if (candidate == nullptr || static_cast<int>(shown.size()) >= top_n) return;
    if (candidate == plan.recommendation()) return;
    if (std::find(shown.begin(), shown.end(), candidate) != shown.end()) return;
    shown.push_back(candidate);
  };
  // Per strategy: its fastest fitting layout, or the one closest to fitting.
  for (Strategy strategy : plan.options.strategies) {
    const Candidate* best = nullptr;
    const Candidate* closest = nullptr;
    for (const Candidate& c : plan.candidates) {
      if (c.verdict == Verdict::kInvalid || c.layout.strategy != strategy) continue;
      if (c.verdict != Verdict::kOverMemory && best == nullptr) best = &c;  // sorted by time
      if (closest == nullptr ||
          c.estimate.memory.device_bytes() < closest->estimate.memory.device_bytes()) {
        closest = &c;
      }
    }
    add(best != nullptr ? best : closest);
  }
  // Why not plain data parallelism: per strategy whose tp1 pp1 layouts all exceed memory, the
  // one closest to fitting.
  for (Strategy strategy : plan.options.strategies) {
    const Candidate* closest = nullptr;
    bool one_fits = false;
    for (const Candidate& c : plan.candidates) {
      if (c.verdict == Verdict::kInvalid || c.layout.strategy != strategy || c.layout.tp != 1 ||
          c.layout.pp != 1) {
        continue;
      }
      one_fits |= c.verdict != Verdict::kOverMemory;
      if (closest == nullptr ||
          c.estimate.memory.device_bytes() < closest->estimate.memory.device_bytes()) {
        closest = &c;
      }
    }
    if (!one_fits) add(closest);
  }
  // Then the fastest of each remaining shape; micro-batch sizes alone do not make a new row.
  const auto same_shape = [](const Layout& a, const Layout& b) {
    return a.strategy == b.strategy && a.tp == b.tp && a.pp == b.pp && a.recompute == b.recompute &&
           a.offload == b.offload;
  };
  const auto seen = [&](const Layout& layout) {
    return (plan.recommendation() != nullptr &&
            same_shape(layout, plan.recommendation()->layout)) ||
           std::any_of(shown.begin(), shown.end(),
                       [&](const Candidate* s) { return same_shape(layout, s->layout); });
  };
  for (const Candidate& c : plan.candidates) {
    if (c.verdict == Verdict::kFits && !seen(c.layout)) add(&c);
  }
  // A shape over memory shows its smallest variant: how far it is from fitting.
  for (const Candidate& c : plan.candidates) {
    if (c.verdict != Verdict::kOverMemory || seen(c.layout)) continue;
    const Candidate* smallest = &c;
    for (const Candidate& other : plan.candidates) {
      if (other.verdict == Verdict::kOverMemory && same_shape(other.layout, c.layout) &&
          other.estimate.memory.device_bytes() < smallest->estimate.memory.device_bytes()) {
        smallest = &other;
      }
    }
    add(smallest);
  }
  return shown;
}

std::vector<std::pair<std::string, std::string>> NetworkEnvironment(const ClusterSpec& cluster) {
  std::vector<std::pair<std::string, std::string>> env;
  if (cluster.nodes == 1) return env;  // the links inside a node need no settings
  // NCCL environment variables (REFERENCES.md 7; NCCL's environment documentation).
  switch (cluster.network_transport) {
    case Transport::kInfiniband:
    case Transport::kRoce:
      env.push_back({"NCCL_SOCKET_IFNAME=^lo,docker0",
                     "bootstrap over any interface but loopback and docker"});
      env.push_back({"NCCL_IB_HCA=mlx5",
                     "every mlx5 adapter; pin the GPU-near ones, e.g. mlx5_0:1,mlx5_1:1 "
                     "(ibv_devinfo)"});
      if (cluster.network_transport == Transport::kRoce) {
        env.push_back({"NCCL_IB_GID_INDEX=3", "the RoCE v2 GID on most hosts (show_gids)"});
      }
      env.push_back({"NCCL_IB_TIMEOUT=22",
                     "4.096 us x 2^22 = 17 s per retry: rides out link "
                     "flaps on large fabrics"});
      break;
    default:
      env.push_back({"NCCL_IB_DISABLE=1", "TCP sockets: no RDMA on this network"});
      env.push_back({"NCCL_SOCKET_IFNAME==eth0",
                     "the fast interface, exactly (ip -br link); never the management one"});
      env.push_back({"NCCL_SOCKET_NTHREADS=4", "4 threads x 4 sockets fill a 100 GbE link"});
      env.push_back({"NCCL_NSOCKS_PERTHREAD=4", ""});
      break;
  }
  env.push_back({"NCCL_DEBUG=WARN",
                 "INFO (with NCCL_DEBUG_SUBSYS=INIT,NET) to see the chosen "
                 "transport"});
  return env;
}

double CollectiveTimeoutS(double step_ms) {
  // Long enough for the slowest wait of a healthy run, never below the usual 10 minutes: a
  // collective waits for the ranks' skew, at most about a step (the first step's warm-up, a
  // pipeline's fill), and three steps' worth covers that with a checkpoint's skew besides. A
  // longer timeout only leaves a hang unnoticed longer.
  return std::max(600.0, std::ceil(3 * step_ms / 1e3 / 60) * 60);
}

std::vector<std::pair<std::string, std::string>> LayoutSettings(const Layout& layout) {
  std::vector<std::pair<std::string, std::string>> settings = {
      {"parallel.strategy", std::string(StrategyName(layout.strategy))},
      {"parallel.tp", absl::StrCat(layout.tp)},
      {"parallel.pp", absl::StrCat(layout.pp)}};
  if (layout.pp > 1) {
    settings.emplace_back("parallel.pp_schedule", PipelineScheduleName(layout.schedule));
  }
  if (layout.virtual_stages > 1) {
    settings.emplace_back("parallel.pp_virtual_stages", absl::StrCat(layout.virtual_stages));
  }
  settings.emplace_back("parallel.recompute", RecomputeName(layout.recompute));
  if (layout.sequence_parallel) settings.emplace_back("parallel.sequence_parallel", "true");
  settings.emplace_back("train.micro_batch", absl::StrCat(layout.micro_batch));
  return settings;
}

std::vector<std::pair<std::string, std::string>> PlanSettings(const Layout& layout,
                                                              double timeout_s) {
  // The plan is for the cluster's GPUs (the shipped recipes run on the CPU).
  std::vector<std::pair<std::string, std::string>> settings = {{"run.device", "cuda"}};
  bool in_parallel = false;
  for (auto& [key, value] : LayoutSettings(layout)) {
    const bool parallel = absl::StartsWith(key, "parallel.");
    if (in_parallel && !parallel) {
      settings.emplace_back("parallel.timeout_s", absl::StrFormat("%.0f", timeout_s));
    }
    in_parallel = parallel;
    settings.emplace_back(std::move(key), std::move(value));
  }
  return settings;
}

std::string RecipeLines(const Layout& layout, double timeout_s) {
  std::string out, section;
  for (const auto& [key, value] : PlanSettings(layout, timeout_s)) {
    const size_t dot = key.find('.');
    if (key.substr(0, dot) != section) {
      section = key.substr(0, dot);
      absl::StrAppend(&out, section, ":\n");
    }
    absl::StrAppend(&out, "  ", key.substr(dot + 1), ": ", value, "\n");
  }
  return out;
}

std::string PipelineStagesLine(const Workload& workload, const Layout& layout) {
  const absl::StatusOr<StageAssignment> assignment = AssignStages(
      PipelineFlopsPerToken(workload.model, workload.seq_len, layout.recompute), layout.pp, 1);
  if (!assignment.ok()) return std::string(assignment.status().message());
  double heaviest = 0, total = 0;
  for (int stage = 0; stage < layout.pp; ++stage) {
    heaviest = std::max(heaviest, assignment->StageCost(stage));
    total += assignment->StageCost(stage);
  }
  return absl::StrFormat("%s; heaviest stage %.2f GFLOP per token, %.1f%% above the mean",
                         FormatStageAssignment(*assignment), heaviest / 1e9,
                         100 * (heaviest * layout.pp / total - 1));
}

std::string SbatchLines(const ClusterSpec& cluster, const std::string& recipe_path,
                        const Layout& layout, double timeout_s) {
  // SIGTERM 120 s before the time limit (a checkpoint) and back in the queue when preempted, as
  // scripts/slurm/train.sbatch; one failed rank ends the step.
  std::string out = absl::StrFormat(
      "#!/bin/bash\n#SBATCH --nodes=%d\n#SBATCH --ntasks-per-node=%d\n#SBATCH --gpus-per-node=%d\n"
      "#SBATCH --signal=TERM@120\n#SBATCH --requeue\n",
      cluster.nodes, cluster.gpus_per_node, cluster.gpus_per_node);
  if (cluster.nodes > 1) {
    absl::StrAppend(&out,
                    "export DTRAIN_RDZV_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')\n");
  }
  for (const auto& [setting, why] : NetworkEnvironment(cluster)) {
    absl::StrAppend(&out, "export ", setting, "\n");
  }
  absl::StrAppend(&out, "srun --kill-on-bad-exit=1 dtrain train ", recipe_path, " \\\n ");
  for (const auto& [key, value] : PlanSettings(layout, timeout_s)) {
    absl::StrAppend(&out, " --set ", key, "=", value);
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string PlanText(const Plan& plan, const std::string& recipe_path, int top_n) {
  const Workload& w = plan.workload;
  const ModelConfig& model = w.model;
  std::string out = absl::StrFormat("dtrain plan: %s\n", recipe_path);
  absl::StrAppendFormat(&out, "  model    %s\n", ModelShapeLine(model));
  absl::StrAppendFormat(&out, "  batch    %d sequence%s x %d tokens = %d tokens per step\n",
                        w.batch_size, w.batch_size == 1 ? "" : "s", w.seq_len,
                        int64_t{w.batch_size} * w.seq_len);
  absl::StrAppendFormat(&out, "  cluster  %s\n", ClusterLine(plan.cluster, plan.workload.matmul));
  if (const GpuSpec* gpu = FindGpu(plan.cluster.gpu_name); gpu != nullptr && !gpu->cuda) {
    absl::StrAppendFormat(&out,
                          "  note     dtrain trains on NVIDIA GPUs (CUDA, NCCL): the %s is planned "
                          "to compare, and the lines below are for CUDA\n",
                          gpu->description);
  }
  out += "\n";

  const Candidate* chosen = plan.recommendation();
  if (chosen == nullptr) {
    absl::StrAppendFormat(&out, "Nothing to recommend: %s.\n", WhyNoLayout(plan).message());
  } else {
    const Estimate& e = chosen->estimate;
    const MemoryEstimate& m = e.memory;
    const TimeEstimate& t = e.time;
    absl::StrAppendFormat(&out, "Recommended: %s\n  why      %s\n", DescribeLayout(chosen->layout),
                          chosen->reason);
    absl::StrAppendFormat(
        &out,
        "  memory   %.1f GiB of %.1f GiB usable per GPU: params %.1f, grads %.1f, optimizer "
        "%.1f, activations %.1f, temporary %.1f, runtime %.1f GiB; host %.1f GiB\n",
        m.device_bytes() / kGiB, plan.usable_gib, m.param_bytes / kGiB, m.grad_bytes / kGiB,
        m.optimizer_bytes / kGiB, m.activation_bytes / kGiB, m.temporary_bytes / kGiB,
        m.runtime_bytes / kGiB, m.host_bytes / kGiB);
    absl::StrAppendFormat(
        &out,
        "  traffic  sent per GPU per step: DP %.2f GB in %s ms (%s ms exposed), TP %.2f GB in "
        "%s ms, PP %.3f GB in %s ms (%s ms exposed); %d micro-batches\n",
        e.dp.sent_bytes / 1e9, FormatMs(e.dp.time_ms), FormatMs(e.dp.exposed_ms),
        e.tp.sent_bytes / 1e9, FormatMs(e.tp.time_ms), e.pp.sent_bytes / 1e9,
        FormatMs(e.pp.time_ms), FormatMs(e.pp.exposed_ms), e.micro_batches);
    absl::StrAppendFormat(
        &out,
        "  time     step %s ms = compute %s + bubble %s + exposed DP %s + TP %s + PP %s + "
        "optimizer %s + offload %s ms\n",
        FormatMs(t.step_ms), FormatMs(t.compute_ms), FormatMs(t.bubble_ms),
        FormatMs(e.dp.exposed_ms), FormatMs(e.tp.exposed_ms), FormatMs(e.pp.exposed_ms),
        FormatMs(t.optimizer_ms), FormatMs(t.offload_ms));
    absl::StrAppendFormat(&out,
                          "  speed    MFU %.1f%%, computing %.1f%% of the time, %.0f tokens/s\n",
                          100 * t.mfu, 100 * t.compute_fraction, t.tokens_per_s);
    if (chosen->layout.pp > 1) {
      absl::StrAppendFormat(&out, "  stages   %s\n", PipelineStagesLine(w, chosen->layout));
    }
    if (const std::string note = BatchLimitNote(plan); !note.empty()) {
      absl::StrAppendFormat(&out, "  note     %s\n", note);
    }
    if (t.compute_fraction < 0.5) {
      // The largest part of the rest, and what shrinks it: a larger batch shares each step's
      // reductions and fills the pipeline; tp and pp traffic grow with the tokens alone, and the
      // layout is already the fastest.
      const std::string batch_fix = absl::StrFormat(
          "%d sequences per step are too few for %d GPUs to hide it; raise train.batch_size%s",
          w.batch_size, plan.cluster.world_size(),
          plan.cluster.nodes > 1 ? " or plan fewer cluster.nodes" : "");
      const std::string link_fix =
          "it grows with the tokens, not the batch: only a faster link between the GPUs shrinks it";
      const std::tuple<double, const char*, std::string> parts[] = {
          {t.bubble_ms, "the pipeline bubble", batch_fix},
          {e.dp.exposed_ms, "exposed DP traffic", batch_fix},
          {e.tp.exposed_ms, "TP traffic", link_fix},
          {e.pp.exposed_ms, "exposed PP traffic", link_fix}};
      const auto& [part_ms, part, fix] = *std::max_element(
          std::begin(parts), std::end(parts),
          [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
      absl::StrAppendFormat(&out,
                            "  note     the GPUs compute only %.0f%% of the time, %s most of the "
                            "rest (%s ms): %s\n",
                            100 * t.compute_fraction, part, FormatMs(part_ms), fix);
    }
  }

  absl::StrAppend(&out,
                  "\nAlternatives (per GPU; comm = bytes it sends per step):\n"
                  "  strategy  tp  pp    dp  mb recompute offload  mem GiB  comm GB exposed ms"
                  "   step ms  MFU %  verdict\n");
  if (chosen != nullptr) absl::StrAppend(&out, TableRow(*chosen));
  for (const Candidate* c : Alternatives(plan, top_n)) absl::StrAppend(&out, TableRow(*c));
  if (plan.recipe_layout) {
    absl::StrAppend(&out, "The recipe's own layout (parallel.*, train.micro_batch):\n");
    const Candidate* own = RecipeCandidate(plan);
    if (own == nullptr) {
      absl::StrAppend(&out, "  ", DescribeLayout(*plan.recipe_layout), ": ",
                      WhyNotSearched(plan, *plan.recipe_layout), "\n");
    } else if (const std::string note = ListedAsFsdp(plan, *own); !note.empty()) {
      absl::StrAppend(&out, "  ", note, ":\n", TableRow(*own));
    } else {
      absl::StrAppend(&out, TableRow(*own));
    }
  }

  if (chosen != nullptr) {
    absl::StrAppendFormat(&out, "\nNetwork environment (%s):\n",
                          plan.cluster.nodes == 1 ? "one node: its GPUs' own links need no settings"
                                                  : plan.cluster.network_name);
    for (const auto& [setting, why] : NetworkEnvironment(plan.cluster)) {
      absl::StrAppendFormat(&out, "  export %-32s%s%s\n", setting, why.empty() ? "" : "# ", why);
    }
    const double timeout_s = CollectiveTimeoutS(chosen->estimate.time.step_ms);
    absl::StrAppendFormat(&out,
                          "  collective timeout: parallel.timeout_s: %.0f (PyTorch: "
                          "init_process_group(timeout=...))\n",
                          timeout_s);
    absl::StrAppendFormat(&out, "\nRecipe lines:\n%s\nsbatch lines:\n%s",
                          RecipeLines(chosen->layout, timeout_s),
                          SbatchLines(plan.cluster, recipe_path, chosen->layout, timeout_s));
  }
  absl::StrAppendFormat(&out, "\nAssumptions: %s.\nSearched %d layouts (%d invalid) in %.2f ms.\n",
                        AssumptionsLine(plan), static_cast<int>(plan.candidates.size()),
                        CountInvalid(plan), plan.search_ms);
  return out;
}

nlohmann::json PlanJson(const Plan& plan, const std::string& recipe_path, int top_n) {
  const Workload& w = plan.workload;
  const ClusterSpec& c = plan.cluster;
  nlohmann::json out;
  out["recipe"] = recipe_path;
  out["model"] = {{"family", FamilyName(w.model.family)},
                  {"parameters", w.model.num_parameters()},
                  {"n_layer", w.model.n_layer},
                  {"d_model", w.model.d_model},
                  {"n_head", w.model.n_head}};
  out["batch"] = {{"sequences", w.batch_size},
                  {"seq_len", w.seq_len},
                  {"tokens", int64_t{w.batch_size} * w.seq_len}};
  out["cluster"] = {{"nodes", c.nodes},
                    {"gpus_per_node", c.gpus_per_node},
                    {"gpu", c.gpu_name},
                    {"gpu_memory_gib", c.gpu_memory_gib},
                    {"usable_gib", plan.usable_gib},
                    {"peak_tflops", c.peak_tflops},
                    {"gemm_peak_tflops", c.GemmPeakTflops(w.matmul)},
                    {"matmul_precision", MatmulPrecisionName(w.matmul)},
                    {"memory_gbps", c.memory_gbps},
                    {"intra_link", c.intra_name},
                    {"intra_gbps", c.intra_gbps},
                    {"intra_latency_us", c.intra_latency_us},
                    {"network", c.network_name},
                    {"nic_gbps", c.nic_gbps},
                    {"nics_per_node", c.nics_per_node},
                    {"inter_latency_us", c.inter_latency_us}};
  const Candidate* chosen = plan.recommendation();
  out["recommended"] = chosen == nullptr ? nlohmann::json() : CandidateJson(*chosen);
  if (const std::string note = BatchLimitNote(plan); !note.empty()) out["batch_note"] = note;
  if (chosen == nullptr) out["nothing_fits"] = std::string(WhyNoLayout(plan).message());
  out["alternatives"] = nlohmann::json::array();
  for (const Candidate* alternative : Alternatives(plan, top_n)) {
    out["alternatives"].push_back(CandidateJson(*alternative));
  }
  if (const Candidate* own = RecipeCandidate(plan)) {
    out["recipe_layout"] = CandidateJson(*own);
    if (const std::string note = ListedAsFsdp(plan, *own); !note.empty()) {
      out["recipe_layout"]["note"] = note;
    }
  } else if (plan.recipe_layout) {
    out["recipe_layout"] = {{"layout", DescribeLayout(*plan.recipe_layout)},
                            {"reason", WhyNotSearched(plan, *plan.recipe_layout)}};
  }
  if (chosen != nullptr) {
    nlohmann::json env = nlohmann::json::object();
    for (const auto& [setting, why] : NetworkEnvironment(c)) {
      const size_t equals = setting.find('=');
      env[setting.substr(0, equals)] = setting.substr(equals + 1);
    }
    out["network_env"] = env;
    const double timeout_s = CollectiveTimeoutS(chosen->estimate.time.step_ms);
    out["collective_timeout_s"] = timeout_s;
    out["recipe_lines"] = RecipeLines(chosen->layout, timeout_s);
    out["sbatch_lines"] = SbatchLines(c, recipe_path, chosen->layout, timeout_s);
    if (chosen->layout.pp > 1) out["pipeline_stages"] = PipelineStagesLine(w, chosen->layout);
  }
  out["assumptions"] = AssumptionsLine(plan);
  out["search"] = {{"layouts", plan.candidates.size()},
                   {"invalid", CountInvalid(plan)},
                   {"search_ms", plan.search_ms}};
  return out;
}

nlohmann::json CatalogJson() {
  nlohmann::json gpus = nlohmann::json::array(), links = nlohmann::json::array();
  for (const GpuSpec& gpu : GpuCatalog()) {
    gpus.push_back({{"name", gpu.name},
                    {"description", gpu.description},
                    {"bf16_tflops", gpu.peak_tflops},
                    {"tf32_tflops", gpu.tf32_tflops},
                    {"fp32_tflops", gpu.fp32_tflops},
                    {"memory_gib", gpu.memory_gib},
                    {"memory_gbps", gpu.memory_gbps},
                    {"intra_link", gpu.intra_link},
                    {"host_gbps", gpu.host_gbps},
                    {"dtrain_runs", gpu.cuda}});
  }
  for (const LinkSpec& link : LinkCatalog()) {
    links.push_back({{"name", link.name},
                     {"description", link.description},
                     {"transport", TransportName(link.transport)},
                     {"busbw_gbps", link.busbw_gbps},
                     {"latency_us", link.latency_us}});
  }
  return {{"gpus", gpus}, {"links", links}};
}

}  // namespace dtrain
