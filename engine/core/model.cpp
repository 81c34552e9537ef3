#include "engine/core/model.h"

#include "engine/core/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

#include "engine/core/check.h"

namespace dtlab {

ModelSpec ModelSpec::parse(std::string_view text) {
  const std::string_view how = "; write it as mlp:D0,D1,...,Dk, e.g. mlp:2,64,64,3, or gpt:layers=L,heads=H,embd=C,ctx=T";
  if (GptSpec::names_gpt(text)) {
    ModelSpec spec;
    spec.gpt = GptSpec::parse(text);
    if (spec.num_params() > kMaxModelParams)
      throw Error("model '" + std::string(text) + "' has " + std::to_string(spec.num_params()) + " parameters; dtlab builds models of up to " +
                  std::to_string(kMaxModelParams) + " (16 GiB of float32 per copy): use fewer layers or a smaller embd");
    return spec;
  }
  if (text.substr(0, 4) != "mlp:")
    throw Error("model '" + std::string(text) + "' is not a known model" + std::string(how));
  ModelSpec spec;
  std::string_view rest = text.substr(4);
  while (true) {
    size_t comma = rest.find(',');
    std::string_view part = rest.substr(0, comma);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size())
      throw Error("model '" + std::string(text) + "' has '" + std::string(part) +
                  "' where a layer width belongs" + std::string(how));
    if (v < 1 || v > (1 << 20))
      throw Error("model '" + std::string(text) + "' has width " + std::to_string(v) +
                  "; widths must be between 1 and 1048576");
    spec.dims.push_back(v);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (spec.dims.size() < 2)
    throw Error("model '" + std::string(text) + "' needs at least an input and an output width" +
                std::string(how));
  // Checked before anything is allocated: a file or flag naming a huge model gets a sentence, not an
  // allocation failure (or minutes of building it) first.
  if (spec.num_params() > kMaxModelParams)
    throw Error("model '" + std::string(text) + "' has " + std::to_string(spec.num_params()) + " parameters; dtlab builds models of up to " +
                std::to_string(kMaxModelParams) + " (16 GiB of float32 per copy): use smaller widths");
  return spec;
}

std::string ModelSpec::str() const {
  if (is_gpt()) return gpt.str();
  std::string s = "mlp:";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? "," : "") + std::to_string(dims[i]);
  return s;
}

int64_t ModelSpec::num_params() const {
  if (is_gpt()) return gpt.num_params();
  int64_t n = 0;
  for (size_t i = 0; i + 1 < dims.size(); i++) n += dims[i + 1] * dims[i] + dims[i + 1];
  return n;
}

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, Device& device)
    : Model(spec, tracker, seed, 0, spec.is_gpt() ? static_cast<int>(spec.gpt.layers) + 2 : static_cast<int>(spec.dims.size()) - 1,
            device) {}

Model::~Model() = default;

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
             Device& device)
    : Model(spec, tracker, seed, first_linear, end_linear, device, TensorParallelSpec{}) {}

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
             Device& device, const TensorParallelSpec& tp)
    : spec_(spec), tp_(tp), tracker_(tracker), device_(device), first_linear_(first_linear) {
  if (spec.is_gpt()) {
    // first_linear/end_linear: the stage's layers in the GPT's numbering (GptRange).
    DTLAB_CHECK(spec.gpt.vocab >= 2, "the GPT's vocabulary must be known before it is built");
    DTLAB_CHECK(tp.degree >= 1 && tp.rank >= 0 && tp.rank < tp.degree, "a tensor-parallel rank outside its group");
    check_gpt_tp(spec.gpt, tp.degree, tp.sequence_parallel);
    gpt_range_ = {first_linear, end_linear};
    params_ = gpt_stage_parameters(spec.gpt, gpt_range_, tp.degree);
    num_params_ = 0;
    for (const Parameter& p : params_) num_params_ += p.numel;
    flat_params_ = Tensor({num_params_}, MemCategory::Parameters, tracker, DType::F32, device_);
    flat_grads_ = Tensor({num_params_}, MemCategory::Gradients, tracker, DType::F32, device_);
    for (auto& p : params_) {
      p.data = flat_params_.f32() + p.offset;
      p.grad = flat_grads_.f32() + p.offset;
    }
    gpt_ = std::make_unique<GptCore>(spec.gpt, tracker, device_, gpt_range_, tp);
    init_like_torch(*this, seed);
    return;
  }
  DTLAB_CHECK(spec.dims.size() >= 2, "a model needs an input and an output width");
  int64_t offset = 0;
  int n_linear = static_cast<int>(spec.dims.size()) - 1;
  DTLAB_CHECK(0 <= first_linear && first_linear < end_linear && end_linear <= n_linear,
              "a stage needs a non-empty range of the model's Linear layers");
  DTLAB_CHECK(tp.degree >= 1 && tp.rank >= 0 && tp.rank < tp.degree, "a tensor-parallel rank outside its group");
  check_tp_widths(spec.dims, first_linear, end_linear, tp.degree);
  const std::vector<TpRole> roles = tp_roles(first_linear, end_linear, tp.degree);
  for (int l = first_linear; l < end_linear; l++) {
    int seq = 2 * l;  // Sequential index: Linear at even positions, ReLU after each but the last
    const TpRole role = roles[static_cast<size_t>(l - first_linear)];
    const TpSlice sl = tp_slice(role, spec.dims[l + 1], spec.dims[l], tp.degree, tp.rank);
    int64_t in = sl.col_end - sl.col_begin, out = sl.row_end - sl.row_begin;
    Layer lin{LayerKind::Linear, seq, in, out, static_cast<int>(params_.size()),
              static_cast<int>(params_.size()) + 1, role};
    params_.push_back({std::to_string(seq) + ".weight", {out, in}, offset, out * in});
    offset += out * in;
    params_.push_back({std::to_string(seq) + ".bias", {sl.bias_numel()}, offset, sl.bias_numel()});
    offset += sl.bias_numel();
    layers_.push_back(lin);
    if (l + 1 < n_linear) layers_.push_back({LayerKind::ReLU, seq + 1, out, out, -1, -1, role});
  }
  num_params_ = offset;
  flat_params_ = Tensor({offset}, MemCategory::Parameters, tracker, DType::F32, device_);
  flat_grads_ = Tensor({offset}, MemCategory::Gradients, tracker, DType::F32, device_);
  for (auto& p : params_) {
    p.data = flat_params_.f32() + p.offset;
    p.grad = flat_grads_.f32() + p.offset;
  }
  init_like_torch(*this, seed);
}

