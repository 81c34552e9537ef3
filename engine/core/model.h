// The model: `mlp:D0,D1,...,Dk`, a Linear/ReLU stack laid out exactly like
// torch.nn.Sequential(Linear(D0,D1), ReLU(), ..., Linear(Dk-1,Dk)): same parameter names
// ("0.weight" (D1, D0), "0.bias", "2.weight", ...), order, layouts, and the same initial values as
// torch.manual_seed(seed) followed by that constructor (torch's mt19937 stream, kaiming_uniform_
// with a=sqrt(5), bias uniform in +-1/sqrt(fan_in)).
//
// Parameters and gradients live in two flat buffers in parameters() order, so an optimizer (or a
// sharded one) works on one contiguous range and a checkpoint is a set of views. Each Parameter's
// `grad` pointer can be rebound (DDP's gradient_as_bucket_view) and the kernels follow it.
//
// Every buffer (parameters, gradients, activations) lives on the model's device and every layer runs
// there (engine/core/device.h): the same model is the CPU engine's and the GPU's. Parameter pointers
// and forward()/backward()'s arguments are that device's memory; download_params()/upload_params()
// move the values to and from the host (checkpoints, evaluation, parity checks).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/gpt_spec.h"
#include "engine/core/half.h"
#include "engine/core/mesh.h"
#include "engine/core/observer.h"
#include "engine/core/tensor.h"

namespace dtlab {

class GptCore;

// The largest model ModelSpec::parse accepts (parameters): 16 GiB of float32 for one copy.
inline constexpr int64_t kMaxModelParams = int64_t{1} << 32;

struct ModelSpec {
  std::vector<int64_t> dims;  // D0 (input features) ... Dk (classes); empty for a GPT
  GptSpec gpt;                // nanoGPT's GPT (engine/core/gpt.h); empty for an MLP

  // Parses "mlp:2,64,64,3", "gpt:layers=..." or a GPT preset; throws dtlab::Error with a how-to-fix
  // sentence on bad text.
  static ModelSpec parse(std::string_view text);
  std::string str() const;  // "mlp:2,64,64,3"
  bool is_gpt() const { return !gpt.empty(); }
  // A sample's width and the classes: for the GPT, its ctx tokens and its vocabulary.
  int64_t in_features() const { return is_gpt() ? gpt.ctx : dims.front(); }
  int64_t out_features() const { return is_gpt() ? gpt.vocab : dims.back(); }
  // Rows of logits per sample: one, or for the GPT one per position (ctx).
  int64_t rows_per_sample() const { return is_gpt() ? gpt.ctx : 1; }
  int64_t num_params() const;
};

struct Parameter {
  std::string name;   // torch state_dict key, e.g. "2.weight"
  Shape shape;        // "N.weight": (out, in); "N.bias": (out,)
  int64_t offset = 0; // first element in the flat parameter/gradient buffers
  int64_t numel = 0;
  float* data = nullptr;  // params() + offset (device memory)
  float* grad = nullptr;  // grads() + offset unless rebound (device memory)
  // Mixed precision (Model::set_precision): the 16-bit parameter and gradient; data and grad are null.
  uint16_t* data16 = nullptr;
  uint16_t* grad16 = nullptr;
};

enum class LayerKind : uint8_t { Linear, ReLU };

// Megatron tensor parallelism inside the model (engine/core/mesh.h has the split): this rank's place in
// its TP group. degree 1 is the plain model.
struct TensorParallelSpec {
  int degree = 1;
  int rank = 0;                    // in the TP group
  bool sequence_parallel = false;  // g/f become reduce-scatter/all-gather along the batch rows
};

// The TP group's collectives as the model's layers need them: blocking, sums, on the model's device,
// in the dtype the layers compute in (float32, or the 16-bit dtype of a mixed-precision model: torch
// all-reduces a bf16 activation as bf16). Implemented above the core (engine/parallel/tensor_parallel.h)
// over a process group. `layer` is the Sequential index of the layer that asks (for events and labels).
class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  virtual void all_reduce(void* buf, int64_t n, DType dtype, int layer) = 0;
  virtual void all_gather(void* out, const void* in, int64_t n, DType dtype, int layer) = 0;      // out: n x degree
  virtual void reduce_scatter(void* out, const void* in, int64_t n, DType dtype, int layer) = 0;  // in: n x degree
  void all_reduce(float* buf, int64_t n, int layer) { all_reduce(buf, n, DType::F32, layer); }
  void all_gather(float* out, const float* in, int64_t n, int layer) { all_gather(out, in, n, DType::F32, layer); }
  void reduce_scatter(float* out, const float* in, int64_t n, int layer) { reduce_scatter(out, in, n, DType::F32, layer); }
};

