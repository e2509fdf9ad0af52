// A decoder-only transformer (GPT-2 or Llama family) with hand-written forward and backward,
// one function pair per layer. Parameters and gradients belong to a BlockParameters (laid out
// by the ParamTable), which the model asks for region by region; activations live in one arena
// sized for the largest micro-batch, with one slot per micro-batch in flight. The model may be
// one pipeline stage: StageForward and StageBackward run its part of a micro-batch.
//
// Not thread-safe: one step at a time. The kernels it calls may use the backend's threads.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/block_parameters.h"
#include "core/model/model_config.h"
#include "core/model/param_table.h"
#include "core/model/recompute.h"
#include "core/model/tensor_parallel.h"

namespace dtrain {

class Transformer {
 public:
  // Sizes the activation arena for micro-batches of up to max_batch x max_time tokens, keeping
  // what `recompute` says:
  // - kNone: every block's activations below.
  // - kSelective: every block's, except the attention core's output (N, H*D) and log-sum-exp
  //   (B, H, T), which live in one pair shared by all blocks; backward re-runs the core
  //   (scores, softmax, times V) from the block's saved qkv before the output projection's
  //   backward. The attention kernel never keeps the (B, H, T, T) probabilities in any mode
  //   (its backward recomputes them from the log-sum-exp), so this is what selective drops:
  //   (n_layer - 1) x (N*H*D values + B*H*T floats), for one attention forward per block.
  // - kFull: only each block's input; backward re-runs the block's forward.
  // The gradients are bit-identical in every mode: the same kernels recompute the same values.
  // `table` describes the layout `parameters` holds, and its LocalDims the sizes this rank
  // computes with. `tensor_parallel` communicates over the table's tensor-parallel group (null:
  // tp = 1). All of them must outlive the model.
  //
  // `sequence_parallel` (with tp > 1; ignored at tp 1): Megatron's sequence parallelism. A
  // call's N = b*t token rows (row-major (B, T, C), so any chunk is contiguous) are cut into tp
  // chunks of ceil(N / tp) rows, chunk r on tp rank r; cutting the flattened tokens is the same
  // math as Megatron's cut of the sequence dimension for the row-wise layers. The residual
  // stream, the norms and the residual adds hold and compute only this rank's chunk; f gathers
  // the norm outputs into all N rows before a column-parallel layer (the gathered copy is kept
  // for its weight gradient: unlike Megatron, backward does not gather it again, for two (N, C)
  // per block of memory); g reduce-scatters a row-parallel output into the chunk, whose bias is
  // then added once. The whole-vocabulary embedding and head run on all N rows on every rank:
  // a rank keeps its rows of the embedding output, the final norm's output is gathered for the
  // head, d(embedding output) is gathered for the embedding's backward. Norm weight gradients
  // come from the chunk only and are summed over the group (one all-reduce of the block's, one
  // of the final norm's) before the region's gradients are ready. Where tp does not divide N
  // (sampling prefixes; the recipe makes training and evaluation shapes divide), the last chunk
  // is padded with rows that never reach attention, the head or a gradient: layers that mix rows
  // see the first N rows of a gathered buffer, and every buffer that is reduce-scattered has its
  // padding zeroed first.
  //
  // Pipeline stages: the table's slice may hold a stage, one or more model chunks of at least
  // one block each (ParamTable::chunks), with the embedding only on the first stage's first
  // chunk and the final norm and head only on the last stage's last chunk (param_table.h).
  // `activation_slots` is how many (micro-batch, chunk) passes may be in flight between their
  // StageForward and StageBackward (the schedule's most, p for 1F1B); each slot keeps what its
  // backward needs under `recompute` (every block's input and, below kFull, its saved
  // activations) for the largest chunk, the scratch is shared.
  Transformer(const ModelConfig& config, const ParamTable& table, BlockParameters& parameters,
              Backend& backend, int max_batch, int max_time, Recompute recompute,
              TensorParallelOps* tensor_parallel = nullptr, bool sequence_parallel = false,
              int activation_slots = 1);