int Model::hook_layers() const { return gpt_ ? static_cast<int>(spec_.gpt.layers) + 2 : num_layers(); }

std::vector<Model::WrapUnit> Model::wrap_units() const {
  std::vector<WrapUnit> units;
  if (gpt_ && lora()) {  // the adapters of each adapted block: the frozen base is no unit
    const GptAdapters& ad = gpt_->lora();
    for (size_t u = 0; u < ad.a_of_block.size(); u++) {
      if (ad.a_of_block[u] < 0) continue;
      WrapUnit w;
      w.params = {ad.a_of_block[u], ad.a_of_block[u] + 1};
      w.layers = {1 + gpt_range_.first_block() + static_cast<int>(u)};
      units.push_back(std::move(w));
    }
    return units;
  }
  if (gpt_) {
    const int L = static_cast<int>(spec_.gpt.layers);
    const GptSpec& g = spec_.gpt;
    units.push_back({{GptParamIndex::kWte, GptParamIndex::kWpe, GptParamIndex::ln_f_weight(g), GptParamIndex::ln_f_bias(g)}, {0, L + 1}, true});
    for (int l = 0; l < L; l++) {
      WrapUnit u;
      for (int k = 0; k < GptParamIndex::per_block(g, l); k++) u.params.push_back(GptParamIndex::block(g, l, static_cast<GptParamIndex::Block>(k)));
      u.layers = {1 + l};
      units.push_back(std::move(u));
    }
    return units;
  }
  for (int i = 0; i < num_layers(); i++) {
    WrapUnit u;
    u.params = trainable_of(layer(i));  // under LoRA only the adapters: a frozen Linear is no unit
    if (u.params.empty()) continue;
    u.layers = {i};
    units.push_back(std::move(u));
  }
  return units;
}

int Model::find_parameter(std::string_view name) const {
  for (size_t i = 0; i < params_.size(); i++)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

void Model::zero_grad() {
  for (auto& p : params_) {
    if (p.grad) device_.fill_zero(p.grad, p.numel * static_cast<int64_t>(sizeof(float)));
    if (p.grad16) device_.fill_zero(p.grad16, p.numel * 2);
  }
}

void Model::download_params(float* host) const {
  DTLAB_CHECK(owns_parameters(), "download_params() while the parameters are sharded; materialize them first");
  if (mixed()) return download_half(device_, host, flat_params_.u16(), num_params_, half_format());
  device_.download(host, flat_params_.f32(), num_params_ * static_cast<int64_t>(sizeof(float)));
}

std::vector<float> Model::host_params() const {
  std::vector<float> out(static_cast<size_t>(num_params_));
  download_params(out.data());
  return out;
}

void Model::upload_params(const float* host) {
  DTLAB_CHECK(owns_parameters(), "upload_params() while the parameters are sharded");
  if (mixed()) return upload_half(device_, flat_params_.u16(), host, num_params_, half_format());
  device_.upload(flat_params_.f32(), host, num_params_ * static_cast<int64_t>(sizeof(float)));
}

void Model::release_gradient_storage() {
  if (flat_grads_.empty()) return;
  const char* begin = static_cast<const char*>(flat_grads_.raw());
  const char* end = begin + flat_grads_.nbytes();
  for (const auto& p : params_)
    for (const char* g : {reinterpret_cast<const char*>(p.grad), reinterpret_cast<const char*>(p.grad16)})
      DTLAB_CHECK(!(g >= begin && g < end),
                "release_gradient_storage() while " + p.name + "'s gradient still lives there");
  flat_grads_ = Tensor();
}

void Model::release_parameter_storage() {
  for (auto& p : params_) {
    p.data = p.grad = nullptr;
    p.data16 = p.grad16 = nullptr;
  }
  flat_params_ = Tensor();
  flat_grads_ = Tensor();
}

void Model::restore_storage(const void* full) {
  const DType dt = param_dtype();
  flat_params_ = Tensor({num_params_}, MemCategory::Parameters, tracker_, dt, device_);
  flat_grads_ = Tensor({num_params_}, MemCategory::Gradients, tracker_, dt, device_);
  if (full) device_.copy(flat_params_.raw(), full, flat_params_.nbytes());
  for (auto& p : params_) {
    if (mixed()) {
      p.data16 = flat_params_.u16() + p.offset;
      p.grad16 = flat_grads_.u16() + p.offset;
    } else {
      p.data = flat_params_.f32() + p.offset;
      p.grad = flat_grads_.f32() + p.offset;
    }
  }
}

void Model::set_skipped_layer(int seq_index) {
  if (seq_index < 0) {
    skipped_seq_ = -1;
    return;
  }
  for (const Layer& L : layers_) {
    if (L.seq_index != seq_index) continue;
    if (L.kind != LayerKind::Linear)
      throw Error("layer " + std::to_string(seq_index) + " of " + spec_.str() +
                  " is a ReLU; the skip branch bypasses a Linear (an even index)");
    if (L.in_features != L.out_features)
      throw Error("layer " + std::to_string(seq_index) + " of " + spec_.str() + " maps " +
                  std::to_string(L.in_features) + " to " + std::to_string(L.out_features) +
                  " features, so bypassing it would change the width; pick a square hidden Linear "
                  "(equal widths on both sides, e.g. layer 2 of mlp:2,64,64,64,3)");
    skipped_seq_ = seq_index;
    return;
  }
  throw Error(spec_.str() + " has no layer " + std::to_string(seq_index) + "; its Linear layers are 0, 2, ..., " +
              std::to_string(2 * (static_cast<int>(spec_.dims.size()) - 2)));
}

bool Model::layer_skipped(int i) const {
  if (skipped_seq_ < 0) return false;
  const Layer& L = layers_[static_cast<size_t>(i)];
  return L.seq_index == skipped_seq_ || (L.kind == LayerKind::ReLU && L.seq_index == skipped_seq_ + 1);
}

bool Model::parameter_used(int p) const {
  if (skipped_seq_ < 0) return true;
  for (int i = 0; i < num_layers(); i++) {
    const Layer& L = layers_[static_cast<size_t>(i)];
    const bool mine = lora() ? (L.lora_a == p || L.lora_b == p) : (L.weight == p || L.bias == p);
    if (mine) return !layer_skipped(i);
  }
  return true;
}

// LoRA adds x A^T and (x A^T) B^T forward (and the scaled sum); backward recomputes x A^T and computes
// dB, dt = ds B, dA and the input gradient dt A, but no frozen weight or bias gradient.
double Model::layer_forward_flops(int i, int64_t B) const {
  const Layer& L = layer(i);
  if (L.kind == LayerKind::ReLU) return static_cast<double>(B * L.out_features);
  const double lora = L.lora_a >= 0 ? 2.0 * B * lora_.rank * (L.in_features + L.out_features) + 2.0 * B * L.out_features : 0.0;
  return 2.0 * B * L.in_features * L.out_features + static_cast<double>(B * L.out_features) + lora;
}

double Model::layer_backward_flops(int i, int64_t B, bool input_grad) const {
  const Layer& L = layer(i);
  if (L.kind == LayerKind::ReLU) return input_grad ? static_cast<double>(B * L.out_features) : 0.0;
  double gemm = 2.0 * B * L.in_features * L.out_features;
  if (!lora()) return gemm * (input_grad ? 2 : 1) + static_cast<double>(B * L.out_features);
  if (L.lora_a < 0) return input_grad ? gemm : 0.0;
  const double r = lora_.rank;
  return (input_grad ? gemm + 2.0 * B * r * L.in_features : 0.0) + 2.0 * B * r * (2.0 * L.in_features + 2.0 * L.out_features) +
         static_cast<double>(B * L.out_features);
}

OpCost Model::layer_forward_cost(int i, int64_t B) const {
  const Layer& L = layer(i);
  const double bytes = L.kind == LayerKind::ReLU ? relu_forward_cost(B * L.out_features).bytes
                                                 : linear_forward_cost(B, L.in_features, L.out_features).bytes;
  return {layer_forward_flops(i, B), bytes};
}

OpCost Model::layer_backward_cost(int i, int64_t B, bool input_grad) const {
  const Layer& L = layer(i);
  double bytes = 0;
  if (L.kind == LayerKind::Linear) bytes = linear_backward_cost(B, L.in_features, L.out_features, input_grad).bytes;
  else if (input_grad) bytes = relu_backward_cost(B * L.out_features).bytes;
  return {layer_backward_flops(i, B, input_grad), bytes};
}

TensorParallelComm& Model::tp_comm() const {
  DTLAB_CHECK(tp_comm_ != nullptr, "a tensor-parallel model runs only after set_tensor_parallel_comm()");
  return *tp_comm_;
}

float* Model::scratch(Tensor& t, int64_t n) {
  if (t.numel() < n) t = Tensor({n}, MemCategory::Activations, tracker_, DType::F32, device_);
  return t.f32();
}

// out (B, OC) += bias in every row: a row-parallel Linear's bias, added once after g summed the partial
// products (Megatron's RowParallelLinear). A K = 1 GEMM of a column of ones with the bias writes the
// rows exactly (1 x b), on any device.
void Model::add_bias_rows(float* out, const float* bias, int64_t B, int64_t OC) {
  if (ones_.numel() < B) {
    ones_ = Tensor({B}, MemCategory::Activations, tracker_, DType::F32, device_);
    std::vector<float> host(static_cast<size_t>(B), 1.0f);
    device_.upload(ones_.f32(), host.data(), B * static_cast<int64_t>(sizeof(float)));
  }
  float* rows = scratch(scratch_, B * OC);
  device_.linear_forward(rows, ones_.f32(), bias, nullptr, B, 1, OC);
  device_.accumulate(out, rows, B * OC, false);
}

// Megatron's pairs without sequence parallelism (engine/core/mesh.h; docs/course_sources.md §6c): a
// column-parallel Linear computes its slice of the outputs from the whole input (f: identity); a
// row-parallel one computes a partial product from its slice of the inputs, g all-reduces it, and the
// bias is added once. The collectives run outside the compute scopes: they are the comm lane's.
void Model::layer_forward(int i, float* out, const float* in, int64_t B) {
  forward_layer_as(i, out, in, B, ComputeKind::LayerForward);
}

void Model::forward_layer_as(int i, float* out, const float* in, int64_t B, ComputeKind kind) {
  DTLAB_CHECK(!half_acts(), "layer_forward() on a model with 16-bit activations; it runs through forward()");
  DTLAB_CHECK(!sequence_parallel(),
              "layer_forward() runs tensor parallelism without sequence parallelism; a sequence-parallel model "
              "runs through forward()");
  const Layer& L = layer(i);
  const bool row = L.kind == LayerKind::Linear && L.tp == TpRole::Row;
  {
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, B));
    if (L.kind == LayerKind::Linear) {
      device_.linear_forward(out, in, weight_of(L).data, row ? nullptr : bias_of(L).data, B, L.in_features,
                             L.out_features);
      if (L.lora_a >= 0) lora_forward(L, out, in, B);
    } else {
      device_.relu_forward(out, in, B * L.out_features);
    }
  }
  if (!row) return;
  tp_comm().all_reduce(out, B * L.out_features, L.seq_index);  // g forward: sum the partial outputs
  add_bias_rows(out, bias_of(L).data, B, L.out_features);
}

