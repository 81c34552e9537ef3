// LoRA inside the Model (model.h's LoraSpec; Hu et al. 2021, peft's LoraLayer; docs/course_sources.md §6d):
// the frozen base moves to its own buffer, the adapters become the model's parameters, and an adapted
// Linear adds scaling * (x A^T) B^T to its output.
#include <algorithm>

#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/core/model.h"

namespace dtlab {

bool LoraSpec::adapts(int seq_index) const {
  return rank > 0 && (layers.empty() || std::find(layers.begin(), layers.end(), seq_index) != layers.end());
}

void check_lora_spec(const ModelSpec& spec, const LoraSpec& lora) {
  if (lora.rank < 1)
    throw Error("--lora-rank " + std::to_string(lora.rank) + " is not a rank; give a whole number of at least 1, e.g. --lora-rank 4");
  if (!(lora.alpha > 0.0f))
    throw Error("--lora-alpha must be a positive number (peft's default is 8)");
  if (spec.is_gpt()) {  // peft's layers_to_transform: block indices
    const int L = static_cast<int>(spec.gpt.layers);
    for (int l : lora.layers)
      if (l < 0 || l >= L)
        throw Error("--lora-layers names block " + std::to_string(l) + ", which is not a block of " + spec.str() +
                    "; its blocks are 0 to " + std::to_string(L - 1) + " (the adapters sit on each listed block's attn.c_attn)");
    return;
  }
  const int last = 2 * (static_cast<int>(spec.dims.size()) - 2);
  for (int seq : lora.layers)
    if (seq < 0 || seq > last || seq % 2 != 0)
      throw Error("--lora-layers names layer " + std::to_string(seq) + ", which is not a Linear of " + spec.str() +
                  "; its Linear layers are 0, 2, ..., " + std::to_string(last));
}

void Model::enable_lora(const LoraSpec& lora, uint64_t seed) {
  check_lora_spec(spec_, lora);
  DTLAB_CHECK(!this->lora(), "enable_lora() called twice");
  DTLAB_CHECK(!mixed(), "enable_lora() after set_precision(); enable LoRA first (the base is frozen in float32, then both go to 16 bits)");
  DTLAB_CHECK(owns_parameters(), "LoRA runs on a model that owns its parameters");
  lora_ = lora;
  const int64_t base_bytes = num_params_ * static_cast<int64_t>(sizeof(float));
  frozen_ = Tensor({num_params_}, MemCategory::Parameters, tracker_, DType::F32, device_);
  device_.copy(frozen_.f32(), flat_params_.f32(), base_bytes);
  base_ = params_;
  for (Parameter& p : base_) {
    p.data = frozen_.f32() + p.offset;
    p.grad = nullptr;  // frozen: no gradient, no optimizer state
  }
  params_.clear();
  int64_t offset = 0;
  const int64_t r = lora.rank;
  if (gpt_) {
    enable_gpt_lora(seed);
    return;
  }
  for (Layer& L : layers_) {
    if (L.kind != LayerKind::Linear || !lora.adapts(L.seq_index)) continue;
    const std::string n = std::to_string(L.seq_index);
    L.lora_a = static_cast<int>(params_.size());
    params_.push_back({n + ".lora_A.weight", {r, L.in_features}, offset, r * L.in_features});
    offset += r * L.in_features;
    L.lora_b = static_cast<int>(params_.size());
    params_.push_back({n + ".lora_B.weight", {L.out_features, r}, offset, L.out_features * r});
    offset += L.out_features * r;
  }
  num_params_ = offset;
  restore_storage(nullptr);
  // The one-rank model's adapters, A then B (zero) per adapted layer; a TP shard takes its slices.
  const int end = first_linear_ + (num_layers() + 1) / 2;
  const std::vector<float> a = lora_init_values(spec_, lora, seed, first_linear_, end);
  std::vector<float> full;
  const float* src = a.data();
  for (const Layer& L : layers_) {
    if (L.lora_a < 0) continue;
    const int64_t in = spec_.dims[static_cast<size_t>(L.seq_index / 2)], out = spec_.dims[static_cast<size_t>(L.seq_index / 2 + 1)];
    full.insert(full.end(), src, src + r * in);
    full.resize(full.size() + static_cast<size_t>(out * r), 0.0f);
    src += r * in;
  }
  std::vector<float> host(static_cast<size_t>(num_params_));
  shard_full_params(*this, full.data(), host.data());
  if (num_params_ > 0) upload_params(host.data());  // a pipeline stage may hold no adapted Linear
}

// c_attn's adapters of the stage's adapted blocks, "transformer.h.L.attn.c_attn.lora_A.weight" (r, C)
// and its lora_B (3C/t, r: this TP rank's q, k and v rows, zero at the start, so no shard is cut).
void Model::enable_gpt_lora(uint64_t seed) {
  const GptSpec& g = spec_.gpt;
  const int64_t r = lora_.rank, C = g.embd, O = 3 * C / tp_.degree;
  GptAdapters ad;
  ad.rank = r;
  ad.scaling = lora_.scaling();
  const int fb = gpt_range_.first_block(), eb = gpt_range_.end_block(g);
  int64_t offset = 0;
  for (int l = fb; l < eb; l++) {
    if (!lora_.adapts(l)) {
      ad.a_of_block.push_back(-1);
      continue;
    }
    const std::string n = "transformer.h." + std::to_string(l) + ".attn.c_attn.";
    ad.a_of_block.push_back(static_cast<int>(params_.size()));
    params_.push_back({n + "lora_A.weight", {r, C}, offset, r * C});
    offset += r * C;
    params_.push_back({n + "lora_B.weight", {O, r}, offset, O * r});
    offset += O * r;
  }
  num_params_ = offset;
  restore_storage(nullptr);
  const std::vector<float> a = gpt_lora_init_values(g, lora_, seed, fb, eb);
  std::vector<float> host(static_cast<size_t>(num_params_), 0.0f);
  size_t k = 0;
  for (int i : ad.a_of_block)
    if (i >= 0) std::copy_n(a.begin() + static_cast<std::ptrdiff_t>(r * C * k++), r * C, host.begin() + params_[static_cast<size_t>(i)].offset);
  if (num_params_ > 0) upload_params(host.data());
  ad.params = &params_;
  gpt_->set_lora(ad);
}

void Model::release_frozen_storage() {
  for (Parameter& p : base_) p.data = nullptr, p.data16 = nullptr;
  frozen_ = Tensor();
}

void Model::restore_frozen_storage() {
  if (base_.empty() || !frozen_.empty()) return;
  int64_t total = 0;
  for (const Parameter& p : base_) total = std::max(total, p.offset + p.numel);
  frozen_ = Tensor({total}, MemCategory::Parameters, tracker_, param_dtype(), device_);  // 16 bits under mixed precision
  for (Parameter& p : base_) {
    if (mixed()) p.data16 = frozen_.u16() + p.offset;
    else p.data = frozen_.f32() + p.offset;
  }
}

std::vector<int> Model::trainable_of(const Layer& L) const {
  if (L.kind != LayerKind::Linear) return {};
  if (!lora()) return {L.weight, L.bias};
  if (L.lora_a < 0) return {};
  return {L.lora_a, L.lora_b};
}

namespace {

// W (out, in) += s * (B @ A), each element summed in double and rounded once.
void merge_adapter(float* W, const float* A, const float* Bm, int64_t out, int64_t in, int64_t r, double s) {
  for (int64_t o = 0; o < out; o++)
    for (int64_t i = 0; i < in; i++) {
      double acc = 0.0;
      for (int64_t k = 0; k < r; k++) acc += static_cast<double>(Bm[o * r + k]) * A[k * in + i];
      W[o * in + i] = static_cast<float>(W[o * in + i] + s * acc);
    }
}

}  // namespace

// peft's merge: W + scaling * (B @ A), computed on the host in double and rounded once.
std::vector<float> Model::merged_params() const {
  if (!lora()) return host_params();
  int64_t total = 0;
  for (const Parameter& p : base_) total += p.numel;
  std::vector<float> out(static_cast<size_t>(total));
  if (mixed()) download_half(device_, out.data(), frozen_.u16(), total, half_format());
  else device_.download(out.data(), frozen_.f32(), total * static_cast<int64_t>(sizeof(float)));
  const std::vector<float> ad = host_params();
  const int64_t r = lora_.rank;
  const double s = lora_.scaling();
  if (gpt_) {  // c_attn's rows (3C/t of them on a TP rank) += scaling B A
    const GptAdapters& g = gpt_->lora();
    const int64_t C = spec_.gpt.embd, O = 3 * C / tp_.degree;
    for (size_t u = 0; u < g.a_of_block.size(); u++) {
      if (g.a_of_block[u] < 0) continue;
      const int l = gpt_range_.first_block() + static_cast<int>(u);
      const float* A = ad.data() + params_[static_cast<size_t>(g.a_of_block[u])].offset;
      const float* Bm = ad.data() + params_[static_cast<size_t>(g.a_of_block[u] + 1)].offset;
      float* W = out.data() + base_[static_cast<size_t>(gpt_->block_param(l, GptParamIndex::AttnW))].offset;
      merge_adapter(W, A, Bm, O, C, r, s);
    }
    return out;
  }
  for (const Layer& L : layers_) {
    if (L.lora_a < 0) continue;
    const float* A = ad.data() + params_[static_cast<size_t>(L.lora_a)].offset;
    const float* Bm = ad.data() + params_[static_cast<size_t>(L.lora_b)].offset;
    merge_adapter(out.data() + base_[static_cast<size_t>(L.weight)].offset, A, Bm, L.out_features, L.in_features, r, s);
  }
  return out;
}

// out += scaling * (in A^T) B^T, as peft's Linear.forward: result + lora_B(lora_A(x)) * scaling.
void Model::lora_forward(const Layer& L, float* out, const float* in, int64_t B) {
  const Parameter& A = params_[static_cast<size_t>(L.lora_a)];
  const Parameter& Bm = params_[static_cast<size_t>(L.lora_b)];
  const int64_t r = lora_.rank;
  float* t = scratch(lora_t_, 2 * B * r);
  device_.linear_forward(t, in, A.data, nullptr, B, L.in_features, r);
  float* u = scratch(lora_d_, B * L.out_features);
  device_.linear_forward(u, t, Bm.data, nullptr, B, r, L.out_features);
  device_.scale(u, B * L.out_features, lora_.scaling());
  device_.accumulate(out, u, B * L.out_features, false);
}

// With ds = scaling * dout and t = in A^T (recomputed: a pipeline stage may run several micro-batches
// before their backwards): dB += ds^T t, dt = ds B, dA += dt^T in, dinp += dt A. Without `weights`
// only the input gradient (zero-bubble's I; `in` unused), with a null dinp only dA and dB (its W).
// On a TP shard the whole factor's gradient is a partial sum (enable_lora): it goes to
// grad_scratch_ for sum_lora_grad, and the split input gradient's part joins dinp before f sums it.
void Model::lora_backward(const Layer& L, float* dinp, const float* dout, const float* in, int64_t B, bool weights) {
  const Parameter& A = params_[static_cast<size_t>(L.lora_a)];
  const Parameter& Bm = params_[static_cast<size_t>(L.lora_b)];
  const int64_t r = lora_.rank;
  float* gB = weights ? Bm.grad : nullptr;
  float* gA = weights ? A.grad : nullptr;
  if (weights && lora_split(L)) {  // the partial gradient goes to grad_scratch_ (lora_partial's order)
    const LoraPartial lp = lora_partial(L);
    const int64_t n = params_[static_cast<size_t>(lp.first)].numel + (lp.second >= 0 ? params_[static_cast<size_t>(lp.second)].numel : 0);
    float* partial = scratch(grad_scratch_, n);
    device_.fill_zero(partial, n * static_cast<int64_t>(sizeof(float)));
    if (lp.first == L.lora_b) gB = partial, gA = lp.second >= 0 ? partial + Bm.numel : gA;
    else gA = partial;
  }
  float* t = scratch(lora_t_, 2 * B * r);
  float* dt = t + B * r;
  if (weights) device_.linear_forward(t, in, A.data, nullptr, B, L.in_features, r);
  float* ds = scratch(lora_d_, B * L.out_features);
  device_.scale_copy(ds, dout, B * L.out_features, lora_.scaling());
  device_.linear_backward(dt, gB, nullptr, ds, weights ? t : nullptr, Bm.data, B, r, L.out_features);
  float* dx = dinp ? scratch(lora_dx_, B * L.in_features) : nullptr;  // not scratch_: sequence parallelism's dinp may be there
  device_.linear_backward(dx, gA, nullptr, dt, weights ? in : nullptr, A.data, B, L.in_features, r);
  if (dx) device_.accumulate(dinp, dx, B * L.in_features, false);
}

// After the layer's compute (the collectives are the comm lane's): the sum over the TP group of the
// whole factor's partial gradients is its gradient for this pass, added to what earlier micro-batches
// left (as sequence parallelism sums its row-split parameters' gradients).
Model::LoraPartial Model::lora_partial(const Layer& L) const {
  if (L.tp == TpRole::Column) return {L.lora_a, -1};
  if (L.tp == TpRole::Row) return {L.lora_b, -1};
  return {L.lora_b, L.lora_a};
}

void Model::sum_lora_grad(const Layer& L) {
  const LoraPartial lp = lora_partial(L);
  const Parameter& p = params_[static_cast<size_t>(lp.first)];
  const Parameter* q = lp.second >= 0 ? &params_[static_cast<size_t>(lp.second)] : nullptr;
  float* partial = grad_scratch_.f32();
  tp_comm().all_reduce(partial, p.numel + (q ? q->numel : 0), L.seq_index);
  device_.accumulate(p.grad, partial, p.numel, false);
  if (q) device_.accumulate(q->grad, partial + p.numel, q->numel, false);
}

}  // namespace dtlab
