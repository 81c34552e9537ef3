// nanoGPT's GPT inside a Model (docs/course_sources.md §6g): token and position embeddings, L
// pre-LayerNorm blocks (ln_1, causal self-attention with a fused c_attn (3C x C) and c_proj, ln_2, MLP
// c_fc (4C x C) -> GELU (erf) -> c_proj), ln_f, and lm_head tied to wte; no dropout; LayerNorm eps
// 1e-5; the loss (outside, as for the MLP) is the mean cross-entropy over all B x T positions.
//
// Parameters are named and ordered as nanoGPT's named_parameters() lists them (the tied lm_head once,
// as transformer.wte.weight) and live in the Model's flat buffers, so DDP's buckets, the optimizers
// and checkpoints see them as they see the MLP's. The forward and backward follow llm.c's layout
// (one activation buffer per saved tensor) with the ops nanoGPT runs; the matmuls are the device's
// Linear (OpenBLAS on the CPU), the rest are the device's transformer ops (engine/core/gpt_ops.h). A pipeline stage
// runs a range of its layers (GptRange). On a GPU the same code runs engine/cuda/gpt_kernels.cu.
#pragma once
#include <array>
#include <functional>
#include <initializer_list>
#include <utility>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/gpt_spec.h"
#include "engine/core/half.h"
#include "engine/core/model.h"