// An MoE layer's expert-parallel group (GptCore; MoeSpec::ep): its dispatch and combine, implemented
// above the core (engine/parallel/expert_parallel.h) over a process group. all_to_all: block j of `in`
// (count elements) to group rank j, block i of `out` from rank i. all_to_all_v: send_counts[j]
// elements of `in` (packed in rank order) to rank j, recv_counts[i] from rank i into `out` (packed).
// `layer` names the block that asks (events and labels).
class ExpertParallelComm {
 public:
  virtual ~ExpertParallelComm() = default;
  virtual void all_to_all(void* out, const void* in, int64_t count, DType dtype, int layer) = 0;
  virtual void all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in,
                            const std::vector<int64_t>& send_counts, DType dtype, int layer) = 0;
};

// A GPT's context-parallel group (GptCore; GptSpec::cp): ring attention's K/V steps and Ulysses'
// all-to-alls, implemented above the core (engine/parallel/context_parallel.h) over a process group.
// send_recv: `n` elements of `send` to group rank `to` and `n` from rank `from` into `recv`, as one
// step (every rank of the ring makes its own at the same time). all_to_all: block j of `in` (count
// elements) to group rank j, block i of `out` from rank i.
class ContextParallelComm {
 public:
  virtual ~ContextParallelComm() = default;
  virtual void send_recv(void* recv, int from, const void* send, int to, int64_t n, DType dtype, int layer) = 0;
  virtual void all_to_all(void* out, const void* in, int64_t count, DType dtype, int layer) = 0;
  // A sum over the group in place (an MoE router's token counts: Megatron's tp_cp group).
  virtual void all_reduce(void* data, int64_t n, DType dtype, int layer) = 0;
};

// Called around every layer's forward and backward (FSDP gathers a unit's parameters before its
// first layer runs and frees or reduce-scatters after its last).
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  virtual void before_forward(int layer) {}
  virtual void after_forward(int layer) {}
  virtual void before_backward(int layer) {}
  virtual void after_backward(int layer) {}
  // Around a layer's forward run again in backward (activation checkpointing); by default the
  // forward's hooks (FSDP gathers the unit's parameters again, without prefetching the next unit).
  virtual void before_recompute(int layer) { before_forward(layer); }
  virtual void after_recompute(int layer) { after_forward(layer); }
};

struct Layer {
  LayerKind kind;
  int seq_index;              // position in torch.nn.Sequential (the N in "N.weight")
  int64_t in_features;         // this rank's widths: a column-parallel Linear's out_features and a
  int64_t out_features;        // row-parallel one's in_features are the full width / TP degree
  int weight = -1, bias = -1; // indices into parameters(); -1 for ReLU
  TpRole tp = TpRole::Replicated;  // Linear: its tensor-parallel split; ReLU: its Linear's
  int lora_a = -1, lora_b = -1;    // LoRA: this Linear's adapters in parameters(); -1 when not adapted
};

// LoRA (Hu et al. 2021; peft's LoraConfig defaults; docs/course_sources.md §6d): each adapted Linear
// computes x W^T + b + scaling * (x A^T) B^T with W and b frozen, A (r, in) kaiming-uniform and B
// (out, r) zero at the start, scaling = alpha / r.
struct LoraSpec {
  int rank = 0;              // r; 0: no LoRA
  float alpha = 8.0f;        // peft's lora_alpha default
  std::vector<int> layers;   // Sequential indices of the adapted Linears (a GPT's: its blocks, peft's
                             // layers_to_transform); empty: every Linear (every block's c_attn)
  float scaling() const { return alpha / static_cast<float>(rank); }
  bool adapts(int seq_index) const;
};

class Model {
 public:
  // Called during backward() once a parameter's gradient is final for this pass, in the order
  // gradients are produced: last layer first, bias before weight within a layer (torch's autograd
  // order for Linear, as DDP's rebuilt buckets show: "5 4 3 2 1 0").
  using GradReadyHook = std::function<void(int param_index)>;