void Model::layer_backward(int i, float* dinp, const float* dout, const float* in, const float* out,
                           int64_t B) {
  DTLAB_CHECK(!sequence_parallel(), "layer_backward() with sequence parallelism; it runs through backward()");
  DTLAB_CHECK(!half_acts(), "layer_backward() on a model with 16-bit activations; it runs through backward()");
  const Layer& L = layer(i);
  {
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                       layer_backward_cost(i, B, dinp != nullptr));
    if (L.kind == LayerKind::Linear) {
      device_.linear_backward(dinp, weight_of(L).grad, bias_of(L).grad, dout, in, weight_of(L).data, B,
                              L.in_features, L.out_features);
      if (L.lora_a >= 0) lora_backward(L, dinp, dout, in, B, true);
    } else if (dinp) {
      device_.relu_backward(dinp, dout, out, B * L.out_features);
    }
  }
  // f backward: each rank's input gradient covers its slice of the outputs; their sum is the whole.
  if (dinp && L.kind == LayerKind::Linear && L.tp == TpRole::Column)
    tp_comm().all_reduce(dinp, B * L.in_features, L.seq_index);
  if (lora_split(L)) sum_lora_grad(L);
}

void Model::layer_backward_input(int i, float* dinp, const float* dout, const float* out, int64_t B) {
  DTLAB_CHECK(!sequence_parallel(), "layer_backward_input() with sequence parallelism; it runs through backward()");
  const Layer& L = layer(i);
  {
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                       layer_backward_cost(i, B, true) - layer_backward_cost(i, B, false));
    if (L.kind == LayerKind::Linear) {
      device_.linear_backward(dinp, nullptr, nullptr, dout, nullptr, weight_of(L).data, B, L.in_features,
                              L.out_features);
      if (L.lora_a >= 0) lora_backward(L, dinp, dout, nullptr, B, false);
    } else {
      device_.relu_backward(dinp, dout, out, B * L.out_features);
    }
  }
  if (L.kind == LayerKind::Linear && L.tp == TpRole::Column) tp_comm().all_reduce(dinp, B * L.in_features, L.seq_index);
}