namespace dtlab {

// Indices into the parameter list (nanoGPT's named_parameters() order). A dense block holds 12
// parameters; an MoE block (MoeSpec) holds its first 8 (ln_1, attn, ln_2), then mlp.router.weight, then
// each expert's c_fc weight and bias and c_proj weight and bias.
struct GptParamIndex {
  static constexpr int kWte = 0, kWpe = 1;
  static constexpr int kPerBlock = 12;  // a dense block's
  enum Block : int { Ln1W, Ln1B, AttnW, AttnB, AttnProjW, AttnProjB, Ln2W, Ln2B, FcW, FcB, FcProjW, FcProjB };
  enum Expert : int { ExFcW, ExFcB, ExProjW, ExProjB };
  static constexpr int kRouter = 8;  // an MoE block's router, after Ln2B
  static int per_block(const GptSpec& s, int64_t l) {
    return s.moe.in_block(l) ? 9 + 4 * static_cast<int>(s.moe.local_experts()) : kPerBlock;
  }
  // Block l's first parameter, counted from block `from`'s.
  static int blocks_between(const GptSpec& s, int from, int l) {
    int n = 0;
    for (int b = from; b < l; b++) n += per_block(s, b);
    return n;
  }
  static int block(const GptSpec& s, int l, Block k) { return 2 + blocks_between(s, 0, l) + k; }
  static int router(const GptSpec& s, int l) { return 2 + blocks_between(s, 0, l) + kRouter; }
  // e: this rank's expert e (global number first_expert() + e).
  static int expert(const GptSpec& s, int l, int e, Expert k) { return router(s, l) + 1 + 4 * e + k; }
  static int ln_f_weight(const GptSpec& s) { return 2 + blocks_between(s, 0, static_cast<int>(s.layers)); }
  static int ln_f_bias(const GptSpec& s) { return ln_f_weight(s) + 1; }
};

// The parameter table (names, shapes, offsets in the flat buffers; data and grad left null). `tp`: a
// Megatron tensor-parallel shard's local shapes (degree tp; names unchanged): c_attn and c_fc
// column-parallel (3C/t and 4C/t rows: the q, k and v of H/t heads, 4C/t MLP columns), attn.c_proj and
// mlp.c_proj row-parallel (C/t and 4C/t columns); LayerNorms, embeddings and the row layers' biases whole.
std::vector<Parameter> gpt_parameters(const GptSpec& spec, int tp = 1);

// Its parameters, in named_parameters() order (the whole model: gpt_parameters()), flat in that order.
// A last stage without the embeddings holds the head's own copy of the tied weight, named nanoGPT's
// `lm_head.weight` (Megatron's shared embedding on the last stage: it starts equal to wte, and the
// embedding group all-reduces the two gradients, so the two copies stay equal).
std::vector<Parameter> gpt_stage_parameters(const GptSpec& spec, GptRange range, int tp = 1);
// Where each of the stage's parameters (gpt_stage_parameters order) sits in the whole model's flat
// buffer (gpt_parameters' offsets): the same name, and the head's copy at wte's. Stage values come
// from a whole model's as values[p.offset + i] = whole[source[k] + i], and go back the same way.
std::vector<int64_t> gpt_stage_sources(const GptSpec& spec, GptRange range);

// dtlab::Error (one sentence) unless a Megatron split of degree `tp` fits the model: the heads divide
// by it (each rank takes H/t whole heads) and, under sequence parallelism, so does the context.
void check_gpt_tp(const GptSpec& spec, int tp, bool sequence_parallel);

// nanoGPT's initial values for torch.manual_seed(seed) and GPT(config), flat in gpt_parameters()'
// order: the constructors' draws (nn.Embedding's normal_, nn.Linear's kaiming_uniform_ and bias
// uniform_, in construction order, lm_head last), then _init_weights applied module by module
// (children first: normal_(0, 0.02) for every Linear weight and Embedding, zero biases; the tied
// weight takes lm_head's draw, made last), then c_proj.weight again with std 0.02/sqrt(2L). torch's CPU
// normal_ on 16 or more floats: 24-bit uniforms, Box-Muller on each 16 (the first 8 with the next 8),
// and the last 16 drawn again when the count is not a multiple of 16. torch's AVX2 build computes
// log/cos/sin with SLEEF, so its values may differ from these in the last bit.
std::vector<float> gpt_init_values(const GptSpec& spec, uint64_t seed);

// LoRA on c_attn (peft's LoraConfig(target_modules=["c_attn"]), layers_to_transform = the adapted
// blocks): lora_A's values of blocks [first_block, end_block) that `lora` adapts, each (r, C), in block
// order, as peft draws them after torch.manual_seed(seed) and GPT(config): per adapted block
// nn.Linear(C, r) and nn.Linear(r, 3C) (bias=False) draw, then reset_lora_parameters draws A again
// with kaiming_uniform_(a=sqrt(5)); lora_B starts at zero.
std::vector<float> gpt_lora_init_values(const GptSpec& spec, const LoraSpec& lora, uint64_t seed, int first_block, int end_block);

// A GPT's adapters (Model::enable_lora): where each of the stage's blocks' lora_A lies in the
// trainable parameters (its lora_B next), -1 for a block LoRA leaves alone.
struct GptAdapters {
  std::vector<Parameter>* params = nullptr;
  int64_t rank = 0;
  float scaling = 0.0f;
  std::vector<int> a_of_block;
};

// Layer numbers the GPT reports to observers and gates: 0 the embeddings, 1..L the blocks, L + 1 the
// final LayerNorm and the head.
class GptCore {
 public:
  // `range`: a pipeline stage's layers (default: the whole model); `params` below are then
  // gpt_stage_parameters(spec, range, tp.degree).
  //
  // `tp`: Megatron tensor parallelism (Shoeybi et al. 2019; docs/course_sources.md §6c). This rank
  // holds H/t heads' q, k and v rows of c_attn and those heads' columns of attn.c_proj, and 4C/t of the
  // MLP's columns (c_fc's rows, mlp.c_proj's columns); LayerNorms, embeddings and the head are whole.
  // Each block runs f (identity forward, all-reduce of the input gradient backward) before c_attn and
  // c_fc, and g (all-reduce forward, identity backward) after each c_proj, whose bias is added after
  // the sum. The logits come out whole on every rank, so the loss is the unsplit model's.
  // Sequence parallelism (Korthikanti et al. 2022): the residual stream, the LayerNorms and the
  // embeddings hold this rank's T/t positions of every sample; f becomes an all-gather along the
  // sequence (its backward a reduce-scatter) and g a reduce-scatter (its backward an all-gather); the
  // column layers' weight gradients gather the LayerNorm output again in backward, as Megatron does
  // rather than keep it whole. Parameters that see only this rank's positions (LayerNorms, the row
  // layers' biases, wte, wpe) get partial gradients, computed apart, all-reduced over the TP group,
  // then added. ln_f's output is gathered before the (whole) head, so the logits are whole; the head's
  // weight gradient comes from this rank's positions only and is summed with the embedding's.
  GptCore(const GptSpec& spec, MemoryTracker* tracker, Device& device, GptRange range = {},
          const TensorParallelSpec& tp = {});
  // The TP group's collectives (required before a pass when the degree is above 1).
  void set_tp_comm(TensorParallelComm* comm) { comm_ = comm; }
  // LoRA on c_attn (Hu et al. 2021; peft's Linear): the `params` the passes take are then the frozen
  // base (no gradients, no hook calls) and each adapted block adds scaling * (x A^T) B^T to c_attn's
  // output. Under TP, B holds this rank's rows (q, k and v of its heads) and A is whole: A's gradient
  // is a partial sum, all-reduced over the group; the hook sees lora_B then lora_A of each block.
  void set_lora(const GptAdapters& adapters) { lora_ = adapters; }
  const GptAdapters& lora() const { return lora_; }
  // The index of block l's parameter k in the stage's parameters.
  int block_param(int l, GptParamIndex::Block k) const { return pi(l, k); }
  const TensorParallelSpec& tensor_parallel() const { return tp_; }
  // Residual-stream rows this rank holds: B x T, or B x T/t under sequence parallelism (what a
  // pipeline stage receives and sends, and what output() holds); T/c for T under context parallelism.
  int64_t residual_rows(int64_t B) const { return sp() ? B * (seq_rows() / tp_.degree) : B * seq_rows(); }
  // idx: B x T token ids on the host, each in [0, vocab) (checked by the caller). Returns the logits
  // (B*T, V, float32 in every precision), owned here. A stage without the embeddings reads `x`
  // (B*T, C, in dtype()), the previous stage's output, instead (kept by the caller until backward);
  // one without the head returns its last block's output (B*T, C, in dtype()), owned here.
  // `hooks` (FSDP) see each layer before its parameters are read and after it is done.
  const void* forward(std::vector<Parameter>& params, const int64_t* idx, int64_t B, ComputeObserver* obs,
                      LayerGate* gate, LayerHooks* hooks = nullptr, const void* x = nullptr);
  // dlogits (B*T, V, float32) of the last forward (a stage without the head: the gradient of its
  // output, (B*T, C) in dtype()). Parameter gradients accumulate (as torch's .grad); the hook
  // sees each parameter once its gradient is final, in autograd's order: ln_f, the blocks from the
  // last (within one: mlp.c_proj, c_fc, ln_2, attn.c_proj, c_attn, ln_1; bias before weight), wpe,
  // and wte last (the tied weight's two uses are summed before its hook). Returns the gradient of a
  // stage's input `x` (B*T, C, in dtype()), owned here; null where the stage embeds.
  const void* backward(std::vector<Parameter>& params, const void* dlogits, const Model::GradReadyHook& ready,
                       ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks = nullptr);
  // Zero-bubble's split of B (Qi et al. 2023, ZB-H1; docs/course_sources.md): backward_input() is I,
  // the same pass without the Linear layers' weight and bias gradients (the LayerNorms' and the
  // embeddings' are cheap and come with it), keeping each Linear's output gradient; backward_weight()
  // is W, those gradients from the kept output gradients and the forward's saved inputs (a
  // checkpointed block runs its forward once more first). I then W equals backward(). Under sequence
  // parallelism the head's weight and the row layers' biases, summed over the TP group, stay in I, and
  // W gathers each LayerNorm's output once more.
  const void* backward_input(std::vector<Parameter>& params, const void* dlogits, const Model::GradReadyHook& ready,
                             ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks = nullptr);
  void backward_weight(std::vector<Parameter>& params, const Model::GradReadyHook& ready, ComputeObserver* obs, LayerGate* gate,
                       LayerHooks* hooks = nullptr);
  // Frees the saved activations (a pipeline micro-batch after its backward); the next forward
  // allocates them again.
  void release();
  // Mixed precision (Model::set_precision; docs/course_sources.md §6e): the parameters it is given
  // are then 16-bit (Parameter::data16 and grad16), and every tensor it saves or passes on holds
  // dtype(): each op reads its 16-bit operands widened to float32 scratch, computes in float32 (the
  // GEMMs accumulate in float32, as torch's bf16 GEMM does) and rounds each result once, as
  // model_half.cpp's Linear does. LayerNorm's mean and rstd stay float32, and so do the logits it
  // returns (the loss runs in float32, as Megatron's output.float()). Gradients reaching a parameter
  // are added in float32 to its widened 16-bit gradient and rounded once. The host only: the CUDA
  // device's 16-bit kernels are not built (Model::set_precision refuses them). The TP and sequence-
  // parallel collectives move the 16-bit tensors.
  void set_precision(Precision p);
  DType dtype() const { return adt_; }
  // torch.autocast (--amp bf16|fp16, Model::set_amp; docs/course_sources.md §6e) over nanoGPT's GPT:
  // float32 parameters and gradients; each Linear (and the attention's matmuls, GELU and softmax) runs
  // on 16-bit operands (its input and its weight and bias cast: x.to(dtype)) and gives a 16-bit output;
  // the embeddings, the LayerNorms, the residual adds and the loss stay float32, as torch 1.13's CPU
  // autocast runs them. The 16-bit tensors are kept in float32 memory holding 16-bit values (what the
  // Memory view counts: 4 bytes each, where torch holds 2); their collectives (TP's row-parallel
  // sums, SP's output-gradient gather, CP's K/V and Ulysses' all-to-alls, EP's combine) move them in
  // 16 bits. A 16-bit op's gradient is 16-bit too: rounded once, then widened by the cast's backward
  // (a Linear's input gradient) or added into the float32 .grad (its weight's and bias's).
  void set_amp(Precision p);
  bool amp() const { return amp_; }
  const GptRange& range() const { return r_; }
  // A stage's last block output (B*T, C) after forward; what the next stage receives.
  const Tensor& output() const { return res3_.back(); }
  int64_t batch() const { return B_; }
  // Activation checkpointing per block (torch.utils.checkpoint around each Block, non-reentrant): the
  // forward keeps only each block's output; the backward runs the block's forward again (reported as
  // ComputeKind::Recompute, the hooks' before/after_recompute around it) into one set of buffers the
  // blocks share, then its backward: the same kernels, so the gradients are bit-identical.
  void set_checkpointing(bool on) { checkpointing_ = on; }
  bool checkpointing() const { return checkpointing_; }
  // The attention probabilities of the last forward: block l, sample b, head h (of the whole model),
  // (T, T) row-major with zeros above the diagonal, read into `probs` (host memory: a GPU's are read
  // back, 16 bits widened; a GPU's thread must be bound). False before a forward, while checkpointing
  // (no block keeps it), under --cp (ring attention keeps none), and for a head another TP rank computes.
  bool attention(int l, int64_t b, int64_t h, std::vector<float>& probs) const;
  // The last forward's input tokens of sample b (T ids; null before a forward).
  Device& device() const { return dev_; }  // where tokens() points
  const int64_t* tokens(int64_t b) const { return idx_ && b >= 0 && b < B_ ? idx_ + b * s_.ctx : nullptr; }
  // FLOPs of one forward of layer `layer` (0..L+1) for B samples on this rank (a TP shard's blocks do
  // 1/t of the matmuls and attention), multiply-adds counted twice (the backward is twice that).
  double layer_flops(int layer, int64_t B) const;
  // Those FLOPs with the bytes the layer's kernels move (op_cost.h), each operand read and each result
  // written once: a block's LayerNorms, GEMMs, attention scores, GELU and residual adds.
  OpCost layer_cost(int layer, int64_t B) const;

