#include "engine/core/model.h"

#include <charconv>
#include <cmath>
#include <random>

#include "engine/core/check.h"

namespace dtlab {

ModelSpec ModelSpec::parse(std::string_view text) {
  const std::string_view how = "; write it as mlp:D0,D1,...,Dk, e.g. mlp:2,64,64,3";
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
  std::string s = "mlp:";
  for (size_t i = 0; i < dims.size(); i++) s += (i ? "," : "") + std::to_string(dims[i]);
  return s;
}

int64_t ModelSpec::num_params() const {
  int64_t n = 0;
  for (size_t i = 0; i + 1 < dims.size(); i++) n += dims[i + 1] * dims[i] + dims[i + 1];
  return n;
}

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, Device& device)
    : Model(spec, tracker, seed, 0, static_cast<int>(spec.dims.size()) - 1, device) {}

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
             Device& device)
    : Model(spec, tracker, seed, first_linear, end_linear, device, TensorParallelSpec{}) {}

Model::Model(const ModelSpec& spec, MemoryTracker* tracker, uint64_t seed, int first_linear, int end_linear,
             Device& device, const TensorParallelSpec& tp)
    : spec_(spec), tp_(tp), tracker_(tracker), device_(device), first_linear_(first_linear) {
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

int Model::find_parameter(std::string_view name) const {
  for (size_t i = 0; i < params_.size(); i++)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

void Model::zero_grad() {
  for (auto& p : params_)
    if (p.grad) device_.fill_zero(p.grad, p.numel * static_cast<int64_t>(sizeof(float)));
}

void Model::download_params(float* host) const {
  DTLAB_CHECK(owns_parameters(), "download_params() while the parameters are sharded; materialize them first");
  device_.download(host, flat_params_.f32(), num_params_ * static_cast<int64_t>(sizeof(float)));
}

std::vector<float> Model::host_params() const {
  std::vector<float> out(static_cast<size_t>(num_params_));
  download_params(out.data());
  return out;
}

void Model::upload_params(const float* host) {
  DTLAB_CHECK(owns_parameters(), "upload_params() while the parameters are sharded");
  device_.upload(flat_params_.f32(), host, num_params_ * static_cast<int64_t>(sizeof(float)));
}

void Model::release_gradient_storage() {
  if (flat_grads_.empty()) return;
  const float* begin = flat_grads_.f32();
  const float* end = begin + flat_grads_.numel();
  for (const auto& p : params_)
    DTLAB_CHECK(!(p.grad >= begin && p.grad < end),
                "release_gradient_storage() while " + p.name + "'s gradient still lives there");
  flat_grads_ = Tensor();
}

void Model::release_parameter_storage() {
  for (auto& p : params_) p.data = p.grad = nullptr;
  flat_params_ = Tensor();
  flat_grads_ = Tensor();
}

void Model::restore_storage(const float* full) {
  flat_params_ = Tensor({num_params_}, MemCategory::Parameters, tracker_, DType::F32, device_);
  flat_grads_ = Tensor({num_params_}, MemCategory::Gradients, tracker_, DType::F32, device_);
  if (full) device_.copy(flat_params_.f32(), full, num_params_ * static_cast<int64_t>(sizeof(float)));
  for (auto& p : params_) {
    p.data = flat_params_.f32() + p.offset;
    p.grad = flat_grads_.f32() + p.offset;
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
    if (L.weight == p || L.bias == p) return !layer_skipped(i);
  }
  return true;
}

double Model::layer_forward_flops(int i, int64_t B) const {
  const Layer& L = layer(i);
  if (L.kind == LayerKind::ReLU) return static_cast<double>(B * L.out_features);
  return 2.0 * B * L.in_features * L.out_features + static_cast<double>(B * L.out_features);
}

double Model::layer_backward_flops(int i, int64_t B, bool input_grad) const {
  const Layer& L = layer(i);
  if (L.kind == LayerKind::ReLU) return input_grad ? static_cast<double>(B * L.out_features) : 0.0;
  double gemm = 2.0 * B * L.in_features * L.out_features;
  return gemm * (input_grad ? 2 : 1) + static_cast<double>(B * L.out_features);
}

void Model::layer_forward(int i, float* out, const float* in, int64_t B) {
  const Layer& L = layer(i);
  ComputeScope scope(observer_, ComputeKind::LayerForward, L.seq_index, layer_forward_flops(i, B));
  if (L.kind == LayerKind::Linear) {
    device_.linear_forward(out, in, params_[L.weight].data, params_[L.bias].data, B, L.in_features,
                           L.out_features);
  } else {
    device_.relu_forward(out, in, B * L.out_features);
  }
}

void Model::layer_backward(int i, float* dinp, const float* dout, const float* in, const float* out,
                           int64_t B) {
  const Layer& L = layer(i);
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                     layer_backward_flops(i, B, dinp != nullptr));
  if (L.kind == LayerKind::Linear) {
    device_.linear_backward(dinp, params_[L.weight].grad, params_[L.bias].grad, dout, in,
                            params_[L.weight].data, B, L.in_features, L.out_features);
  } else if (dinp) {
    device_.relu_backward(dinp, dout, out, B * L.out_features);
  }
}

void Model::layer_backward_input(int i, float* dinp, const float* dout, const float* out, int64_t B) {
  const Layer& L = layer(i);
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                     layer_backward_flops(i, B, true) - layer_backward_flops(i, B, false));
  if (L.kind == LayerKind::Linear) {
    device_.linear_backward(dinp, nullptr, nullptr, dout, nullptr, params_[L.weight].data, B, L.in_features,
                            L.out_features);
  } else {
    device_.relu_backward(dinp, dout, out, B * L.out_features);
  }
}