void Model::layer_backward_weight(int i, const float* dout, const float* in, int64_t B) {
  DTLAB_CHECK(!sequence_parallel(), "layer_backward_weight() with sequence parallelism; it runs through backward()");
  const Layer& L = layer(i);
  if (L.kind != LayerKind::Linear) return;  // a ReLU has no weights
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_cost(i, B, false));
  if (lora()) {  // the frozen base has no gradient; the adapters' is the weight half
    if (L.lora_a >= 0) lora_backward(L, nullptr, dout, in, B, true);
    if (lora_split(L)) sum_lora_grad(L);
    return;
  }
  device_.linear_backward(nullptr, params_[L.weight].grad, params_[L.bias].grad, dout, in, nullptr, B,
                          L.in_features, L.out_features);
}

// Sequence parallelism (Korthikanti et al. 2022; docs/course_sources.md §6c): outside the pairs each TP
// rank holds rows [rank * Bl, (rank + 1) * Bl) of the batch padded to padded_ = degree * Bl rows (zero
// rows whose output gradients are zero, so they add nothing); inside a pair (the column-parallel
// Linear's output and its ReLU, the row-parallel Linear's input) every rank holds all padded_ rows.
int64_t Model::sp_rows(int i, bool output) const {
  const Layer& L = layer(i);
  const bool all = L.tp == TpRole::Column ? (output || L.kind == LayerKind::ReLU)
                                          : (L.tp == TpRole::Row && L.kind == LayerKind::Linear && !output);
  return all ? padded_ : padded_ / tp_.degree;
}

int64_t Model::layer_output_rows(int i) const { return sequence_parallel() ? sp_rows(i, true) : batch_; }

// This rank's rows of `src` (batch_ rows of `width`), zero-padded: Megatron's
// scatter_to_sequence_parallel_region, a split without communication.
const float* Model::sp_split_rows(Tensor& dst, const float* src, int64_t width) {
  float* d = scratch(dst, padded_ / tp_.degree * width);
  sp_stage_split(d, src, width);
  return d;
}

void Model::sp_stage_split(void* dst, const void* src, int64_t width) {
  if (half_acts()) return half_sp_split_rows(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), width);
  const int64_t local = padded_ / tp_.degree, begin = tp_.rank * local;
  const int64_t n = std::clamp<int64_t>(batch_ - begin, 0, local);
  float* d = static_cast<float*>(dst);
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(float));
  if (n > 0) device_.copy(d, static_cast<const float*>(src) + begin * width, n * row_bytes);
  if (n < local) device_.fill_zero(d + n * width, (local - n) * row_bytes);
}

void Model::sp_stage_begin(int64_t B, std::vector<Tensor>* gathered) {
  DTLAB_CHECK(sequence_parallel() && gpt_ == nullptr, "sp_stage_begin() on a model without sequence parallelism (or a GPT)");
  batch_ = B;
  padded_ = (B + tp_.degree - 1) / tp_.degree * tp_.degree;
  stage_gathered_ = gathered;
  if (gathered->size() == layers_.size()) return;  // this micro-batch's, allocated at its forward
  gathered->clear();
  for (const Layer& L : layers_) {
    const bool gather = L.kind == LayerKind::Linear && L.tp == TpRole::Column;
    gathered->push_back(gather ? Tensor({padded_, L.in_features}, MemCategory::Activations, tracker_, act_dtype(), device_) : Tensor());
  }
}

void Model::sp_stage_gather(void* dst, const void* src, int64_t width, int seq_index) {
  tp_comm().all_gather(dst, src, padded_ / tp_.degree * width, act_dtype(), seq_index);
}

void Model::sp_stage_forward(int i, void* out, const void* in, bool recompute) {
  const ComputeKind kind = recompute ? ComputeKind::Recompute : ComputeKind::LayerForward;
  if (half_acts()) half_sp_layer_forward(i, static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in), kind);
  else sp_layer_forward(i, static_cast<float*>(out), static_cast<const float*>(in), kind);
}

void Model::sp_stage_backward(int i, void* dinp, const void* dout, const void* in, const void* out) {
  if (half_acts())
    half_sp_layer_backward(i, static_cast<uint16_t*>(dinp), static_cast<const uint16_t*>(dout), static_cast<const uint16_t*>(in),
                           static_cast<const uint16_t*>(out));
  else
    sp_layer_backward(i, static_cast<float*>(dinp), static_cast<const float*>(dout), static_cast<const float*>(in),
                      static_cast<const float*>(out));
}

void Model::sp_stage_backward_input(int i, void* dinp, const void* dout, const void* out, void* gout) {
  if (half_acts())
    half_sp_layer_backward(i, static_cast<uint16_t*>(dinp), static_cast<const uint16_t*>(dout), nullptr, static_cast<const uint16_t*>(out),
                           true, false, static_cast<uint16_t*>(gout));
  else
    sp_layer_backward(i, static_cast<float*>(dinp), static_cast<const float*>(dout), nullptr, static_cast<const float*>(out), true, false,
                      static_cast<float*>(gout));
}

void Model::sp_stage_backward_weight(int i, const void* dout, const void* in) {
  // A row-parallel Linear's `dout` is the gathered output gradient its I kept.
  const Layer& L = layer(i);
  const bool kept = L.kind == LayerKind::Linear && L.tp == TpRole::Row;
  if (half_acts()) {
    auto* g = static_cast<uint16_t*>(const_cast<void*>(dout));
    half_sp_layer_backward(i, nullptr, kept ? nullptr : g, static_cast<const uint16_t*>(in), nullptr, false, true, kept ? g : nullptr);
  } else {
    auto* g = static_cast<float*>(const_cast<void*>(dout));
    sp_layer_backward(i, nullptr, kept ? nullptr : g, static_cast<const float*>(in), nullptr, false, true, kept ? g : nullptr);
  }
}