  // Mixture of experts (GptSpec::moe; Megatron-core's MoE layer, MoeSpec says which parts). The
  // load-balancing loss's gradient is `aux_grad_scale` x its own, the factor the caller gives the
  // cross-entropy's mean (1 / accum, times fp16's loss scale: Megatron's MoEAuxLossAutoScaler).
  void set_aux_grad_scale(float s) { aux_grad_scale_ = s; }
  // Expert parallelism (MoeSpec::ep > 1; required before a pass then): the group's all-to-alls
  // (Megatron's MoEAlltoAllTokenDispatcher). Each MoE block's forward routes its own tokens, sends the
  // rows of each expert to the rank holding it (after the counts, so each rank knows what it receives),
  // runs its own experts on the rows of every rank, and sends the outputs back; the backward sends the
  // output gradients the same way and the input gradients back. The experts' weight gradients are
  // then sums over the EP group's tokens (DDP reduces them over the expert-data-parallel group).
  void set_ep_comm(ExpertParallelComm* comm) { ep_comm_ = comm; }
  ExpertParallelComm* ep_comm() const { return ep_comm_; }
  // Context parallelism (GptSpec::cp; docs/strategies.md, "Context parallelism"; required before a
  // pass when the degree is above 1). This rank holds seq_rows() positions of every sample
  // (ContextParallelSpec::positions: the residual stream, the MLPs, the embeddings and the loss see
  // only those) and attention meets the others' keys:
  //   ring, zigzag  ring attention (Liu et al. 2023): the rank keeps its queries; its K/V block and
  //                 then the others' travel the ring (step s holds group rank r-s's), each met with the
  //                 causal mask of the global positions and merged by the online softmax (running max
  //                 and sum, as flash attention). Backward runs the ring the other way: K/V blocks
  //                 travel to rank r-1 again, and each block's dK/dV (in the activations' dtype) one
  //                 step behind it, every rank adding its share, until the last share reaches the
  //                 owner, which kept its own (TransformerEngine's AttnFuncWithCPAndKVP2P: c-1 sends
  //                 of K/V and c-1 of dK/dV). A block no query of this rank may see is passed on
  //                 without compute.
  //   ulysses       DeepSpeed-Ulysses (Jacobs et al. 2023): an all-to-all trades the sequence split
  //                 of q, k and v for a head split (H/c heads of every position), attention runs
  //                 whole, and an all-to-all sends each rank's positions of the output back; the
  //                 backward mirrors both.
  void set_cp_comm(ContextParallelComm* comm) { cp_comm_ = comm; }
  const ContextParallelSpec& context_parallel() const { return s_.cp; }
  int64_t seq_rows() const { return s_.ctx / s_.cp.degree; }  // positions per sample on this rank
  // Block l's last ring pass (forward, or backward once it ran), for the lab's Context view and the
  // tests; nullptr without ring attention or before a pass.
  struct CpPass {
    bool backward = false;
    int steps_done = 0;               // ring steps whose compute finished (degree when the pass is done)
    std::vector<int> held;            // per step: the group rank whose K/V block this rank met
    std::vector<int64_t> pairs;       // per step: (query, key) pairs under the causal mask, per sample and head
    std::vector<int64_t> sent_bytes;  // per step: the bytes this rank sent after it (0: none)
    bool sending = false;             // in (or held before) the sends after step steps_done - 1
    int64_t blocks() const;           // steps with any pair: the blocks this rank computed
    int64_t total_pairs() const;
  };
  const CpPass* cp_pass(int l) const;
  // Block l's last pass the given way: the latest if it went that way, else the one before it (a
  // finished pass); nullptr before one. The lab draws a block's forward after its backward ran.
  const CpPass* cp_pass(int l, bool backward) const;
  int cp_block() const { return cp_block_; }  // the block whose ring pass runs now or ran last (-1: none yet)
  // Causal (query, key) pairs between group rank `qr`'s positions and rank `kr`'s, per sample and head.
  static int64_t causal_pairs(const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos);