void Model::layer_backward_weight(int i, const float* dout, const float* in, int64_t B) {
  const Layer& L = layer(i);
  if (L.kind != LayerKind::Linear) return;  // a ReLU has no weights
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_flops(i, B, false));
  device_.linear_backward(nullptr, params_[L.weight].grad, params_[L.bias].grad, dout, in, nullptr, B,
                          L.in_features, L.out_features);
}

void Model::ensure_activations(int64_t B) {
  batch_ = B;
  if (B <= capacity_ && !acts_.empty()) return;  // a smaller (last) batch reuses the buffers
  acts_.clear();
  int64_t widest = 0;
  for (const Layer& L : layers_) {
    acts_.emplace_back(Shape{B, L.out_features}, MemCategory::Activations, tracker_, DType::F32, device_);
    widest = std::max({widest, L.in_features, L.out_features});
  }
  for (auto& d : dbuf_) d = Tensor({B, widest}, MemCategory::Activations, tracker_, DType::F32, device_);
  capacity_ = B;
}

const float* Model::forward(const float* x, int64_t B) {
  ensure_activations(B);
  input_ = x;
  layer_in_.assign(layers_.size(), nullptr);
  const float* in = x;
  for (int i = 0; i < num_layers(); i++) {
    layer_in_[static_cast<size_t>(i)] = in;
    if (layer_skipped(i)) continue;  // the branch: this block's output is its input
    if (hooks_) hooks_->before_forward(i);
    layer_forward(i, acts_[i].f32(), in, B);
    if (hooks_) hooks_->after_forward(i);
    in = acts_[i].f32();
  }
  return in;
}