  const ModelConfig& config() const { return config_; }
  // The storage type of the activations (and of the activations passed in and out of the stage
  // passes): the parameters' (BlockParameters::compute_type), float32 or bf16. The saved
  // statistics and the gradients the model accumulates are float32 whatever it is (backend.h).
  DataType activation_type() const { return acts_.dtype(); }
  // The backend it computes on: activations passed in and out of the stage passes are its memory.
  Backend& backend() const { return backend_; }
  // The model chunks this rank runs (the table's): StageForwardArgs::chunk indexes them.
  const std::vector<BlockSpan>& chunks() const { return chunks_; }
  size_t activation_bytes() const { return acts_.bytes() + stats_.bytes(); }
  // What activation_bytes() will be on a rank holding `slice` with `activation_slots` slots and
  // activations of `activation_type`, without allocating; in double, so any size is exact enough
  // to compare with the memory there is.
  static double ActivationBytes(const ModelConfig& config, int max_batch, int max_time,
                                Recompute recompute, const ModelSlice& slice = {},
                                bool sequence_parallel = false, int activation_slots = 1,
                                DataType activation_type = DataType::kF32);

  // One micro-batch through the whole model (the table holds every block): StageForward then
  // StageBackward in slot 0. Inputs and targets (b, t). Adds grad_scale * d(sum of token losses)
  // to the gradients, region by region (the last, the embeddings, is ready when this returns),
  // and the sum of token losses (targets < 0 are ignored) to TakeLossSum's. `positions` (b, t):
  // packed documents, as StageForwardArgs::positions.
  void ForwardBackward(const int32_t* inputs, const int32_t* targets, int b, int t,
                       float grad_scale, const int32_t* positions = nullptr);
  // The sum of token losses that ForwardBackward and StageForward added since the last call,
  // kept in the backend's memory until now: reading it is the step's one wait on the loss.
  double TakeLossSum();
  // Whole model only, using slot 0 (none may be in flight): the sum of token losses, no
  // gradients.
  double ForwardLoss(const int32_t* inputs, const int32_t* targets, int b, int t,
                     const int32_t* positions = nullptr);
  // Whole model only, as ForwardLoss: logits (b, t, V), or only the last position's (b, V) when
  // last_only: the V real tokens' only, whatever the vocabulary's padding for tensor parallelism.
  // `logits` is host memory (sampling reads it there).
  void ForwardLogits(const int32_t* inputs, int b, int t, bool last_only, float* logits,
                     const int32_t* positions = nullptr);

  // One micro-batch of b x t tokens through one of this rank's model chunks. Activations
  // between chunks are this rank's rows of the residual stream, (R, C) with R = b*t, or
  // ceil(b*t / tp) under sequence parallelism (Megatron's (s/t, b, h)). "First stage" below is
  // the chunk that starts with the embedding, "last stage" the one that ends with the head.
  struct StageForwardArgs {
    int chunk = 0;  // index into the table's chunks()
    int b = 0;
    int t = 0;
    // First stage: the token ids (b, t) (host memory). Other stages: the previous stage's output
    // (R, C). Both are copied into the slot during the call.
    const int32_t* tokens = nullptr;
    ConstValues input;
    // Last stage: the targets (b, t) and the scale of the loss sum's gradient. Other stages: the
    // output (R, C) for the next stage, written during the call.
    const int32_t* targets = nullptr;
    float grad_scale = 1.0f;
    Values output;
    // Every stage: null, or documents packed into each row (SFT): each token's position in its
    // own document (backend.h; host memory), which the position embeddings use and within which
    // attention stays. Copied into the slot during the call, as the tokens.
    const int32_t* positions = nullptr;
  };
  // The forward of the stage's regions into activation slot `slot` (0 .. activation_slots - 1,
  // not in flight). The last stage also runs the loss and its backward through the head and the
  // final norm at once, as ForwardBackward always has (so the (N, V) logits never exist whole
  // and the head's GEMM runs once): it adds grad_scale * d(sum of token losses) to the final
  // region's gradients, calls GradientsReady(n_layer), keeps d(last block's output) in the slot,
  // and adds the sum of token losses to TakeLossSum's.
  void StageForward(int slot, const StageForwardArgs& args);
  // The backward of the stage's blocks (and the embedding on the first stage) for the
  // micro-batch in `slot`, which it frees: accumulates the gradients region by region, calling
  // GradientsReady as each completes. `d_output` (R, C) is d(this stage's output) from the next
  // stage (ignored, may be null, on the last stage); `d_input` (R, C) receives d(this stage's
  // input) for the previous stage (ignored, may be null, on the first stage) and may be
  // d_output itself (then nothing is copied).
  void StageBackward(int slot, ConstValues d_output, Values d_input);
  // Elements of the activation (and of its gradient) between this stage and the next for a
  // micro-batch of b x t tokens: (R, C) as above.
  size_t StageActivationCount(int b, int t) const {
    return static_cast<size_t>(SplitRows(b * t).own) * config_.d_model;
  }
  // The forward of the stage without gradients, in slot 0 (none may be in flight), for
  // evaluation: writes args.output on a stage without the head, and returns the sum of token
  // losses of args.targets on the last stage (0 elsewhere). args.grad_scale is unused.
  double StageForwardLoss(const StageForwardArgs& args);
  // The same pass for sampling: writes args.output on a stage without the head, and on the last
  // stage the logits as ForwardLogits does (args.targets is unused).
  void StageForwardLogits(const StageForwardArgs& args, bool last_only, float* logits);

