// nanoGPT's GPT inside a Model (docs/course_sources.md §6g): token and position embeddings, L
// pre-LayerNorm blocks (ln_1, causal self-attention with a fused c_attn (3C x C) and c_proj, ln_2, MLP
// c_fc (4C x C) -> GELU (erf) -> c_proj), ln_f, and lm_head tied to wte; no dropout; LayerNorm eps
// 1e-5; the loss (outside, as for the MLP) is the mean cross-entropy over all B x T positions.
//
// Parameters are named and ordered as nanoGPT's named_parameters() lists them (the tied lm_head once,
// as transformer.wte.weight) and live in the Model's flat buffers, so DDP's buckets, the optimizers
// and checkpoints see them as they see the MLP's. The forward and backward follow llm.c's layout
// (one activation buffer per saved tensor) with the ops nanoGPT runs; the matmuls are the device's
// Linear (OpenBLAS on the CPU), the rest are loops here. CPU only in this version: the GPU kernels
// are the GPU part of the transformer work.
#pragma once
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
  GptCore(const GptSpec& spec, MemoryTracker* tracker, Device& device);
  // idx: B x T token ids on the host, each in [0, vocab) (checked by the caller). Returns the logits
  // (B*T, V), owned here.
  // `hooks` (FSDP) see each layer before its parameters are read and after it is done.
  const float* forward(std::vector<Parameter>& params, const int64_t* idx, int64_t B, ComputeObserver* obs,
                       LayerGate* gate, LayerHooks* hooks = nullptr);
  // dlogits (B*T, V) of the last forward. Parameter gradients accumulate (as torch's .grad); the hook
  // sees each parameter once its gradient is final, in autograd's order: ln_f, the blocks from the
  // last (within one: mlp.c_proj, c_fc, ln_2, attn.c_proj, c_attn, ln_1; bias before weight), wpe,
  // and wte last (the tied weight's two uses are summed before its hook).
  void backward(std::vector<Parameter>& params, const float* dlogits, const Model::GradReadyHook& ready,
                ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks = nullptr);
  int64_t batch() const { return B_; }
  // The attention probabilities of the last forward: block l, sample b, head h, (T, T) row-major with
  // zeros above the diagonal. Null before a forward.
  const float* attention(int l, int64_t b, int64_t h) const;
  // The last forward's input tokens of sample b (T ids; null before a forward).
  const int64_t* tokens(int64_t b) const { return idx_ && b >= 0 && b < B_ ? idx_ + b * s_.ctx : nullptr; }
  // FLOPs of one forward of layer `layer` (0..L+1) for B samples, multiply-adds counted twice (the
  // backward is twice that).
  double layer_flops(int layer, int64_t B) const;

 private:
  void ensure(int64_t B);
  GptSpec s_;
  MemoryTracker* tracker_;
  Device& dev_;
  int64_t B_ = 0, capacity_ = 0;
  const int64_t* idx_ = nullptr;
  // Saved for backward (llm.c's ActivationTensors), per block where it says so.
  Tensor encoded_;                       // (BT, C) block 0's input
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