  // What the router did in the last forward of block l (nullptr for a dense block or before a forward).
  struct MoeRouting {
    int64_t tokens = 0;                 // B x T
    int64_t capacity = 0;               // per expert (0: dropless)
    std::vector<int64_t> routed;        // E: tokens that chose each expert (before capacity)
    std::vector<int64_t> kept;          // E: of them, the ones the expert computed
    int64_t dropped = 0;                // (token, expert) pairs past capacity
    double aux_loss = 0;                // this block's load-balancing loss (coefficient included)
  };
  const MoeRouting* moe_routing(int l) const;
  // Block l's last kMoeHistory forwards (oldest first; a recomputation under checkpointing is not a
  // new forward), what the lab's Experts view draws as a trend: nullptr for a dense block.
  struct MoePoint {
    float imbalance = 0;  // max over experts of routed / their mean (tokens x K / E): 1 is even
    float aux_loss = 0;   // the block's load-balancing loss
  };
  static constexpr size_t kMoeHistory = 128;
  const std::vector<MoePoint>* moe_history(int l) const;
  // Appends its forwards to `owner`'s history from now on: a pipeline stage's micro-batch cores
  // (Model::gpt_activations) share their model's, so the history is the stage's, not one slot's.
  void share_moe_history(const GptCore& owner) { moe_history_ = owner.moe_history_; }
  // The load-balancing losses of the last forward, summed over this stage's MoE blocks.
  double aux_loss() const;