 private:
  // Saved activations of one block, pointers into the arena. (N = b*t tokens; R the rows of the
  // residual stream this rank holds and G = tp * R the gathered rows: both N without sequence
  // parallelism.) The statistics are float32, the rest in the activation type.
  struct BlockActivations {
    Values norm1;       // (G, C) every rank's chunk, gathered
    float* norm1_mean;  // (R) LayerNorm only
    float* norm1_rstd;  // (R)
    Values qkv;         // (N, qkv_width), after RoPE
    Values attn;        // (N, H*D) attention output before the projection (H, F: this rank's)
    float* lse;         // (B, H, T)
    Values resid_mid;   // (R, C) block input + attention branch
    Values norm2;       // (G, C) gathered
    float* norm2_mean;  // (R)
    float* norm2_rstd;  // (R)
    Values mlp_up;      // (N, F) gpt2, (N, 2F) llama: before the activation
    Values mlp_act;     // (N, F)
  };

  // The parameters (Base = ConstValues) or gradients (float*) of one region as acquired: tensor
  // at table offset o is at base + (o - begin); an absent tensor is null.
  template <typename Base>
  struct RegionView {
    Base base = nullptr;
    size_t begin = 0;
    Base operator()(size_t offset) const;
  };
  using ParamView = RegionView<ConstValues>;
  using GradView = RegionView<float*>;

  // How a call's n token rows split over the tensor-parallel ranks (see the constructor): this
  // rank holds rows [begin, begin + own) of `padded` = tp * own (without sequence parallelism:
  // all n, begin 0).
  struct RowSplit {
    int n = 0;
    int own = 0;
    int begin = 0;
    int padded = 0;
  };

  // One micro-batch in flight, from its StageForward to its StageBackward: what its backward
  // needs.
  struct Slot {
    int chunk = 0;
    std::vector<Values> inputs;            // (R, C) each of the chunk's blocks' input, in order
    std::vector<BlockActivations> blocks;  // each block's saved activations (none under kFull)
    Values d_last;                         // last stage: (R, C) d(last block's output)
    const int32_t* tokens = nullptr;       // first stage: the micro-batch's token ids, staged
    int32_t* staged_tokens = nullptr;      // (max tokens) the slot's token ids in backend memory
    const int32_t* positions = nullptr;    // the micro-batch's document positions, staged, or null
    int32_t* staged_positions = nullptr;   // (max tokens) in backend memory
    int b = 0;
    int t = 0;
  };