  // A GPT spec builds nanoGPT's GPT (engine/core/gpt.h) whole: forward_tokens() and backward() run
  // it (LoRA: enable_lora; 16 bits: set_precision; the per-layer calls are the MLP's). Its pipeline stages
  // come from the stage constructor below with a GptRange's first and end, and run through
  // gpt_activations()/gpt_forward()/gpt_backward(); its tensor-parallel shards from the TP constructor
  // (GptCore says how the blocks split; dtlab::Error when the heads, or under sequence parallelism
  // the context, do not divide by the degree).
  Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, Device& device = cpu_device());
  ~Model();
  // A pipeline stage: only Linear layers [first_linear, end_linear) of `spec` (each with the ReLU
  // after it), under the full model's names ("2.weight") and with the values the full model gets
  // from the same seed. The flat buffers hold just these parameters, in the full model's order.
  Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
        Device& device = cpu_device());
  // A tensor-parallel shard of that stage (or of the whole model: first 0, end spec.dims.size() - 1):
  // each Linear holds tp_slice()'s part of the full model's values for the same seed, parameters()
  // have the local shapes (names unchanged), and the layers call `set_tensor_parallel_comm`'s
  // collectives (f, g) inside layer_forward/layer_backward, so forward() and backward() take and
  // return the full batch's tensors on every TP rank exactly as the unsplit model does.
  // dtlab::Error (check_tp_widths) when a split width does not divide by the degree.
  Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
        Device& device, const TensorParallelSpec& tp);
  const TensorParallelSpec& tensor_parallel() const { return tp_; }
  // LoRA: freezes the current weights and biases (moved to a buffer tracked as parameters, with no
  // gradient) and makes parameters() and the flat buffers hold only the adapters, "N.lora_A.weight"
  // (r, in) and "N.lora_B.weight" (out, r) in layer order, so DDP, FSDP and the optimizers cover only
  // them. A's values: lora_init_values(). On a tensor-parallel shard the adapters are split so that
  // they ride the base layer's f and g (TP-aware LoRA, docs/course_sources.md §6c): a column-parallel
  // Linear's A (r, in) is whole on every rank and its B (out/T, r) holds this rank's output rows; a
  // row-parallel Linear's A (r, in/T) holds this rank's input columns and its B (out, r) is whole; a
  // replicated Linear's are whole. The values are the one-rank LoRA model's slices (tp_pieces). The
  // whole factor's gradient comes from partial sums (the column layer's dt = ds B is split over the
  // output rows, the row layer's x A^T over the input columns), so backward all-reduces it over the TP
  // group. Under sequence parallelism the column layer's adapters see the gathered rows, the row
  // layer's add to the partial output the reduce-scatter sums, and a replicated Linear's see this
  // rank's rows only, so their gradients are summed over the group too (as its weight's). dtlab::Error
  // for a bad rank or layer list; call once, on a model that owns its parameters.
  void enable_lora(const LoraSpec& lora, uint64_t seed);
  bool lora() const { return lora_.rank > 0; }
  const LoraSpec& lora_spec() const { return lora_; }
  // The frozen "N.weight"/"N.bias" under LoRA (empty without): their data is device memory, grad null.
  const std::vector<Parameter>& base_parameters() const { return base_; }
  // What a GPT's passes read: its parameters, or under LoRA the frozen base (the adapters ride in GptCore).
  std::vector<Parameter>& gpt_params() { return lora() ? base_ : params_; }
  // DataParallel's replicas under LoRA: torch's replicate() copies every parameter of the module,
  // frozen ones included, so a replica allocates the frozen base for a forward (contents left to
  // the broadcast) and frees it with the replica. No-ops without LoRA.
  void release_frozen_storage();
  void restore_frozen_storage();
  // The weight and bias a Linear computes with (frozen under LoRA), and its trainable parameters.
  const Parameter& weight_of(const Layer& L) const { return lora() ? base_[L.weight] : params_[L.weight]; }
  const Parameter& bias_of(const Layer& L) const { return lora() ? base_[L.bias] : params_[L.bias]; }
  std::vector<int> trainable_of(const Layer& L) const;
  // Host copy of the plain model's parameters (the torch.nn.Sequential layout): under LoRA each
  // adapted weight is merged, W + scaling * B A (peft's merge_and_unload), the biases as they are.
  std::vector<float> merged_params() const;
  void set_tensor_parallel_comm(TensorParallelComm* c);
  // An expert-parallel GPT's EP group (GptCore::set_ep_comm; the spec's moe.ep > 1).
  void set_expert_parallel_comm(ExpertParallelComm* c);
  // A context-parallel GPT's CP group (GptCore::set_cp_comm; the spec's cp.degree > 1).
  void set_context_parallel_comm(ContextParallelComm* c);
  // A GPT's share of the sequence (GptSpec::cp): the layers rebuilt for it, the parameters unchanged
  // (the trainer splits a replica's sequence, and makes it whole again for evaluation).
  void set_context_parallel(const ContextParallelSpec& cp);
  // The layers of the last context-parallel split: the live ones, or after the split was dropped
  // those it ran with (their ring passes kept, activations freed) for the lab and the tests.
  const GptCore* context_parallel_core() const;

  Device& device() const { return device_; }
  // All parameters, flat in parameters() order, to or from host memory (P floats).
  void download_params(float* host) const;
  std::vector<float> host_params() const;
  void upload_params(const float* host);

  const ModelSpec& spec() const { return spec_; }
  int first_linear() const { return first_linear_; }  // 0 unless a pipeline stage
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer& layer(int i) const { return layers_[static_cast<size_t>(i)]; }
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  int find_parameter(std::string_view name) const;  // -1 if absent
  int64_t num_params() const { return num_params_; }
  float* params() { return flat_params_.empty() ? nullptr : flat_params_.f32(); }
  const float* params() const { return flat_params_.empty() ? nullptr : flat_params_.f32(); }
  // The flat gradient buffer; null once release_gradient_storage() gave it up.
  float* grads() { return flat_grads_.empty() ? nullptr : flat_grads_.f32(); }
  void zero_grad();  // zeroes every parameter's current grad target
  // After every Parameter::grad was rebound elsewhere (DDP's gradient_as_bucket_view), frees the
  // model's own gradient buffer: that is the memory the option saves.
  void release_gradient_storage();
  // FSDP: frees the model's own parameter (and gradient) buffers; every Parameter's data and grad
  // (data16 and grad16 under mixed precision) then point wherever the sharding puts them (null while
  // not gathered). restore_storage() allocates them again, in param_dtype(), and copies `full` (the
  // flat parameters in that dtype, on the model's device) in; null leaves them for the caller to
  // fill (DataParallel's replicas receive them by broadcast).
  void release_parameter_storage();
  void restore_storage(const void* full);
  bool owns_parameters() const { return !flat_params_.empty(); }
  void set_layer_hooks(LayerHooks* h) { hooks_ = h; }
  // The layer numbers LayerHooks and gates see: num_layers() for the MLP; for the GPT, L + 2 (0 the
  // embeddings, 1..L the blocks, L + 1 ln_f and the head).
  int hook_layers() const;
  // FSDP's auto-wrap units (engine/parallel/fsdp.h), each a contiguous range of the flat buffers:
  // the MLP's Linears with trainable parameters, one each; the GPT's blocks, one each, after the root
  // unit (wte, wpe, ln_f), which spans the first and the last layer, as torch's transformer
  // auto-wrap policy leaves those to the root FSDP instance.
  struct WrapUnit {
    std::vector<int> params;  // parameters() indices, storage order
    std::vector<int> layers;  // hook layers whose forward and backward use them (first and last bound the unit)
    bool root = false;        // the root instance: FSDP1 keeps its parameters from forward to backward
  };
  std::vector<WrapUnit> wrap_units() const;
  // Where a stepped run pauses: forward() and backward() (and a pipeline stage's own loops, through
  // gate_layer) call it before each Linear's forward and backward (null: no gates).
  void set_layer_gate(LayerGate* g) { gate_ = g; }
  void gate_layer(int i, bool backward) const {
    if (gate_ && layers_[static_cast<size_t>(i)].kind == LayerKind::Linear) gate_->before_layer(layers_[static_cast<size_t>(i)].seq_index, backward);
  }

  // A branch in the model (the "unused parameters" lesson): while set, forward() bypasses the
  // Linear at Sequential index `seq_index` and the ReLU after it (output = input), so that layer's
  // parameters get no gradient. The Linear must be square. -1 clears it.
  void set_skipped_layer(int seq_index);
  int skipped_layer() const { return skipped_seq_; }
  // Did the last forward() use parameter p? (What DDP's find_unused_parameters learns by walking
  // the autograd graph from the outputs.)
  bool parameter_used(int p) const;

  // One layer, (B, in) -> (B, out). Buffers belong to the caller (pipeline stages, FSDP units).
  void layer_forward(int i, float* out, const float* in, int64_t B);
  // dinp may be null (first layer). `in`/`out` are the layer's forward input and output.
  void layer_backward(int i, float* dinp, const float* dout, const float* in, const float* out,
                      int64_t B);
  // The same backward in two halves, as zero-bubble pipeline schedules run it: the input gradient
  // first (I: it unblocks the previous stage), the weight gradient later (W: accumulated from the
  // same `in` and `dout`, which the caller keeps until then). Together they equal layer_backward.
  void layer_backward_input(int i, float* dinp, const float* dout, const float* out, int64_t B);
  void layer_backward_weight(int i, const float* dout, const float* in, int64_t B);
  // layer_forward run again in backward (activation checkpointing), reported as ComputeKind::Recompute.
  void layer_recompute(int i, float* out, const float* in, int64_t B) { forward_layer_as(i, out, in, B, ComputeKind::Recompute); }
  // The same four on a mixed-precision model (model_half.cpp): `out`, `in`, `dinp` and `dout` hold B
  // rows in param_dtype(), and each layer runs the ops, roundings and 16-bit TP collectives that
  // forward() and backward() run, so a pipeline stage in 16 bits computes what one 16-bit rank does.
  // Tensor parallelism without sequence parallelism, as above.
  void layer_forward16(int i, uint16_t* out, const uint16_t* in, int64_t B, bool recompute = false);
  void layer_backward16(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out, int64_t B);
  void layer_backward_input16(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t B);
  void layer_backward_weight16(int i, const uint16_t* dout, const uint16_t* in, int64_t B);
  // Sequence parallelism in a pipeline stage (engine/parallel/pipeline.cpp), one micro-batch of B rows at a
  // time with several in flight: sp_stage_begin() sets the rows and where the column-parallel Linears'
  // gathered inputs live from the micro-batch's forward to its backward (`gathered`, one per layer, the
  // micro-batch's own; allocated here the first time). The layers then run as forward() and backward() run
  // them, in act_dtype(): outside the pairs each takes and gives this TP rank's rows (sp_stage_rows), so a
  // stage sends the next one its rows only, as Megatron's pipeline sends a sequence-parallel region's.
  void sp_stage_begin(int64_t B, std::vector<Tensor>* gathered);
  int64_t sp_stage_rows(int i, bool output) const { return sp_rows(i, output); }
  int64_t sp_stage_padded_rows() const { return padded_; }
  void sp_stage_split(void* dst, const void* src, int64_t width);                  // this rank's rows of B, zero-padded
  void sp_stage_gather(void* dst, const void* src, int64_t width, int seq_index);  // every rank's: the padded rows
  void sp_stage_forward(int i, void* out, const void* in, bool recompute);
  void sp_stage_backward(int i, void* dinp, const void* dout, const void* in, const void* out);
  // ZB-H1's halves of it. I gives the input gradient and, for a row-parallel Linear, keeps the output gradient
  // it all-gathered in `gout` (padded rows x out; null for the others), which W then takes as its `dout`.
  void sp_stage_backward_input(int i, void* dinp, const void* dout, const void* out, void* gout);
  void sp_stage_backward_weight(int i, const void* dout, const void* in);

  // Whole model with activations owned here (tracked as activations; they grow to the largest
  // batch seen and are reused for smaller ones). `x` (B, D0) must stay alive until backward() returns.
  const float* forward(const float* x, int64_t B);  // returns logits (B, Dk)
  // The GPT's forward: idx (B, T) token ids on the host; returns the logits (B*T, V).
  const float* forward_tokens(const int64_t* idx, int64_t B);
  bool is_gpt() const { return gpt_ != nullptr; }
  GptRange gpt_range() const { return gpt_range_; }  // a GPT's layers here (0 the embeddings .. L + 1 the head)
  const GptCore* gpt() const { return gpt_.get(); }
  // A GPT pipeline stage (built with its GptRange as first_linear/end_linear) keeps one set of saved
  // activations per micro-batch in flight: each is a GptCore of the stage's range that runs on this
  // model's parameters, observer, gate and hooks. x: the previous stage's output where the stage
  // does not embed; the backward returns the gradient of x (null where it embeds).
  std::unique_ptr<GptCore> gpt_activations() const;
  // (Under mixed precision x, a stage's output and the gradients between stages are 16-bit: GptCore::dtype().)
  const void* gpt_forward(GptCore& acts, const int64_t* idx, const void* x, int64_t B);
  const void* gpt_backward(GptCore& acts, const void* dout, const GradReadyHook& on_grad_ready = {});
  // ZB-H1's I and W of one micro-batch (GptCore::backward_input, backward_weight).
  const void* gpt_backward_input(GptCore& acts, const void* dout);
  void gpt_backward_weight(GptCore& acts);
  void backward(const float* dlogits, const GradReadyHook& on_grad_ready = {});
  // A GPT with MoE blocks: the factor its load-balancing losses' gradients take, the one the caller
  // gives the cross-entropy's mean (1 / accumulation steps, times fp16's loss scale; GptCore says
  // more), and their sum in the last forward (0 without MoE).
  void set_aux_grad_scale(float s);
  double aux_loss() const;
  int64_t batch() const { return batch_; }
  // The last forward()'s input (device memory, batch() rows) and layer i's output there; null
  // before the first forward, for a layer the branch bypassed, and under mixed precision (16-bit).
  const float* last_input() const { return input_; }
  const float* layer_output(int i) const {
    return input_ && !half_acts() && !layer_skipped(i) && keeps_output(i) ? acts_[static_cast<size_t>(i)].f32() : nullptr;
  }
  // Rows of layer_output(i): batch() unless sequence parallel, where a layer inside a pair (a
  // column-parallel Linear and its ReLU) holds the padded batch and every other layer this rank's
  // 1/degree of it (engine/core/mesh.h).
  int64_t layer_output_rows(int i) const;

  // Activation checkpointing (torch.utils.checkpoint, non-reentrant, per block: a Linear and the ReLU
  // after it, the last Linear alone; docs/course_sources.md §6d). forward() keeps only each block's
  // output (the next block's input; the first block's input is the caller's x); the Linear's output
  // inside a block goes to one recompute buffer shared by every block. backward() runs each block's
  // forward again into that buffer (reported as ComputeKind::Recompute, the hooks' before/after_recompute
  // around it), then its backward: the same kernels in the same order, so the gradients are
  // bit-identical. On a tensor-parallel shard the blocks are the shard's (a column-parallel Linear and
  // its ReLU, a row-parallel Linear and its ReLU) and the recompute replays their forward collectives
  // (recompute_block; tp_collectives(..., recompute) lists them). layer_output(i) is null for a Linear
  // inside a block while it is on.
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return checkpointing_; }
  // Is layer i's output kept from forward to backward? (Always, unless checkpointing.)
  bool keeps_output(int i) const;

  // Mixed precision (--precision bf16/fp16; docs/course_sources.md §6e), the layout behind the ZeRO
  // paper's 16 bytes: parameters, gradients and activations are stored in 16 bits (the flat buffers
  // and every Parameter's data16/grad16; data and grad become null), and the optimizer keeps the
  // fp32 master weights (Optimizer::step_mixed). Each Linear converts its 16-bit operands to float32,
  // runs the float32 GEMM (fp32 accumulation) and rounds its output once; ReLU works on the 16-bit
  // values. forward() still takes the float32 batch (rounded to 16 bits first, as x.to(bfloat16)) and
  // returns float32 logits (the 16-bit logits widened, so the loss runs in float32); backward() takes
  // float32 dlogits (already multiplied by the loss scale) and rounds them to 16 bits.
  // download_params()/upload_params() convert (checkpoints, evaluation). Call once, before DDP or
  // an optimizer is built; dtlab::Error with one sentence where it does not run in this version (a
  // GPU). A pipeline stage runs its layers one by one through layer_forward16 and the rest.
  // Under LoRA (enable_lora first) the layout is autocast's for a peft model (docs/course_sources.md
  // §6e): the frozen base is stored in 16 bits (from_pretrained(torch_dtype=bfloat16)), the adapters
  // keep float32 values as the optimizer's master copy (peft upcasts trainable adapters to float32)
  // and compute from their 16-bit copy, as autocast casts them for each matmul; their gradients are
  // 16-bit like every parameter's here (the ZeRO layout; autocast's .grad would be float32). An
  // adapted Linear runs peft's ops on 16-bit tensors: lora_A, lora_B, * scaling and the sum each
  // rounded once. With activation checkpointing the
  // kept block outputs and the recompute buffer are 16-bit, and a block recomputes in 16 bits exactly
  // as its forward ran.
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  bool mixed() const { return is_mixed(precision_); }
  // torch.autocast(dtype) (--amp bf16|fp16; docs/course_sources.md §6e): parameters, gradients and the
  // optimizer's state stay float32. Each Linear runs on 16-bit casts of its input, weight and bias (each
  // rounded once from float32), accumulates in float32 and rounds its output to 16 bits, so the
  // activations are 16-bit tensors and ReLU runs on them; the loss widens the logits (cross_entropy is
  // on autocast's float32 list). A Linear's weight and bias gradients come out of its 16-bit backward
  // rounded to 16 bits and are added to the float32 .grad (the cast's backward widens them exactly).
  // A GPT runs nanoGPT's layers under autocast's rules (GptCore::set_amp). Set once, before training,
  // on a model that is not set_precision()'s.
  void set_amp(Precision p);
  bool amp() const { return is_mixed(amp_); }
  // The activations between layers are 16-bit tensors (a GPT's under autocast are not: its residual
  // stream, what a pipeline stage passes on, stays float32).
  bool half_acts() const { return mixed() || (amp() && !gpt_); }
  DType act_dtype() const;                              // their dtype
  HalfFormat half_format() const { return half_format_of(mixed() ? precision_ : amp_); }
  DType param_dtype() const;  // F32, BF16 or F16
  uint16_t* params16() { return mixed() && !flat_params_.empty() ? flat_params_.u16() : nullptr; }
  const uint16_t* params16() const { return mixed() && !flat_params_.empty() ? flat_params_.u16() : nullptr; }
  uint16_t* grads16() { return mixed() && !flat_grads_.empty() ? flat_grads_.u16() : nullptr; }

  // Instrumentation: every layer_forward/layer_backward is reported (null: none).
  void set_observer(ComputeObserver* obs) { observer_ = obs; }
  ComputeObserver* observer() const { return observer_; }
  // FLOPs the cost model charges (multiply-adds count 2).
  double layer_forward_flops(int i, int64_t B) const;
  double layer_backward_flops(int i, int64_t B, bool input_grad) const;
  // Those FLOPs with the bytes the layer moves (op_cost.h): what its compute span reports.
  OpCost layer_forward_cost(int i, int64_t B) const;
  OpCost layer_backward_cost(int i, int64_t B, bool input_grad) const;

 private:
  void ensure_activations(int64_t B);
  void forward_layer_as(int i, float* out, const float* in, int64_t B, ComputeKind kind);
  void recompute_block(int last);  // checkpointing: the block ending at layer `last`, into recompute_
  // Tensor parallelism (model.cpp: f and g around each pair; sequence parallel variants).
  bool sequence_parallel() const { return tp_.degree > 1 && tp_.sequence_parallel; }
  TensorParallelComm& tp_comm() const;
  int64_t sp_rows(int i, bool output) const;  // layer i's input or output rows under sequence parallelism
  float* scratch(Tensor& t, int64_t n);       // grows `t` to n floats on the model's device
  void add_bias_rows(float* out, const float* bias, int64_t B, int64_t OC);
  void sp_layer_forward(int i, float* out, const float* in, ComputeKind kind = ComputeKind::LayerForward);
  // `input`/`weights`: which halves run (both: backward's; ZB-H1's I and W one each). `gout`: the row
  // layer's gathered output gradient, kept by I (written) for W (read, in place of all-gathering `dout`).
  void sp_layer_backward(int i, float* dinp, const float* dout, const float* in, const float* out, bool input = true,
                         bool weights = true, float* gout = nullptr);
  void sp_linear_backward(int i, float* dinp, const float* dout, const float* in, bool input, bool weights, float* gout);
  Tensor& sp_gathered(int i) { return stage_gathered_ ? (*stage_gathered_)[static_cast<size_t>(i)] : sp_gathered_[static_cast<size_t>(i)]; }
  const float* sp_split_rows(Tensor& dst, const float* src, int64_t width);
  // Mixed precision (model_half.cpp).
  const float* half_forward(const float* x, int64_t B);
  void half_backward(const float* dlogits, const GradReadyHook& on_grad_ready);
  void half_layer_forward(int i, uint16_t* out, const uint16_t* in, int64_t B, ComputeKind kind);
  void half_recompute_block(int last);  // checkpointing: recompute_block in 16 bits
  void half_layer_backward(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out, int64_t B);
  void half_lora_forward(const Layer& L, uint16_t* out, const float* x, int64_t B);
  // weights false: only dx's adapter part (x may be null), as lora_backward's `weights`.
  void half_lora_backward(const Layer& L, float* dx, const float* dy, const float* x, int64_t B, bool weights = true);
  void half_sp_layer_forward(int i, uint16_t* out, const uint16_t* in, ComputeKind kind);
  void half_sp_layer_backward(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out,
                              bool input = true, bool weights = true, uint16_t* gout = nullptr);
  void half_sp_split_rows(uint16_t* dst, const uint16_t* src, int64_t width);  // sp_split_rows in 16 bits
  void half_add_bias_rows(uint16_t* out, const float* bias, int64_t rows, int64_t OC);
  void half_relu_forward(uint16_t* out, const uint16_t* in, int64_t n);
  void half_relu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n);
  // A partial gradient (fp32) rounded to 16 bits, summed over the TP group in 16 bits, widened again.
  const float* half_all_reduce_partial(const float* partial, int64_t n, int layer);
  void half_sum_lora_grad(const Layer& L);
  uint16_t* half_scratch(Tensor& t, int64_t n);  // n 16-bit elements of the model's dtype
  void add_to_grad16(Parameter& p, const float* add);      // grad16 = round(grad16 + add), torch's .grad +=
  float* widen(Tensor& t, const uint16_t* src, int64_t n);  // src as float32 in scratch `t`
  // A parameter as a 16-bit Linear reads it, in float32 scratch `t`: the 16-bit value widened, or under
  // autocast the float32 value rounded to 16 bits (its cast).
  const float* operand(Tensor& t, const Parameter& p, int64_t n);
  float* f32_scratch(Tensor& t, int64_t n);                  // n floats of fp32 compute scratch
  // enable_lora()'s GPT part (engine/core/gpt.h's GptAdapters).
  void enable_gpt_lora(uint64_t seed);
  void lora_forward(const Layer& L, float* out, const float* in, int64_t B);
  void lora_backward(const Layer& L, float* dinp, const float* dout, const float* in, int64_t B, bool weights);
  // Adapters whose gradient this rank computes only in part, summed over the TP group after the layer:
  // a split Linear's whole factor, and under sequence parallelism a replicated Linear's A and B (it
  // sees only this rank's rows, as its weight does).
  bool lora_split(const Layer& L) const { return L.lora_a >= 0 && (L.tp != TpRole::Replicated || sequence_parallel()); }
  // Where lora_split's partial gradient lies in grad_scratch_ (lora_g_ in 16 bits, after dB's place):
  // the column layer's A, the row layer's B, or a replicated layer's B then A.
  struct LoraPartial {
    int first = -1, second = -1;  // parameters() indices, in the partial's order (second: -1 if one)
  };
  LoraPartial lora_partial(const Layer& L) const;
  void sum_lora_grad(const Layer& L);  // TP: all-reduce the partial gradient, add it
  ModelSpec spec_;
  float aux_grad_scale_ = 1.0f;
  ExpertParallelComm* ep_comm_ = nullptr;
  ContextParallelComm* cp_comm_ = nullptr;
  std::unique_ptr<GptCore> last_cp_;  // set_context_parallel's previous split's layers
  std::unique_ptr<GptCore> gpt_;  // a GPT's layers (engine/core/gpt.h); null for the MLP
  GptRange gpt_range_;            // its layers: the whole model, or a pipeline stage's
  TensorParallelSpec tp_;
  LoraSpec lora_;
  std::vector<Parameter> base_;  // LoRA: the frozen weights and biases, in frozen_
  Tensor frozen_;
  Tensor lora_t_, lora_d_, lora_dx_;  // LoRA scratch: x A^T (B, r), the scaled output gradient, the input gradient
  TensorParallelComm* tp_comm_ = nullptr;
  MemoryTracker* tracker_;
  Device& device_;
  int first_linear_ = 0;
  std::vector<Layer> layers_;
  std::vector<Parameter> params_;
  Tensor flat_params_;  // (P,)
  Tensor flat_grads_;   // (P,)
  std::vector<Tensor> acts_;  // acts_[i]: output of layer i, (B, out_i)
  Tensor dbuf_[2];            // ping-pong activation gradients, (B, max width)
  Tensor recompute_;          // checkpointing: a block's inner activation, (B, max width), in param_dtype()
  bool checkpointing_ = false;
  bool checkpointed_alloc_ = false;  // the layout acts_ was allocated for
  bool layer_skipped(int i) const;  // layer i bypassed in the current forward
  const float* input_ = nullptr;
  int skipped_seq_ = -1;
  std::vector<const float*> layer_in_;  // each layer's input in the last forward
  ComputeObserver* observer_ = nullptr;
  LayerHooks* hooks_ = nullptr;
  LayerGate* gate_ = nullptr;
  int64_t num_params_ = 0;
  int64_t batch_ = 0;     // rows of the current forward
  int64_t capacity_ = 0;  // rows the activation buffers hold
  int64_t padded_ = 0;    // sequence parallel: batch_ rounded up to a multiple of the TP degree
  std::vector<Tensor> sp_gathered_;  // sequence parallel: each column-parallel Linear's gathered input
  std::vector<Tensor>* stage_gathered_ = nullptr;  // a pipeline stage's: the micro-batch's (sp_stage_begin)
  Tensor sp_x_, sp_dlogits_, sp_logits_;  // this rank's rows of the input and dlogits; all logits
  Tensor scratch_, grad_scratch_, ones_;   // partial sums, partial gradients, a column of ones
  Precision precision_ = Precision::FP32;
  Precision amp_ = Precision::FP32;  // set_amp's dtype
  // Mixed precision: the batch in 16 bits, the widened logits, each layer's 16-bit input, and the
  // float32 operands and results of the layer running now (the GEMM's fp32 side, "other" memory).
  Tensor x16_, logits32_;
  std::vector<const uint16_t*> layer_in16_;
  Tensor fa_, fb_, fc_, fd_, fe_, ff_;
  Tensor fh_, fg_;  // the widened 16-bit operands of add_to_grad16, half_add_bias_rows and the ReLUs
  Tensor lora_a32_, lora_b32_, lora_g_;
  // Mixed precision with tensor parallelism: 16-bit operands of the TP collectives (partial sums,
  // gathered rows, partial gradients) and sequence parallelism's rows of the input, dlogits and logits.
  Tensor h16a_, h16b_, sp_x16_, sp_logits16_;  // mixed LoRA: A and B widened; dB, dA and the adapter's input gradient
};