// f becomes an all-gather of the rows before the column-parallel Linear, g a reduce-scatter of the
// partial outputs after the row-parallel one (each rank keeps its rows, then adds the bias).
void Model::sp_layer_forward(int i, float* out, const float* in, ComputeKind kind) {
  const Layer& L = layer(i);
  const int64_t all = padded_, local = padded_ / tp_.degree;
  if (L.kind == LayerKind::ReLU) {
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, sp_rows(i, true)));
    device_.relu_forward(out, in, sp_rows(i, true) * L.out_features);
    return;
  }
  const Parameter& w = weight_of(L);
  const Parameter& b = bias_of(L);
  if (L.tp == TpRole::Column) {
    // Kept for the weight gradient. Megatron keeps this rank's rows instead and all-gathers them again
    // in backward (less memory, one more all-gather); keeping them makes SP move exactly TP's bytes.
    float* gathered = sp_gathered(i).f32();
    tp_comm().all_gather(gathered, in, local * L.in_features, L.seq_index);
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, all));
    device_.linear_forward(out, gathered, w.data, b.data, all, L.in_features, L.out_features);
    if (L.lora_a >= 0) lora_forward(L, out, gathered, all);
  } else if (L.tp == TpRole::Row) {
    float* partial = scratch(scratch_, all * L.out_features);
    {
      ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, all));
      device_.linear_forward(partial, in, w.data, nullptr, all, L.in_features, L.out_features);
      if (L.lora_a >= 0) lora_forward(L, partial, in, all);  // its partial sum rides g
    }
    tp_comm().reduce_scatter(out, partial, local * L.out_features, L.seq_index);
    add_bias_rows(out, b.data, local, L.out_features);
  } else {
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, local));
    device_.linear_forward(out, in, w.data, b.data, local, L.in_features, L.out_features);
    if (L.lora_a >= 0) lora_forward(L, out, in, local);
  }
}

void Model::sp_layer_backward(int i, float* dinp, const float* dout, const float* in, const float* out, bool input, bool weights,
                              float* gout) {
  const Layer& L = layer(i);
  if (L.kind == LayerKind::Linear) return sp_linear_backward(i, input ? dinp : nullptr, dout, in, input, weights, gout);
  if (!dinp || !input) return;
  const int64_t rows = sp_rows(i, true);
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_cost(i, rows, true));
  device_.relu_backward(dinp, dout, out, rows * L.out_features);
}

// The conjugates backward: the column layer's input gradient is reduce-scattered (f), the row layer's
// output gradient all-gathered (g). Parameters that saw only this rank's rows (the row layer's bias, a
// replicated Linear) get partial gradients: computed apart, all-reduced over the TP group, then added
// to the gradient (which may hold earlier micro-batches' sums), as Megatron all-reduces
// sequence-parallel parameters' gradients. ZB-H1 runs the input half (I) and the weight half (W) apart:
// I gathers the row layer's output gradient into `gout`, W reads it there.
void Model::sp_linear_backward(int i, float* dinp, const float* dout, const float* in, bool input, bool weights, float* gout) {
  const Layer& L = layer(i);
  const int64_t all = padded_, local = padded_ / tp_.degree, OC = L.out_features;
  // No weight or bias gradient, partial or not: under LoRA (the base is frozen; the adapters' follow) and
  // in ZB-H1's I (the input half).
  const bool frozen = lora() || !weights;
  const Parameter& w = weight_of(L);
  const Parameter& b = bias_of(L);
  const int64_t rows = L.tp == TpRole::Replicated ? local : all;
  const float* g = dout;     // the output gradient of every row the layer computed
  const float* mine = dout;  // this rank's rows of it
  if (L.tp == TpRole::Row) {
    if (!input && gout) {
      g = gout;
      mine = gout + tp_.rank * local * OC;
    } else {
      float* gathered = gout ? gout : scratch(scratch_, all * OC);
      tp_comm().all_gather(gathered, dout, local * OC, L.seq_index);
      g = gathered;
    }
  }
  float* full_dinp = L.tp == TpRole::Column && dinp ? scratch(scratch_, all * L.in_features) : dinp;
  const int64_t partial_n = frozen ? 0 : L.tp == TpRole::Row ? b.numel : L.tp == TpRole::Replicated ? w.numel + b.numel : 0;
  float* partial = partial_n ? scratch(grad_scratch_, partial_n) : nullptr;
  if (partial) device_.fill_zero(partial, partial_n * static_cast<int64_t>(sizeof(float)));
  {
    const OpCost cost = !weights ? layer_backward_cost(i, rows, true) - layer_backward_cost(i, rows, false)
                                 : layer_backward_cost(i, rows, dinp != nullptr);
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, cost);
    const float* x = !weights ? nullptr : L.tp == TpRole::Column ? sp_gathered(i).f32() : in;
    const float* wd = dinp ? w.data : nullptr;
    if (L.tp == TpRole::Column) {
      device_.linear_backward(full_dinp, frozen ? nullptr : w.grad, frozen ? nullptr : b.grad, g, x, wd, all, L.in_features, OC);
    } else if (L.tp == TpRole::Row) {
      device_.linear_backward(dinp, frozen ? nullptr : w.grad, nullptr, g, x, wd, all, L.in_features, OC);
      if (partial) device_.linear_backward(nullptr, nullptr, partial, mine, nullptr, nullptr, local, L.in_features, OC);
    } else {
      device_.linear_backward(dinp, partial, partial ? partial + w.numel : nullptr, dout, x, wd, local, L.in_features, OC);
    }
    // The adapters see the rows the base layer saw (the gathered ones, or this rank's).
    if (L.lora_a >= 0) lora_backward(L, full_dinp, g, x, rows, weights);
  }
  if (L.tp == TpRole::Column && dinp) tp_comm().reduce_scatter(dinp, full_dinp, local * L.in_features, L.seq_index);
  if (weights && lora_split(L)) sum_lora_grad(L);
  if (!partial) return;
  tp_comm().all_reduce(partial, partial_n, L.seq_index);
  if (L.tp == TpRole::Replicated) device_.accumulate(w.grad, partial, w.numel, false);
  device_.accumulate(b.grad, partial + partial_n - b.numel, b.numel, false);
}