void Model::backward(const float* dlogits, const GradReadyHook& on_grad_ready) {
  DTLAB_CHECK(input_ != nullptr, "backward() called before forward()");
  const float* dout = dlogits;
  int first = 0;  // the first computed layer needs no input gradient (its input is the data)
  while (first < num_layers() && layer_skipped(first)) first++;
  for (int i = num_layers() - 1; i >= 0; i--) {
    if (layer_skipped(i)) continue;  // the gradient passes through the bypass unchanged
    const float* in = layer_in_[static_cast<size_t>(i)];
    // Ping-pong between the two buffers, never writing the one `dout` points into.
    float* dinp = i > first ? (dout == dbuf_[0].f32() ? dbuf_[1].f32() : dbuf_[0].f32()) : nullptr;
    if (hooks_) hooks_->before_backward(i);
    layer_backward(i, dinp, dout, in, acts_[i].f32(), batch_);
    if (hooks_) hooks_->after_backward(i);
    const Layer& L = layer(i);
    if (L.kind == LayerKind::Linear && on_grad_ready) {
      on_grad_ready(L.bias);
      on_grad_ready(L.weight);
    }
    dout = dinp;
  }
}

std::vector<float> torch_init_values(const ModelSpec& spec, uint64_t seed, int first_linear, int end_linear) {
  // torch's CPU generator is an mt19937 seeded with the low 32 bits; uniform_(a, b) on float32
  // takes one 32-bit draw per element, keeps 24 bits, and computes x * (b - a) + a with b - a in
  // float and the rest in double (at::uniform_real_distribution), then rounds to float.
  std::mt19937 gen(static_cast<uint32_t>(seed));
  const auto& dims = spec.dims;
  for (int l = 0; l < first_linear; l++)  // one draw per element of each earlier layer
    gen.discard(static_cast<unsigned long long>(dims[l + 1] * dims[l] + dims[l + 1]));
  auto uniform = [&](float* out, int64_t n, double lo, double hi) {
    float from = static_cast<float>(lo), to = static_cast<float>(hi);
    for (int64_t i = 0; i < n; i++) {
      double x = static_cast<double>(gen() & ((1u << 24) - 1)) * (1.0 / (1u << 24));
      out[i] = static_cast<float>(x * static_cast<double>(to - from) + from);
    }
  };
  int64_t total = 0;
  for (int l = first_linear; l < end_linear; l++) total += dims[l + 1] * dims[l] + dims[l + 1];
  std::vector<float> host(static_cast<size_t>(total));
  float* p = host.data();
  for (int l = first_linear; l < end_linear; l++) {
    double fan_in = static_cast<double>(dims[l]);
    // kaiming_uniform_(w, a=sqrt(5)): gain = sqrt(2 / (1 + a^2)), bound = sqrt(3) * gain / sqrt(fan_in)
    double gain = std::sqrt(2.0 / (1.0 + 5.0));
    double wbound = std::sqrt(3.0) * (gain / std::sqrt(fan_in));
    uniform(p, dims[l + 1] * dims[l], -wbound, wbound);
    p += dims[l + 1] * dims[l];
    double bbound = 1.0 / std::sqrt(fan_in);
    uniform(p, dims[l + 1], -bbound, bbound);
    p += dims[l + 1];
  }
  return host;
}

void shard_full_params(const Model& model, const float* full, float* local) {
  const auto& dims = model.spec().dims;
  const auto& params = model.parameters();
  const TensorParallelSpec& tp = model.tensor_parallel();
  const float* src = full;
  for (int i = 0; i < model.num_layers(); i++) {
    const Layer& L = model.layer(i);
    if (L.kind != LayerKind::Linear) continue;
    const int l = L.seq_index / 2;
    const int64_t out = dims[static_cast<size_t>(l + 1)], in = dims[static_cast<size_t>(l)];
    const TpSlice sl = tp_slice(L.tp, out, in, tp.degree, tp.rank);
    float* w = local + params[static_cast<size_t>(L.weight)].offset;
    for (int64_t r = sl.row_begin; r < sl.row_end; r++)
      for (int64_t c = sl.col_begin; c < sl.col_end; c++) *w++ = src[r * in + c];
    src += out * in;
    float* b = local + params[static_cast<size_t>(L.bias)].offset;
    for (int64_t r = sl.bias_begin; r < sl.bias_end; r++) *b++ = src[r];
    src += out;
  }
}

void init_like_torch(Model& model, uint64_t seed) {
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
