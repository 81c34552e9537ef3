// nanoGPT's GPT inside a Model (docs/course_sources.md §6g): token and position embeddings, L
// pre-LayerNorm blocks (ln_1, causal self-attention with a fused c_attn (3C x C) and c_proj, ln_2, MLP
// c_fc (4C x C) -> GELU (erf) -> c_proj), ln_f, and lm_head tied to wte; no dropout; LayerNorm eps
// 1e-5; the loss (outside, as for the MLP) is the mean cross-entropy over all B x T positions.
//
// Parameters are named and ordered as nanoGPT's named_parameters() lists them (the tied lm_head once,
// as transformer.wte.weight) and live in the Model's flat buffers, so DDP's buckets, the optimizers
// and checkpoints see them as they see the MLP's. The forward and backward follow llm.c's layout
// (one activation buffer per saved tensor) with the ops nanoGPT runs; the matmuls are the device's
// Linear (OpenBLAS on the CPU), the rest are loops here. A pipeline stage runs a range of its layers
// (GptRange). CPU only in this version: the GPU kernels are the GPU part of the transformer work.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "engine/core/gpt_spec.h"
#include "engine/core/model.h"

namespace dtlab {

// Indices into the parameter list (nanoGPT's named_parameters() order).
struct GptParamIndex {
  static constexpr int kWte = 0, kWpe = 1;
  static constexpr int kPerBlock = 12;
  enum Block : int { Ln1W, Ln1B, AttnW, AttnB, AttnProjW, AttnProjB, Ln2W, Ln2B, FcW, FcB, FcProjW, FcProjB };
  static int block(int l, Block k) { return 2 + kPerBlock * l + k; }
  static int ln_f_weight(int layers) { return 2 + kPerBlock * layers; }
  static int ln_f_bias(int layers) { return 3 + kPerBlock * layers; }
};

// The parameter table (names, shapes, offsets in the flat buffers; data and grad left null).
std::vector<Parameter> gpt_parameters(const GptSpec& spec);

// Its parameters, in named_parameters() order (the whole model: gpt_parameters()), flat in that order.
// A last stage without the embeddings holds the head's own copy of the tied weight, named nanoGPT's
// `lm_head.weight` (Megatron's shared embedding on the last stage: it starts equal to wte, and the
// embedding group all-reduces the two gradients, so the two copies stay equal).
std::vector<Parameter> gpt_stage_parameters(const GptSpec& spec, GptRange range);
// Where each of the stage's parameters (gpt_stage_parameters order) sits in the whole model's flat
// buffer (gpt_parameters' offsets): the same name, and the head's copy at wte's. Stage values come
// from a whole model's as values[p.offset + i] = whole[source[k] + i], and go back the same way.
std::vector<int64_t> gpt_stage_sources(const GptSpec& spec, GptRange range);

// nanoGPT's initial values for torch.manual_seed(seed) and GPT(config), flat in gpt_parameters()'
// order: the constructors' draws (nn.Embedding's normal_, nn.Linear's kaiming_uniform_ and bias
// uniform_, in construction order, lm_head last), then _init_weights applied module by module
// (children first: normal_(0, 0.02) for every Linear weight and Embedding, zero biases; the tied
// weight takes lm_head's draw, made last), then c_proj.weight again with std 0.02/sqrt(2L). torch's CPU
// normal_ on 16 or more floats: 24-bit uniforms, Box-Muller on each 16 (the first 8 with the next 8),
// and the last 16 drawn again when the count is not a multiple of 16. torch's AVX2 build computes
// log/cos/sin with SLEEF, so its values may differ from these in the last bit.
std::vector<float> gpt_init_values(const GptSpec& spec, uint64_t seed);

// Layer numbers the GPT reports to observers and gates: 0 the embeddings, 1..L the blocks, L + 1 the
// final LayerNorm and the head.
class GptCore {
 public:
  // `range`: a pipeline stage's layers (default: the whole model); `params` below are then
  // gpt_stage_parameters(spec, range).
  GptCore(const GptSpec& spec, MemoryTracker* tracker, Device& device, GptRange range = {});
  // idx: B x T token ids on the host, each in [0, vocab) (checked by the caller). Returns the logits
  // (B*T, V), owned here. A stage without the embeddings reads `x` (B*T, C), the previous stage's
  // output, instead (kept by the caller until backward); one without the head returns its last
  // block's output (B*T, C), owned here.
  // `hooks` (FSDP) see each layer before its parameters are read and after it is done.
  const float* forward(std::vector<Parameter>& params, const int64_t* idx, int64_t B, ComputeObserver* obs,
                       LayerGate* gate, LayerHooks* hooks = nullptr, const float* x = nullptr);
  // dlogits (B*T, V) of the last forward (a stage without the head: the gradient of its output,
  // (B*T, C)). Parameter gradients accumulate (as torch's .grad); the hook
  // sees each parameter once its gradient is final, in autograd's order: ln_f, the blocks from the
  // last (within one: mlp.c_proj, c_fc, ln_2, attn.c_proj, c_attn, ln_1; bias before weight), wpe,
  // and wte last (the tied weight's two uses are summed before its hook). Returns the gradient of a
  // stage's input `x` (B*T, C), owned here; null where the stage embeds.
  const float* backward(std::vector<Parameter>& params, const float* dlogits, const Model::GradReadyHook& ready,
                        ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks = nullptr);
  // Frees the saved activations (a pipeline micro-batch after its backward); the next forward
  // allocates them again.
  void release();
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
  // The attention probabilities of the last forward: block l, sample b, head h, (T, T) row-major with
  // zeros above the diagonal. Null before a forward.
  const float* attention(int l, int64_t b, int64_t h) const;  // null while checkpointing: no block keeps it
  // The last forward's input tokens of sample b (T ids; null before a forward).
  const int64_t* tokens(int64_t b) const { return idx_ && b >= 0 && b < B_ ? idx_ + b * s_.ctx : nullptr; }
  // FLOPs of one forward of layer `layer` (0..L+1) for B samples, multiply-adds counted twice (the
  // backward is twice that).
  double layer_flops(int layer, int64_t B) const;

 private:
  void ensure(int64_t B);
  std::array<std::vector<Tensor>*, 13> per_block();  // the per-block saved tensors below
  // Block l's forward from `x` into its buffers (slot(l)) and res3_[l].
  void block_forward(std::vector<Parameter>& p, int l, const float* x);
  // l: a block of the model; its saved tensors' index here.
  size_t local(int l) const { return static_cast<size_t>(l - r_.first_block()); }
  size_t slot(int l) const { return checkpointing_ ? 0 : local(l); }
  // Indices into the stage's parameters.
  int pi(int l, GptParamIndex::Block k) const { return block0_ + GptParamIndex::kPerBlock * (l - r_.first_block()) + k; }
  bool checkpointing_ = false;
  bool checkpointed_alloc_ = false;  // the layout the buffers were allocated for
  GptSpec s_;
  GptRange r_;
  int block0_ = 0, lnf_w_ = -1, lnf_b_ = -1, head_ = -1;  // head_: the weight lm_head reads
  const float* x_ = nullptr;  // a stage's input (B*T, C), when it does not embed
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