 private:
  // One MoE block's routing, kept for its backward (Megatron's probs, routing_map and permutation).
  struct MoeRoute {
    std::vector<int32_t> expert;   // (BT, K): token t's k-th choice, by logit, ties to the lower index
    std::vector<float> prob;       // (BT, K): softmax over the K chosen logits
    std::vector<uint8_t> kept;     // (BT, K): within the expert's capacity
    std::vector<float> scores;     // (BT, E): softmax over all logits (the aux loss's P)
    std::vector<double> prob_sum;  // E: this rank's scores summed over its tokens
    // The aux loss's f_e (tokens routed to each expert before capacity) and token count: this rank's,
    // or under TP and CP the group's (moe_group_sums).
    std::vector<double> group_routed;
    double group_tokens = 0;
    std::vector<int64_t> offset;   // E + 1: each expert's first row in the permuted buffers
    std::vector<int32_t> row;      // per permuted row: t x K + k
    // Expert parallelism: rows from each group rank for each of this rank's experts ((ep, E/ep),
    // what the counts' all-to-all gave), and each local expert's first row among the received rows
    // in expert order (E/ep + 1; without EP: offset).
    std::vector<int64_t> from;
    std::vector<int64_t> eoff;
    // The received rows in expert order: input, c_fc's output and GELU's (held for the backward).
    Tensor ex_x, ex_h, ex_g;
  };
  bool ep() const { return s_.moe.ep > 1; }
  // The rows for group rank j: send_rows()[j] (this rank's permuted rows of j's experts); received
  // from rank i: recv_rows()[i]; both in rows (x C elements).
  std::vector<int64_t> send_rows(const MoeRoute& rt) const;
  std::vector<int64_t> recv_rows(const MoeRoute& rt) const;
  // Received rows between rank order (rank i's rows for each of my experts) and expert order (expert
  // e's rows from each rank): `to_expert` true copies rank order into expert order.
  void regroup(void* dst, const void* src, const MoeRoute& rt, int64_t width, bool to_expert);
  bool moe_block(int l) const { return s_.moe.in_block(l); }
  // The router and the dispatch: logits, top-k, softmax, capacity, the aux loss, the permutation.
  void route(MoeRoute& rt, MoeRouting& stats, const float* logits, int64_t BT);
  double aux_loss_of(const MoeRoute& rt, const std::vector<double>& prob_sum) const;
  // Under TP and CP: the routed counts and router probabilities summed over the groups (Megatron's
  // tokens_per_expert over the tp_cp group), and the block's aux loss from them.
  void moe_group_sums(MoeRoute& rt, MoeRouting& stats, int layer);
  // Block l's MoE MLP on `a` (R x C: ln_2's output, this rank's residual rows) into dbuf_ (R x C).
  const void* moe_forward(std::vector<Parameter>& p, int l, const void* a);
  // Its backward: dout (R x C) in, the gradient of `a` into dbuf_ (R x C); the experts' and the
  // router's gradients accumulate (and are reported to `ready`, experts from the last, then the router).
  void moe_backward(std::vector<Parameter>& p, int l, const void* a, const void* dout, const std::function<void(int)>& ready);
  int pr(int l) const { return pi(l, GptParamIndex::Ln2B) + 1; }  // the router's index
  int pe(int l, int e, GptParamIndex::Expert k) const { return pr(l) + 1 + 4 * e + k; }