void Model::ensure_activations(int64_t B) {
  batch_ = B;
  padded_ = sequence_parallel() ? (B + tp_.degree - 1) / tp_.degree * tp_.degree : B;
  stage_gathered_ = nullptr;  // the model's own from here (a pipeline stage's micro-batch's before)
  // A smaller (last) batch reuses the buffers.
  if (B <= capacity_ && !acts_.empty() && checkpointed_alloc_ == checkpointing_) return;
  acts_.clear();
  recompute_ = Tensor();
  sp_gathered_.clear();
  int64_t widest = 0;  // elements of the largest activation gradient
  int64_t recompute_width = 0;  // checkpointing: elements of the widest block output
  for (int i = 0; i < num_layers(); i++) {
    const Layer& L = layer(i);
    const int64_t rows_in = sequence_parallel() ? sp_rows(i, false) : B;
    const int64_t rows_out = sequence_parallel() ? sp_rows(i, true) : B;
    acts_.push_back(keeps_output(i) ? Tensor({rows_out, L.out_features}, MemCategory::Activations, tracker_, act_dtype(), device_)
                                    : Tensor());
    if (checkpointing_) recompute_width = std::max(recompute_width, rows_out * L.out_features);
    const bool gather = sequence_parallel() && L.kind == LayerKind::Linear && L.tp == TpRole::Column;
    sp_gathered_.push_back(gather ? Tensor({padded_, L.in_features}, MemCategory::Activations, tracker_, act_dtype(), device_)
                                  : Tensor());
    widest = std::max({widest, rows_in * L.in_features, rows_out * L.out_features});
  }
  for (auto& d : dbuf_) d = Tensor({widest}, MemCategory::Activations, tracker_, act_dtype(), device_);
  if (recompute_width > 0) recompute_ = Tensor({recompute_width}, MemCategory::Activations, tracker_, act_dtype(), device_);
  capacity_ = B;
  checkpointed_alloc_ = checkpointing_;
}

const float* Model::forward_tokens(const int64_t* idx, int64_t B) {
  DTLAB_CHECK(gpt_ != nullptr, "forward_tokens() on a model that is not a GPT");
  batch_ = B;
  return static_cast<const float*>(gpt_->forward(gpt_params(), idx, B, observer_, gate_, hooks_));  // the logits, float32
}

std::unique_ptr<GptCore> Model::gpt_activations() const {
  DTLAB_CHECK(gpt_ != nullptr, "gpt_activations() on a model that is not a GPT");
  auto core = std::make_unique<GptCore>(spec_.gpt, tracker_, device_, gpt_range_, tp_);
  core->set_checkpointing(checkpointing_);
  core->set_tp_comm(tp_comm_);
  core->set_ep_comm(ep_comm_);
  core->set_cp_comm(cp_comm_);
  core->set_lora(gpt_->lora());
  core->set_precision(precision_);
  core->set_amp(amp_);
  core->share_moe_history(*gpt_);  // (a pipeline's micro-batches: one history for the stage)
  return core;
}

void Model::set_tensor_parallel_comm(TensorParallelComm* c) {
  tp_comm_ = c;
  if (gpt_) gpt_->set_tp_comm(c);
}

const void* Model::gpt_forward(GptCore& acts, const int64_t* idx, const void* x, int64_t B) {
  return acts.forward(gpt_params(), idx, B, observer_, gate_, hooks_, x);
}

void Model::set_expert_parallel_comm(ExpertParallelComm* c) {
  ep_comm_ = c;
  if (gpt_) gpt_->set_ep_comm(c);
}

void Model::set_context_parallel_comm(ContextParallelComm* c) {
  cp_comm_ = c;
  if (gpt_) gpt_->set_cp_comm(c);
}

void Model::set_context_parallel(const ContextParallelSpec& cp) {
  DTLAB_CHECK(gpt_ != nullptr, "set_context_parallel() on a model that is not a GPT");
  spec_.gpt.cp = cp;
  std::unique_ptr<GptCore> core = gpt_activations();
  core->set_aux_grad_scale(aux_grad_scale_);
  if (gpt_->context_parallel().on()) {
    gpt_->release();
    gpt_->set_cp_comm(nullptr);
    last_cp_ = std::move(gpt_);
  }
  gpt_ = std::move(core);
}

const GptCore* Model::context_parallel_core() const {
  return gpt_ && gpt_->context_parallel().on() ? gpt_.get() : last_cp_.get();
}

void Model::set_aux_grad_scale(float s) {
  aux_grad_scale_ = s;
  if (gpt_) gpt_->set_aux_grad_scale(s);
}

double Model::aux_loss() const { return gpt_ ? gpt_->aux_loss() : 0.0; }

const void* Model::gpt_backward(GptCore& acts, const void* dout, const GradReadyHook& on_grad_ready) {
  acts.set_aux_grad_scale(aux_grad_scale_);
  return acts.backward(gpt_params(), dout, on_grad_ready, observer_, gate_, hooks_);
}

const void* Model::gpt_backward_input(GptCore& acts, const void* dout) {
  acts.set_aux_grad_scale(aux_grad_scale_);
  return acts.backward_input(gpt_params(), dout, {}, observer_, gate_, hooks_);
}

void Model::gpt_backward_weight(GptCore& acts) { acts.backward_weight(gpt_params(), {}, observer_, nullptr, hooks_); }

const float* Model::forward(const float* x, int64_t B) {
  DTLAB_CHECK(gpt_ == nullptr, "a GPT's forward takes tokens: forward_tokens()");
  if (half_acts()) return half_forward(x, B);
  ensure_activations(B);
  input_ = x;
  layer_in_.assign(layers_.size(), nullptr);
  const bool sp = sequence_parallel();
  const float* in = sp ? sp_split_rows(sp_x_, x, spec_.dims[static_cast<size_t>(first_linear_)]) : x;
  for (int i = 0; i < num_layers(); i++) {
    layer_in_[static_cast<size_t>(i)] = in;
    if (layer_skipped(i)) continue;  // the branch: this block's output is its input
    gate_layer(i, false);
    if (hooks_) hooks_->before_forward(i);
    float* out = keeps_output(i) ? acts_[i].f32() : recompute_.f32();
    if (sp) sp_layer_forward(i, out, in);
    else layer_forward(i, out, in, B);
    if (hooks_) hooks_->after_forward(i);
    in = out;
  }
  if (!sp) return in;
  // Every TP rank returns all rows (Megatron's gather_from_sequence_parallel_region; its backward is
  // the split backward() starts with).
  const Layer& last = layer(num_layers() - 1);
  const int64_t local = padded_ / tp_.degree;
  float* logits = scratch(sp_logits_, padded_ * last.out_features);
  tp_comm().all_gather(logits, in, local * last.out_features, last.seq_index);
  return logits;
}