// A GPT (or its pipeline stage, or its TP shard) takes its values from the whole model's flat host
// values (gpt_parameters' layout): its stage's parameters, the head's copy of the tied weight from
// wte, then this TP rank's heads and columns.
void upload_gpt_whole_values(Model& model, const float* whole);

// torch.manual_seed(seed) + nn.Linear's reset_parameters, value for value (a pipeline stage skips
// the draws of the layers before it), drawn on the host and uploaded to the model's device.
void init_like_torch(Model& model, uint64_t seed);
// The values behind it: the full (unsplit) parameters of Linear layers [first, end) in the full model's
// flat order, on the host.
std::vector<float> torch_init_values(const ModelSpec& spec, uint64_t seed, int first_linear, int end_linear);
// dtlab::Error with one sentence for a rank below 1, a non-positive alpha, or a listed index that is
// not one of `spec`'s Linears.
void check_lora_spec(const ModelSpec& spec, const LoraSpec& lora);
// LoRA's A values for the adapted Linears of [first, end), in layer order, each (r, in) row-major:
// the draws continue torch's stream after the whole base model (torch.manual_seed(seed);
// Sequential(...); get_peft_model(...)), and per adapted layer in order peft's update_layer makes
// them: nn.Linear(in, r) draws r*in, nn.Linear(r, out) draws out*r, then reset_lora_parameters
// draws A again with kaiming_uniform_(a=sqrt(5)) (bound 1/sqrt(in)): that last draw is A; B is zeroed.
std::vector<float> lora_init_values(const ModelSpec& spec, const LoraSpec& lora, uint64_t seed, int first_linear,
                                    int end_linear);