  void ensure(int64_t B);
  const void* run_backward(std::vector<Parameter>& p, const void* dlogits, const Model::GradReadyHook& ready, ComputeObserver* obs,
                            LayerGate* gate, LayerHooks* hooks, bool input_only);
  std::array<std::vector<Tensor>*, 13> per_block();  // the per-block saved tensors below
  // Block l's forward from `x` into its buffers (slot(l)) and res3_[l].
  void block_forward(std::vector<Parameter>& p, int l, const void* x);
  // Float32 operands of one op (mixed precision; see set_precision): a view of float32 memory, or a
  // float32 copy in scratch of 16-bit memory, which a written operand rounds back into when the
  // statement ends (the temporary's destructor). Null stays null.
  class F32 {
   public:
    // How the statement's end treats the values: Narrow rounds them into `back`'s 16-bit memory (when
    // there is one); Round rounds them in place (autocast's 16-bit output); RoundAdd rounds them, then
    // adds them into `back`'s float32 memory (autocast's 16-bit gradient into a float32 .grad).
    enum class Fin : uint8_t { Narrow, Round, RoundAdd };
    F32(GptCore* core, int slot, float* f, void* back, int64_t n, Fin fin = Fin::Narrow)
        : core_(core), slot_(slot), f_(f), back_(back), n_(n), fin_(fin) {}
    F32(const F32&) = delete;
    F32& operator=(const F32&) = delete;
    ~F32() {
      if (core_) core_->finish(slot_, f_, back_, n_, fin_);
    }
    operator float*() const { return f_; }

   private:
    GptCore* core_;
    int slot_;
    float* f_;
    void* back_;
    int64_t n_;
    Fin fin_;
  };
  // Float32 values the host loops read or write (ring attention's online softmax, the router, the
  // experts' combine): on the CPU the device's memory itself; on a GPU a host copy, downloaded first
  // when `in`, uploaded back when the view ends when `out`. Declared after the F32 view it stages,
  // so it uploads before that view's finish rounds or narrows.
  class Host {
   public:
    Host(Device& dev, const float* p, int64_t n, bool in, bool out);
    ~Host();
    Host(const Host&) = delete;
    Host& operator=(const Host&) = delete;
    operator float*() const { return h_; }