void Model::backward(const float* dlogits, const GradReadyHook& on_grad_ready) {
  if (gpt_) {
    gpt_->backward(gpt_params(), dlogits, on_grad_ready, observer_, gate_, hooks_);
    return;
  }
  DTLAB_CHECK(input_ != nullptr, "backward() called before forward()");
  if (half_acts()) return half_backward(dlogits, on_grad_ready);
  const bool sp = sequence_parallel();
  const float* dout = sp ? sp_split_rows(sp_dlogits_, dlogits, layer(num_layers() - 1).out_features) : dlogits;
  int first = 0;  // the first computed layer needs no input gradient (its input is the data)
  while (first < num_layers() && layer_skipped(first)) first++;
  for (int i = num_layers() - 1; i >= 0; i--) {
    if (layer_skipped(i)) continue;  // the gradient passes through the bypass unchanged
    const float* in = layer_in_[static_cast<size_t>(i)];
    // Ping-pong between the two buffers, never writing the one `dout` points into.
    float* dinp = i > first ? (dout == dbuf_[0].f32() ? dbuf_[1].f32() : dbuf_[0].f32()) : nullptr;
    if (checkpointing_ && keeps_output(i)) recompute_block(i);  // a block's last layer: run it again first
    const float* out = checkpointing_ ? recompute_.f32() : acts_[i].f32();
    gate_layer(i, true);
    if (hooks_) hooks_->before_backward(i);
    if (sp) sp_layer_backward(i, dinp, dout, in, out);
    else layer_backward(i, dinp, dout, in, out, batch_);
    if (hooks_) hooks_->after_backward(i);
    const Layer& L = layer(i);
    if (L.kind == LayerKind::Linear && on_grad_ready) {
      // Bias before weight; under LoRA lora_B before lora_A (autograd reaches B first), and a frozen
      // Linear has nothing to report.
      const std::vector<int> ps = trainable_of(L);
      for (auto it = ps.rbegin(); it != ps.rend(); ++it) on_grad_ready(*it);
    }
    dout = dinp;
  }
}

void Model::set_activation_checkpointing(bool on) {
  checkpointing_ = on;
  if (gpt_) gpt_->set_checkpointing(on);  // per block (engine/core/gpt.h)
}

bool Model::keeps_output(int i) const {
  if (!checkpointing_ || i + 1 >= num_layers()) return true;
  return layer(i).kind == LayerKind::ReLU;  // a Linear with a ReLU after it is inside its block
}

// torch.utils.checkpoint's recomputation (non-reentrant: triggered when backward first needs the
// block's saved tensors): the block's Linear again from its kept input into recompute_, its ReLU in
// place there (elementwise, so the values equal the forward's bit for bit). The ReLU's backward then
// reads recompute_ as its output; the last Linear alone recomputes the logits, which its backward does
// not read: the flops are what the run pays, as in torch. On a tensor-parallel shard a block is the
// shard's Linear and its ReLU, and its forward runs again with its collectives, as Megatron's full
// recomputation re-runs the forward, f and g included (docs/course_sources.md §6c): a row-parallel
// Linear sums its partial outputs again (all-reduce; sequence parallel: reduce-scatter), a column-parallel
// one under sequence parallelism gathers its input rows again.
void Model::recompute_block(int last) {
  const int first = layer(last).kind == LayerKind::ReLU ? last - 1 : last;
  float* buf = recompute_.f32();
  for (int i = first; i <= last; i++) {
    if (hooks_) hooks_->before_recompute(i);
    const float* in = i == first ? layer_in_[static_cast<size_t>(i)] : buf;
    if (sequence_parallel()) sp_layer_forward(i, buf, in, ComputeKind::Recompute);
    else forward_layer_as(i, buf, in, batch_, ComputeKind::Recompute);
    if (hooks_) hooks_->after_recompute(i);
  }
}

namespace {

// torch's CPU generator is an mt19937 seeded with the low 32 bits; uniform_(a, b) on float32
// takes one 32-bit draw per element, keeps 24 bits, and computes x * (b - a) + a with b - a in
// float and the rest in double (at::uniform_real_distribution), then rounds to float.
void torch_uniform(std::mt19937& gen, float* out, int64_t n, double lo, double hi) {
  float from = static_cast<float>(lo), to = static_cast<float>(hi);
  for (int64_t i = 0; i < n; i++) {
    double x = static_cast<double>(gen() & ((1u << 24) - 1)) * (1.0 / (1u << 24));
    out[i] = static_cast<float>(x * static_cast<double>(to - from) + from);
  }
}

// kaiming_uniform_(w, a=sqrt(5)): gain = sqrt(2 / (1 + a^2)), bound = sqrt(3) * gain / sqrt(fan_in)
double kaiming_bound(int64_t fan_in) {
  double gain = std::sqrt(2.0 / (1.0 + 5.0));
  return std::sqrt(3.0) * (gain / std::sqrt(static_cast<double>(fan_in)));
}

}  // namespace

std::vector<float> torch_init_values(const ModelSpec& spec, uint64_t seed, int first_linear, int end_linear) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  const auto& dims = spec.dims;
  for (int l = 0; l < first_linear; l++)  // one draw per element of each earlier layer
    gen.discard(static_cast<unsigned long long>(dims[l + 1] * dims[l] + dims[l + 1]));
  auto uniform = [&](float* out, int64_t n, double lo, double hi) { torch_uniform(gen, out, n, lo, hi); };
  int64_t total = 0;
  for (int l = first_linear; l < end_linear; l++) total += dims[l + 1] * dims[l] + dims[l + 1];
  std::vector<float> host(static_cast<size_t>(total));
  float* p = host.data();
  for (int l = first_linear; l < end_linear; l++) {
    double fan_in = static_cast<double>(dims[l]);
    double wbound = kaiming_bound(dims[l]);
    uniform(p, dims[l + 1] * dims[l], -wbound, wbound);
    p += dims[l + 1] * dims[l];
    double bbound = 1.0 / std::sqrt(fan_in);
    uniform(p, dims[l + 1], -bbound, bbound);
    p += dims[l + 1];
  }
  return host;
}

std::vector<float> lora_init_values(const ModelSpec& spec, const LoraSpec& lora, uint64_t seed, int first_linear,
                                    int end_linear) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  gen.discard(static_cast<unsigned long long>(spec.num_params()));  // the base model's draws
  const auto& dims = spec.dims;
  const int64_t r = lora.rank;
  std::vector<float> host;
  for (int l = 0; l + 1 < static_cast<int>(dims.size()); l++) {
    if (!lora.adapts(2 * l)) continue;
    const int64_t in = dims[l], out = dims[l + 1];
    gen.discard(static_cast<unsigned long long>(r * in + out * r));  // nn.Linear(in, r), nn.Linear(r, out)
    if (l < first_linear || l >= end_linear) {
      gen.discard(static_cast<unsigned long long>(r * in));
      continue;
    }
    host.resize(host.size() + static_cast<size_t>(r * in));
    torch_uniform(gen, host.data() + host.size() - r * in, r * in, -kaiming_bound(in), kaiming_bound(in));
  }
  return host;
}