  void AllocateActivations(int max_batch, int max_time, int activation_slots);
  AttentionShape Shape(int b, int t) const;
  ParamView Params(int region, Pass pass);
  GradView Grads(int region);
  RowSplit SplitRows(int n) const;
  // resid_out (R, C) = resid_in + the row-parallel layer's output (N rows) summed over the
  // tensor-parallel ranks (g: an all-reduce, or a reduce-scatter into this rank's rows), plus
  // the bias once.
  void RowParallelResidual(Values resid_out, ConstValues resid_in, ConstValues inp,
                           ConstValues weight, ConstValues bias, const RowSplit& rows,
                           int in_features);
  // RowParallelResidual but for the add, which it leaves to the caller (the norm that follows
  // fuses it) where the summed output is whole in branch_out_ (no sequence parallelism): returns
  // it then, else null (resid_out done).
  ConstValues ProjectBranch(Values resid_out, ConstValues resid_in, ConstValues inp,
                            ConstValues weight, ConstValues bias, const RowSplit& rows,
                            int in_features);
  // The norm output (G, C) whose own rows the norm just wrote, gathered for a column-parallel
  // layer (f forward under sequence parallelism; nothing otherwise).
  void GatherNormOutput(Values norm_out, const RowSplit& rows);
  // d(row-parallel output) for all N rows from dresid (R, C): gathered into branch_out_ under
  // sequence parallelism (g backward), dresid itself otherwise.
  ConstValues BranchOutputGrad(ConstValues dresid, const RowSplit& rows);
  // d(norm output) for this rank's rows from d_norm_ (N, C), the column-parallel layer's partial
  // input gradient: summed over the ranks (f backward), by an all-reduce, or under sequence
  // parallelism a reduce-scatter into d_own_rows_.
  ConstValues NormOutputGrad(const RowSplit& rows);
  // Where a norm's weight or bias gradient (table offset) accumulates: slot `slot` of
  // norm_grads_ under sequence parallelism, where FinishNormGrads sums it over the ranks and adds
  // it to the gradient; the gradient itself otherwise.
  float* NormGrad(const GradView& grads, size_t offset, int slot);
  void BeginNormGrads();
  // `offsets` in slot order, absent tensors (kAbsent) last.
  void FinishNormGrads(const GradView& grads, std::initializer_list<size_t> offsets);
  // out (R, C) = this rank's rows of the inputs' token (and position) embeddings. At
  // tp > 1 vocabulary-parallel: each rank looks up the tokens in its rows (zeros for the others)
  // and g sums the ranks' lookups (a reduce-scatter into this rank's rows under sequence
  // parallelism).
  void EmbeddingForward(const int32_t* inputs, const int32_t* positions, int b, int t,
                        const RowSplit& rows, Values out);
  // Adds d(embedding output), from dresid (R, C) and gathered from every rank under sequence
  // parallelism, to the token rows this rank holds and to the position embedding.
  void EmbeddingBackward(const int32_t* inputs, const int32_t* positions, int b, int t,
                         const RowSplit& rows, ConstValues dresid);
  // Block `layer` from `in` into `out` (the output is skipped when `out` is null: recomputation
  // only needs the saved activations).
  void BlockForward(int layer, const ParamView& params, BlockActivations& a, ConstValues in,
                    Values out, int b, int t, const int32_t* positions);
  // dresid holds d(block output) on entry and d(block input) on return.
  void BlockBackward(int layer, const ParamView& params, const GradView& grads, BlockActivations& a,
                     ConstValues in, Values dresid, int b, int t, const int32_t* positions);
  // The classifier on final_norm_ (N, C): adds the sum of token losses (targets < 0 ignored) to
  // *loss_sum (backend memory); when dx is not null also writes dx (N, C) and accumulates dhead
  // for the loss sum scaled by grad_scale. At tp = 1 the backend's fused kernel; at tp > 1 its
  // vocabulary-parallel phases per chunk of ClassifierChunkRows(vocab slot) rows (the max and the
  // sums combined over the ranks), each rank's dx its slot's share (the caller's f, NormOutputGrad,
  // sums them).
  void Classifier(Values dx, float* dhead, const int32_t* host_targets, int n, float grad_scale,
                  double* loss_sum);
  // The evaluation passes' classifier without gradients: the loss sum, read at once.
  double EvaluationLoss(const int32_t* host_targets, int n);
  double* TrainingLossSum() { return static_cast<double*>(loss_sums_.data()); }
  // *scalar (backend memory), which becomes 0.
  double ReadAndZero(double* scalar);
  // The embedding (first stage) or a copy of args.input into the slot, then the stage's
  // blocks, the last one's output into `output`. When the head is the token embedding, the
  // embeddings stay acquired for it.
  void ForwardBlocks(int slot, const StageForwardArgs& args, Values output);
  // The final norm of last_output_ into final_norm_ (gathered); the final region stays
  // acquired: the caller uses the head, then calls ReleaseHead.
  void FinalNormForward(const RowSplit& rows);
  // The whole model's forward in slot 0 up to final_norm_, for ForwardLoss.
  void Forward(const int32_t* inputs, const int32_t* positions, int b, int t);
  // The loss on final_norm_ (added to TakeLossSum's) and its backward through the head and the
  // final norm into d_last (R, C); the final region's gradients are ready and the head released
  // on return.
  void LossBackward(const int32_t* targets, const RowSplit& rows, float grad_scale, Values d_last);
  void ReleaseHead();
  // The output head's weight (V, C) among the acquired regions.
  ConstValues HeadWeight() const;
  // Block `index` of the slot's chunk (from 0) in `slot`.
  BlockActivations& ActivationsFor(int slot, int index);
  // Whether model chunk `chunk` of this rank starts with the embedding, or ends with the head.
  bool StartsModel(int chunk) const { return has_embedding_ && chunk == 0; }
  bool EndsModel(int chunk) const {
    return has_head_ && chunk + 1 == static_cast<int>(chunks_.size());
  }