// Where a tensor-parallel shard's parameter sits in the unsplit one: rows [row_begin, row_end) and
// columns [col_begin, col_end) of the full (rows, cols) matrix (a bias is (out, 1)), which begins at
// `full_offset` in the unsplit stage's flat buffer; the piece's values lie row-major from
// `local_offset` in the shard's. A GPT's c_attn is three pieces (its q, k and v rows of this rank's
// heads, three (C, C) matrices one after another in the full buffer); every other parameter is one.
struct TpPiece {
  int64_t rows, cols;
  int64_t row_begin, row_end, col_begin, col_end;
  int param = -1;  // index into model.parameters()
  int64_t full_offset = 0, local_offset = 0;
  bool split() const { return row_end - row_begin < rows || col_end - col_begin < cols; }
};
// model.parameters()' pieces on TP rank `tp_rank`, in that order: the weights and biases (tp_slice),
// or under LoRA the adapters (enable_lora says how they split). The unsplit parameters lie flat in
// the same order, each (rows, cols) row-major: the full stage's (torch_init_values) or its adapters;
// a GPT's in gpt_stage_parameters' layout.
std::vector<TpPiece> tp_pieces(const Model& model, int tp_rank);
// Cuts a tensor-parallel shard's values out of the full stage's flat host parameters (tp_pieces'
// order): `local` receives model.num_params() floats in model.parameters() order.
void shard_full_params(const Model& model, const float* full, float* local);

}  // namespace dtlab