namespace {

// A GPT shard's pieces (gpt_parameters says which parameters split, and how).
std::vector<TpPiece> gpt_tp_pieces(const Model& model, int tp_rank) {
  const GptSpec& s = model.spec().gpt;
  const int t = model.tensor_parallel().degree;
  const GptRange range = model.gpt_range();
  const std::vector<Parameter> full = gpt_stage_parameters(s, range, 1);
  const std::vector<Parameter>& local = model.parameters();
  const int64_t C = s.embd, Ct = C / t;
  std::vector<TpPiece> pieces;
  if (model.lora()) {  // per adapted block: lora_A (r, C) whole, lora_B (3C, r) by c_attn's q, k and v rows
    const int64_t r = model.lora_spec().rank;
    int64_t full_at = 0;
    for (size_t k = 0; k + 1 < local.size(); k += 2) {
      pieces.push_back({r, C, 0, r, 0, C, static_cast<int>(k), full_at, local[k].offset});
      full_at += r * C;
      for (int64_t j = 0; j < 3; j++)
        pieces.push_back({C, r, tp_rank * Ct, (tp_rank + 1) * Ct, 0, r, static_cast<int>(k + 1), full_at + j * C * r,
                          local[k + 1].offset + j * Ct * r});
      full_at += 3 * C * r;
    }
    return pieces;
  }
  for (size_t k = 0; k < local.size(); k++) {
    const Parameter& q = full[k];
    const int64_t rows = q.shape[0], cols = q.shape.size() == 2 ? q.shape[1] : 1;
    TpPiece whole{rows, cols, 0, rows, 0, cols, static_cast<int>(k), q.offset, local[k].offset};
    const std::string_view n = q.name;
    if (n.ends_with("attn.c_attn.weight") || n.ends_with("attn.c_attn.bias")) {
      for (int64_t j = 0; j < 3; j++)  // q, k, v: each a (C, cols) block of rows
        pieces.push_back({C, cols, tp_rank * Ct, (tp_rank + 1) * Ct, 0, cols, static_cast<int>(k), q.offset + j * C * cols,
                          local[k].offset + j * Ct * cols});
    } else if (n.ends_with("mlp.c_fc.weight") || n.ends_with("mlp.c_fc.bias")) {
      whole.row_begin = tp_rank * rows / t, whole.row_end = (tp_rank + 1) * rows / t;
      pieces.push_back(whole);
    } else if (n.ends_with("c_proj.weight") && n.find(".experts.") == std::string_view::npos) {  // attn's and mlp's: their input columns
      // (an MoE block's experts are whole on every TP rank, as its router is)
      whole.col_begin = tp_rank * cols / t, whole.col_end = (tp_rank + 1) * cols / t;
      pieces.push_back(whole);
    } else {
      pieces.push_back(whole);
    }
  }
  return pieces;
}

}  // namespace

std::vector<TpPiece> tp_pieces(const Model& model, int tp_rank) {
  if (model.is_gpt()) return gpt_tp_pieces(model, tp_rank);
  const auto& dims = model.spec().dims;
  const int degree = model.tensor_parallel().degree;
  const int64_t r = model.lora_spec().rank;
  std::vector<TpPiece> pieces;
  for (int i = 0; i < model.num_layers(); i++) {
    const Layer& L = model.layer(i);
    if (L.kind != LayerKind::Linear) continue;
    const int l = L.seq_index / 2;
    const int64_t out = dims[static_cast<size_t>(l + 1)], in = dims[static_cast<size_t>(l)];
    const TpSlice sl = tp_slice(L.tp, out, in, degree, tp_rank);
    if (!model.lora()) {
      pieces.push_back({out, in, sl.row_begin, sl.row_end, sl.col_begin, sl.col_end});
      pieces.push_back({out, 1, sl.bias_begin, sl.bias_end, 0, 1});
    } else if (L.lora_a >= 0) {  // A takes the weight's columns, B its rows
      pieces.push_back({r, in, 0, r, sl.col_begin, sl.col_end});
      pieces.push_back({out, r, sl.row_begin, sl.row_end, 0, r});
    }
  }
  // One piece per parameter, each flat after the last in both buffers.
  int64_t full_at = 0, local_at = 0;
  for (size_t k = 0; k < pieces.size(); k++) {
    TpPiece& p = pieces[k];
    p.param = static_cast<int>(k);
    p.full_offset = full_at;
    p.local_offset = local_at;
    full_at += p.rows * p.cols;
    local_at += (p.row_end - p.row_begin) * (p.col_end - p.col_begin);
  }
  return pieces;
}

void shard_full_params(const Model& model, const float* full, float* local) {
  for (const TpPiece& p : tp_pieces(model, model.tensor_parallel().rank)) {
    float* dst = local + p.local_offset;
    const float* src = full + p.full_offset;
    for (int64_t r = p.row_begin; r < p.row_end; r++)
      for (int64_t c = p.col_begin; c < p.col_end; c++) *dst++ = src[r * p.cols + c];
  }
}

void upload_gpt_whole_values(Model& model, const float* whole) {
  const GptSpec& g = model.spec().gpt;
  const GptRange range = model.gpt_range();
  std::vector<float> mine;
  const float* values = whole;
  if (!range.whole(g) || g.moe.ep > 1) {  // the stage's parameters (the head's copy: wte's values; this rank's experts)
    const std::vector<Parameter> stage = gpt_stage_parameters(g, range);
    const std::vector<int64_t> from = gpt_stage_sources(g, range);
    int64_t n = 0;  // (the stage's whole values: a TP shard cuts its own out of them below)
    for (const Parameter& q : stage) n = std::max(n, q.offset + q.numel);
    mine.resize(static_cast<size_t>(n));
    for (size_t k = 0; k < stage.size(); k++) std::copy_n(whole + from[k], stage[k].numel, mine.begin() + stage[k].offset);
    values = mine.data();
  }
  if (model.tensor_parallel().degree == 1) {
    model.upload_params(values);
    return;
  }
  std::vector<float> local(static_cast<size_t>(model.num_params()));  // this shard's heads and columns
  shard_full_params(model, values, local.data());
  model.upload_params(local.data());
}

void init_like_torch(Model& model, uint64_t seed) {
  if (model.is_gpt()) {
    const std::vector<float> whole = gpt_init_values(model.spec().gpt, seed);
    upload_gpt_whole_values(model, whole.data());
    return;
  }
  const int first = model.first_linear();
  const int end = first + (model.num_layers() + 1) / 2;
  std::vector<float> full = torch_init_values(model.spec(), seed, first, end);
  if (model.tensor_parallel().degree == 1) {
    model.upload_params(full.data());
    return;
  }
  std::vector<float> local(static_cast<size_t>(model.num_params()));
  shard_full_params(model, full.data(), local.data());
  model.upload_params(local.data());
}

}  // namespace dtlab