  ModelConfig config_;
  const ParamTable& table_;
  const LocalDims& dims_;
  NoTensorParallel no_tensor_parallel_;
  TensorParallelOps& tp_;
  BlockParameters& parameters_;
  Backend& backend_;
  Recompute recompute_;
  int last_region_;                // n_layer: the final norm and head
  std::vector<BlockSpan> chunks_;  // the table's
  int slot_blocks_;                // the largest chunk's blocks
  bool has_embedding_;             // first stage (its first chunk)
  bool has_head_;           // last stage (its last chunk): the final norm, the head and the loss
  bool head_is_embedding_;  // the tied head is this stage's own token embedding tensor
  ParamView embeddings_;    // acquired during the embedding's forward (and the head's use)
  ParamView final_region_;  // acquired from FinalNormForward until ReleaseHead
  // The arena: the activations in their type, and the float32 statistics and gradient scratch.
  DeviceBuffer acts_;
  DeviceBuffer stats_;
  // The micro-batches' token ids and document positions (two (max tokens) arrays a slot) and
  // targets (max tokens) staged in the backend's memory for its kernels: 4-byte int32 values in
  // a buffer allocated as floats (the same size; DataType has no int32). Not part of the arena
  // (a few KiB).
  DeviceBuffer token_ids_;
  int32_t* staged_targets_ = nullptr;
  // Two doubles in the backend's memory: the training passes' loss sum (TakeLossSum) and an
  // evaluation pass's.
  DeviceBuffer loss_sums_;
  std::vector<Slot> slots_;
  // kFull: the one block's activations every block recomputes; kSelective and kFull: the
  // attention core every block shares.
  BlockActivations full_block_;
  Values last_output_;           // last stage: (R, C) the last block's output
  Values final_norm_;            // (G, C) gathered
  float* final_mean_ = nullptr;  // (R)
  float* final_rstd_ = nullptr;  // (R)
  // Backward scratch.
  Values d_resid_;    // (R, C)
  Values d_norm_;     // (G, C)
  Values d_qkv_;      // (N, qkv_width)
  Values d_attn_;     // (N, H*D)
  Values d_mlp_up_;   // (N, F or 2F)
  Values d_mlp_act_;  // (N, F), Llama's (GPT-2 carries it through the GELU within a GEMM)
  // (G, C) attention or MLP branch output before the residual add (before the reduce-scatter
  // under sequence parallelism); in backward, d(branch output) gathered, and the embedding's.
  Values branch_out_;
  // Sequence parallelism only: (R, C) this rank's rows of a reduce-scattered d(norm output), and
  // (4, C) a block's (or the final) norm weight and bias gradients before they are summed.
  Values d_own_rows_;
  float* norm_grads_ = nullptr;
  // Vocabulary-parallel classifier scratch (tp > 1 only): one chunk's logits (rows, vocab_rows)
  // and its per-row max, sums and target logits (3, rows), the last two adjacent so that one
  // all-reduce sums them.
  Values vocab_logits_;
  float* vocab_stats_ = nullptr;
  int vocab_chunk_rows_ = 0;
  // (qkv_width, C): one micro-batch's qkv weight gradient, whose replicated kv rows are summed
  // over their ranks before it is added (only when kv heads are replicated).
  float* d_qkv_weight_ = nullptr;
  int max_tokens_ = 0;
  bool sequence_parallel_ = false;  // requested and tp > 1
};

}  // namespace dtrain