   private:
    Device& dev_;
    float* p_;
    int64_t n_;
    bool out_;
    std::vector<float> buf_;
    float* h_;
  };
  F32 rd(const void* p, int64_t n);  // read
  F32 wr(void* p, int64_t n);        // written whole
  F32 acc(void* p, int64_t n);       // read, then added into or updated in place
  F32 rd(const Tensor& t) { return rd(t.raw(), t.numel()); }
  F32 wr(Tensor& t) { return wr(t.raw(), t.numel()); }
  F32 acc(Tensor& t) { return acc(t.raw(), t.numel()); }
  // A parameter's values and its gradient (null when frozen) in float32.
  F32 pw(const Parameter& q) { return half() ? rd(q.data16, q.numel) : F32(nullptr, -1, q.data, nullptr, 0); }
  F32 pg(const Parameter* q) {
    if (!q) return F32(nullptr, -1, nullptr, nullptr, 0);
    return half() ? acc(q->grad16, q->numel) : F32(nullptr, -1, q->grad, nullptr, 0);
  }
  void finish(int slot, float* f, void* back, int64_t n, F32::Fin fin);
  // Autocast's operands and results (set_amp; without it, the plain views above).
  F32 out16(void* p, int64_t n);        // an op's output autocast makes 16-bit: rounded when the statement ends
  F32 out16(Tensor& t) { return out16(t.raw(), t.numel()); }
  F32 upd16(void* p, int64_t n);        // a 16-bit tensor updated in place (read, then rounded)
  F32 cast16(const void* p, int64_t n);  // a float32 operand autocast casts to 16 bits: a rounded copy
  F32 cast16(const Tensor& t) { return cast16(t.raw(), t.numel()); }
  F32 cw(const Parameter& q) { return amp_ ? cast16(q.data, q.numel) : pw(q); }  // a Linear's weight or bias
  F32 cg(const Parameter* q);           // its gradient: computed apart, rounded once, added into .grad
  F32 cacc(void* p, int64_t n);         // the same into float32 partial sums (acc without autocast)
  // A collective `op(dst, src, dtype)` on a tensor autocast makes 16-bit: moved in 16 bits (narrowed
  // into a 16-bit buffer, widened back into dst's nd floats); without autocast op runs on dst and src.
  void wire16(void* dst, int64_t nd, const void* src, int64_t ns, const std::function<void(void*, const void*, DType)>& op);
  int64_t wire_esz() const { return amp_ ? 2 : esz(); }  // bytes per element of such a tensor on the wire
  // The 16-bit format the attention's inner ops round to under autocast, or null (--precision's
  // attention computes in float32 between its 16-bit q, k, v and its rounded outputs).
  const HalfFormat* round16() const { return amp_ ? &amp_hf_ : nullptr; }
  int claim(int64_t n);  // a free float32 scratch slot of at least n floats
  // Frees the scratch at the end of each pass: a pipeline's micro-batches in flight each hold a
  // GptCore, and none keeps float32 scratch between its passes.
  void drop_scratch();
  bool half() const { return adt_ != DType::F32; }
  int64_t esz() const { return half() ? 2 : 4; }  // bytes per element of the tensors here
  static void* off(void* p, int64_t e, int64_t esz) { return static_cast<char*>(p) + e * esz; }
  void* at(void* p, int64_t e) const { return off(p, e, esz()); }
  const void* at(const void* p, int64_t e) const { return static_cast<const char*>(p) + e * esz(); }
  // l: a block of the model; its saved tensors' index here.
  size_t local(int l) const { return static_cast<size_t>(l - r_.first_block()); }
  size_t slot(int l) const { return checkpointing_ ? 0 : local(l); }
  bool tp() const { return tp_.degree > 1; }
  bool sp() const { return tp_.degree > 1 && tp_.sequence_parallel; }
  // A row-parallel Linear's bias gradient comes apart from its matmul's (in I, from the residual's
  // gradient): summed over the group under SP, a float32 sum under autocast (the add after the sum).
  bool row_bias_apart() const { return sp() || (amp_ && tp()); }
  // Sequence parallelism's moves between this rank's positions (B x T/t rows, each `w` wide) and all
  // of them (B x T rows): the all-gather into `full`, the reduce-scatter of `full`'s partial sums into
  // `local`, and this rank's rows of a whole tensor.
  // (`is16`: a tensor autocast makes 16-bit, moved in 16 bits; see wire16.)
  const void* seq_gather(void* full, const void* local, int64_t w, int layer, bool is16 = false);
  void seq_reduce_scatter(void* local, const void* full, int64_t w, int layer, bool is16 = false);
  void seq_rows(void* local, const void* full, int64_t w, int64_t esz) const;
  // A row-parallel Linear's output (g): the matmul of this rank's columns, summed over the TP group
  // (all-reduce, or reduce-scatter under sequence parallelism), then the bias; residual_rows() x C.
  const void* row_parallel(const void* in, const Parameter& w, const Parameter& b, int64_t width, int layer);
  // A column-parallel Linear's input gradient `d` (B*T x C partial sums) summed over the group (f's
  // backward: all-reduce in place, or reduce-scatter); residual_rows() x C.
  const void* column_input_grad(void* d, int layer);
  // LayerNorm's backward into dinp and the parameters wi, bi; under sequence parallelism their
  // gradients are partial: summed over the group before they are added.
  void ln_backward(std::vector<Parameter>& p, void* dinp, int wi, int bi, const void* dout, const void* inp,
                   const float* mean, const float* rstd, int layer);
  // Sequence parallelism's partial parameter gradients: `part` holds this rank's sums for each of
  // `into`'s gradients in turn; one all-reduce over the TP group, then each is added to its gradient.
  // `into`: the gradients, as the parameters holding them.
  void add_group_sum(void* part, int layer, std::initializer_list<std::pair<const Parameter*, int64_t>> into);
  bool frozen() const { return lora_.params != nullptr; }
  int adapter(int l) const { return frozen() ? lora_.a_of_block[local(l)] : -1; }  // block l's lora_A, or -1
  // c_attn's adapter: out += scaling (in A^T) B^T over BT rows.
  void lora_forward(int l, void* out, const void* in);
  // With ds = scaling dout and t = in A^T (recomputed): dB += ds^T t, dt = ds B, dA += dt^T in (a
  // partial sum under TP, all-reduced), dinp += dt A. `weights` false: only dinp (ZB's I); dinp null:
  // only the weights (its W).
  void lora_backward(int l, void* dinp, const void* dout, const void* in, bool weights, int layer);
  // Indices into the stage's parameters.
  int pi(int l, GptParamIndex::Block k) const { return boff_[local(l)] + k; }
  std::vector<int> boff_;  // each of the stage's blocks' first parameter
  bool checkpointing_ = false;
  bool checkpointed_alloc_ = false;  // the layout the buffers were allocated for
  GptSpec s_;
  GptRange r_;
  TensorParallelSpec tp_;
  TensorParallelComm* comm_ = nullptr;
  int block0_ = 0, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;  // head_: the weight lm_head reads
  GptAdapters lora_;
  const void* x_ = nullptr;  // a stage's input (B*T, C), when it does not embed
  DType adt_ = DType::F32;   // the saved tensors' dtype (16 bits under mixed precision)
  HalfFormat hf_ = HalfFormat::BF16;
  bool amp_ = false;  // autocast (set_amp): its 16-bit format and dtype
  HalfFormat amp_hf_ = HalfFormat::BF16;
  DType amp_dt_ = DType::BF16;
  // Mixed precision: float32 scratch for the operands of one op (busy while an F32 holds it), the
  // logits widened for the loss, dlogits rounded, and attention()'s widened copy.
  std::vector<Tensor> pool_;
  std::vector<char> busy_;
  Tensor logits32_, dlogits16_;  // (autocast: dlogits16_ holds the rounded values in float32)
  Tensor dy16_;                  // autocast: the residual gradient rounded, as it reaches a 16-bit output
  MemoryTracker* tracker_;
  Device& dev_;
  int64_t B_ = 0, capacity_ = 0;
  const int64_t* idx_ = nullptr;
  // Saved for backward (llm.c's ActivationTensors), per block (one shared set when checkpointing;
  // res3_, the block outputs, always per block).
  Tensor encoded_;                       // (BT, C) block 0's input (a stage that embeds)
  std::vector<Tensor> ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, atty_, res2_, ln2_, ln2_mean_, ln2_rstd_, fch_,
      fch_gelu_, res3_;
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_;
  // Backward scratch.
  Tensor dres_, dbuf_, dqkv_, dfch_, datt_;
  // Sequence parallelism: a gathered LayerNorm output (B*T, C), the all-gather/reduce-scatter layout
  // (t, B, T/t, C), a gathered output gradient, this rank's rows of a sum, ln_f's gathered output,
  // this rank's rows of dlogits, and the partial parameter gradients (wte's kept from the head to the
  // embedding).
  Tensor full_, perm_, dfull_, dloc_, lnf_full_, dlogits_local_, part_, wte_part_, moe_part_;
  // LoRA: x A^T and its gradient (2 x B*T x r), the scaled output (or its gradient), B*T x 3C/t, the
  // adapter's input gradient (B*T x C), and A's partial gradient under TP (r x C).
  Tensor lora_t_, lora_u_, lora_dx_, lora_part_;
  Tensor tokens_;  // the last forward's token ids (B x T), copied: idx_ points here
  // MoE blocks (per slot, as the other saved tensors): the router's logits (BT, E), and the permuted
  // rows (BT x K at most): each expert's input (x), c_fc's output and GELU's (fch_, fch_gelu_ at that
  // size) and its output (y). moe_dx_: the backward's permuted input gradient (BT x K, C).
  std::vector<Tensor> moe_logits_, moe_x_, moe_y_;
  std::vector<MoeRoute> routes_;         // per slot
  std::vector<MoeRouting> moe_stats_;    // per block of the stage (empty for a dense one)
  // Per block of the stage: at most kMoeHistory, oldest first (shared: share_moe_history).
  std::shared_ptr<std::vector<std::vector<MoePoint>>> moe_history_ = std::make_shared<std::vector<std::vector<MoePoint>>>();
  bool recomputing_ = false;             // a checkpointed block's forward again, inside the backward
  Tensor moe_dx_;
  float aux_grad_scale_ = 1.0f;
  ExpertParallelComm* ep_comm_ = nullptr;
  // Context parallelism (gpt_context.cpp): this rank's positions, the group's, each block's saved
  // log-sum-exp (ring: (B, H, T/c) float32) or gathered q, k, v (Ulysses: (B, T, 3C/c)), and the
  // travelling blocks and all-to-all buffers.
  ContextParallelComm* cp_comm_ = nullptr;
  std::vector<std::vector<int64_t>> cp_pos_;  // group rank -> its positions
  std::vector<Tensor> cp_lse_, cp_qkv_;
  Tensor cp_a_, cp_b_, cp_c_, cp_d_, cp_y_;
  std::vector<CpPass> cp_passes_;  // per block of the stage
  std::vector<CpPass> cp_prev_passes_;  // per block of the stage: its pass before the latest
  int cp_block_ = -1;
  bool cp() const { return s_.cp.on(); }
  CpPass start_ring(size_t k, bool backward);  // the own K/V into cp_a_, and an empty record
  void ring_attention_forward(size_t k, int l);
  void ring_attention_backward(size_t k, int l, const void* dy);  // into dqkv_
  void ulysses_forward(size_t k, int l);
  void ulysses_backward(size_t k, int l, const void* dy);  // into dqkv_
  // The rank's residual rows in runs of consecutive positions: fn(first row of a sample's rows, rows,
  // first position), in row order (one run unless zigzag's two chunks both fall in the rows).
  template <class Fn>
  void position_runs(Fn fn) const;
  // ZB's I keeps, per block, the output gradients of mlp.c_proj, c_fc, attn.c_proj and c_attn, and
  // the head's dlogits, for W.
  std::vector<std::array<Tensor, 4>> douts_;
  Tensor dlogits_kept_;
};

// nanoGPT's GPT.generate (sample.py's defaults: temperature 0.8, top_k 200): n new tokens after
// `prompt`, each from the last position's logits over at most ctx tokens of context, divided by the
// temperature, all but the top_k largest set to -inf (top_k 0: none), softmax, one draw from an
// mt19937_64 seeded with `seed` (torch.multinomial's own stream is not reproduced). A prompt shorter
// than ctx is padded after its end with token 0: the causal mask keeps the padding out of every
// position the sample reads. dtlab::Error for an empty prompt or a token outside the vocabulary.
std::vector<int32_t> gpt_generate(Model& model, const std::vector<int32_t>& prompt, int64_t n, float temperature, int64_t top_k,
                                  uint64_t seed);

}  // namespace dtlab
