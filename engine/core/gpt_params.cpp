// nanoGPT's GPT: its spec (gpt:layers=...,heads=...), its parameter table in named_parameters() order
// (whole, per pipeline stage, per TP shard) and its initial values drawn as torch draws them
// (engine/core/gpt.h; the model itself is engine/core/gpt.cpp).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <random>
#include <string>
#include <utility>

#include "engine/core/check.h"
#include "engine/core/gpt.h"

namespace dtlab {

// ---- the spec ----

namespace {

constexpr std::string_view kGptHow =
    "; write it as gpt:layers=L,heads=H,embd=C,ctx=T[,vocab=V] (e.g. gpt:layers=4,heads=4,embd=128,ctx=64) or name a "
    "preset, gpt-tiny or gpt2-124m";

}  // namespace

bool GptSpec::names_gpt(std::string_view text) {
  return text.substr(0, 4) == "gpt:" || text == "gpt-tiny" || text == "gpt2-124m";
}

int64_t GptSpec::block_params(int64_t l) const {
  const int64_t C = embd;
  if (!moe.in_block(l)) return 12 * C * C + 13 * C;
  return 4 * C * C + 8 * C + moe.experts * C + moe.local_experts() * (8 * C * C + 5 * C);
}

int64_t GptSpec::num_params() const {
  const int64_t C = embd;
  int64_t n = vocab * C + ctx * C + 2 * C;
  for (int64_t l = 0; l < layers; l++) n += block_params(l);
  return n;
}

CpLayout parse_cp_layout(std::string_view name) {
  if (name == "ring") return CpLayout::Ring;
  if (name == "zigzag") return CpLayout::Zigzag;
  if (name == "ulysses") return CpLayout::Ulysses;
  throw Error("--cp-layout '" + std::string(name) + "' is not known; use ring, zigzag or ulysses");
}

const char* cp_layout_name(CpLayout l) {
  switch (l) {
    case CpLayout::Ring: return "ring";
    case CpLayout::Zigzag: return "zigzag";
    case CpLayout::Ulysses: return "ulysses";
  }
  return "?";
}

std::vector<int64_t> ContextParallelSpec::positions_of(int64_t r, int64_t T) const {
  std::vector<int64_t> pos;
  if (degree <= 1) {
    for (int64_t t = 0; t < T; t++) pos.push_back(t);
    return pos;
  }
  if (layout == CpLayout::Zigzag) {
    const int64_t c = T / (2 * degree);
    for (int64_t chunk : {r, 2 * degree - 1 - r})
      for (int64_t t = 0; t < c; t++) pos.push_back(chunk * c + t);
    return pos;
  }
  const int64_t n = T / degree;
  for (int64_t t = 0; t < n; t++) pos.push_back(r * n + t);
  return pos;
}

std::string MoeSpec::str() const {
  if (!on()) return "";
  std::string s = "experts=" + std::to_string(experts) + ",top_k=" + std::to_string(top_k);
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (capacity > 0) s += ",capacity=" + num(capacity);
  if (every != 1) s += ",every=" + std::to_string(every);
  s += ",aux=" + num(aux);
  return s;
}

MoeSpec MoeSpec::parse(std::string_view text) {
  static constexpr std::string_view kHow =
      "; write it as experts=E,top_k=K[,capacity=F][,every=N][,aux=A] (e.g. --moe experts=4,top_k=2,capacity=1.25)";
  const std::string whole(text);
  MoeSpec m;
  bool seen[5] = {};
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = part.find('=');
    static constexpr std::string_view kKeys[5] = {"experts", "top_k", "capacity", "every", "aux"};
    const std::string_view key = part.substr(0, eq);
    const int k = static_cast<int>(std::find(kKeys, kKeys + 5, key) - kKeys);
    if (eq == std::string_view::npos || k == 5)
      throw Error("--moe '" + whole + "' has '" + std::string(part) + "' where experts=, top_k=, capacity=, every= or aux= belongs" +
                  std::string(kHow));
    if (seen[k]) throw Error("--moe '" + whole + "' gives " + std::string(key) + " twice; give each once");
    seen[k] = true;
    const std::string val(part.substr(eq + 1));
    char* end = nullptr;
    const double v = val.empty() ? std::nan("") : std::strtod(val.c_str(), &end);
    const bool whole_number = k == 0 || k == 1 || k == 3;
    if (val.empty() || end != val.c_str() + val.size() || !std::isfinite(v) || (whole_number && v != std::floor(v)))
      throw Error("--moe '" + whole + "' has " + std::string(key) + "='" + val + "', which is not " +
                  (whole_number ? "a whole number" : "a number") + std::string(kHow));
    switch (k) {
      case 0:
        if (v < 2 || v > 256) throw Error("--moe '" + whole + "' has experts=" + val + "; use 2 to 256 experts");
        m.experts = static_cast<int64_t>(v);
        break;
      case 1:
        if (v < 1) throw Error("--moe '" + whole + "' has top_k=" + val + "; each token goes to at least 1 expert");
        m.top_k = static_cast<int64_t>(v);
        break;
      case 2:
        if (v <= 0 || v > 64)
          throw Error("--moe '" + whole + "' has capacity=" + val + "; the capacity factor is above 0 (1.0: an even share) and at most 64");
        m.capacity = v;
        break;
      case 3:
        if (v < 1 || v > 1024) throw Error("--moe '" + whole + "' has every=" + val + "; use every=1 (each block) or more");
        m.every = static_cast<int64_t>(v);
        break;
      default:
        if (v < 0 || v > 100) throw Error("--moe '" + whole + "' has aux=" + val + "; the loss coefficient is from 0 to 100 (Switch uses 0.01)");
        m.aux = v;
    }
  }
  if (!seen[0] || !seen[1]) throw Error("--moe '" + whole + "' does not give " + (seen[0] ? "top_k" : "experts") + std::string(kHow));
  if (m.top_k > m.experts)
    throw Error("--moe '" + whole + "' has top_k=" + std::to_string(m.top_k) + " with " + std::to_string(m.experts) +
                " experts; a token picks at most every expert once, so use top_k of at most " + std::to_string(m.experts));
  return m;
}

std::string GptSpec::str() const {
  std::string s = "gpt:layers=" + std::to_string(layers) + ",heads=" + std::to_string(heads) +
                  ",embd=" + std::to_string(embd) + ",ctx=" + std::to_string(ctx);
  if (vocab) s += ",vocab=" + std::to_string(vocab);
  return s;
}

GptSpec GptSpec::parse(std::string_view text) {
  const std::string whole(text);
  GptSpec s;
  // Presets: a model that trains on two cores in minutes, and GPT-2 small (nanoGPT's GPTConfig
  // defaults: 12 layers, 12 heads, 768 wide, 1024 tokens, GPT-2's 50257 tokens).
  if (text == "gpt-tiny") return GptSpec{4, 4, 128, 64, 0};
  if (text == "gpt2-124m") return GptSpec{12, 12, 768, 1024, 50257};
  if (text.substr(0, 4) != "gpt:") throw Error("model '" + whole + "' is not a GPT" + std::string(kGptHow));
  std::string_view rest = text.substr(4);
  bool seen[5] = {};
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view part = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = part.find('=');
    const std::string_view key = part.substr(0, eq);
    static constexpr std::string_view kKeys[5] = {"layers", "heads", "embd", "ctx", "vocab"};
    const int k = static_cast<int>(std::find(kKeys, kKeys + 5, key) - kKeys);
    if (eq == std::string_view::npos || k == 5)
      throw Error("model '" + whole + "' has '" + std::string(part) + "' where layers=, heads=, embd=, ctx= or vocab= belongs" +
                  std::string(kGptHow));
    if (seen[k]) throw Error("model '" + whole + "' gives " + std::string(key) + " twice; give each once");
    seen[k] = true;
    const std::string_view val = part.substr(eq + 1);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(val.data(), val.data() + val.size(), v);
    if (val.empty() || ec != std::errc() || ptr != val.data() + val.size() || v < 1 || v > (int64_t{1} << 20))
      throw Error("model '" + whole + "' has " + std::string(key) + "='" + std::string(val) +
                  "'; it must be a whole number from 1 to 1048576");
    int64_t* field[5] = {&s.layers, &s.heads, &s.embd, &s.ctx, &s.vocab};
    *field[k] = v;
  }
  for (int k = 0; k < 4; k++)
    if (!seen[k]) {
      static constexpr const char* kNames[4] = {"layers", "heads", "embd", "ctx"};
      throw Error("model '" + whole + "' does not give " + kNames[k] + std::string(kGptHow));
    }
  if (s.embd % s.heads != 0)
    throw Error("model '" + whole + "' has embd=" + std::to_string(s.embd) + " and heads=" + std::to_string(s.heads) +
                ": the heads split the width evenly (nanoGPT asserts n_embd % n_head == 0); pick embd a multiple of heads");
  // torch's normal_ takes another path below 16 elements; every drawn tensor has at least embd x 8.
  if (s.embd < 8) throw Error("model '" + whole + "' has embd=" + std::to_string(s.embd) + "; use embd=8 or more");
  if (s.vocab == 1) throw Error("model '" + whole + "' has vocab=1; a vocabulary needs at least 2 tokens");
  return s;
}

// ---- the parameter table and initial values ----

std::vector<Parameter> gpt_parameters(const GptSpec& s, int tp) {
  const int64_t C = s.embd, Ct = C / tp;
  std::vector<Parameter> ps;
  // Storage: the root module's own parameters (wte, wpe, ln_f) first, then the blocks, so that the
  // root's FSDP unit and each block's are contiguous ranges of the flat buffers, as torch's
  // transformer auto-wrap makes them flat parameters; the list keeps named_parameters()' order.
  const int64_t ln_f_at = s.vocab * C + s.ctx * C;
  int64_t offset = 0;
  auto add = [&](std::string name, Shape shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (name.starts_with("transformer.ln_f.")) {
      ps.push_back({std::move(name), std::move(shape), ln_f_at + (ps.back().name.ends_with("ln_f.weight") ? C : 0), n});
      return;
    }
    ps.push_back({std::move(name), std::move(shape), offset, n});
    offset += n;
    if (offset == ln_f_at) offset += 2 * C;  // after wpe: ln_f's place
  };
  add("transformer.wte.weight", {s.vocab, C});
  add("transformer.wpe.weight", {s.ctx, C});
  for (int64_t l = 0; l < s.layers; l++) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * Ct, C});  // column-parallel under TP: q, k, v of H/t heads
    add(h + "attn.c_attn.bias", {3 * Ct});
    add(h + "attn.c_proj.weight", {C, Ct});  // row-parallel: those heads' columns
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    if (s.moe.in_block(l)) {  // the router, then each expert's MLP (whole on every TP rank: each routes its own positions)
      add(h + "mlp.router.weight", {s.moe.experts, C});
      for (int64_t e = s.moe.first_expert(); e < s.moe.first_expert() + s.moe.local_experts(); e++) {  // this rank's
        const std::string x = h + "mlp.experts." + std::to_string(e) + ".";
        add(x + "c_fc.weight", {4 * C, C});
        add(x + "c_fc.bias", {4 * C});
        add(x + "c_proj.weight", {C, 4 * C});
        add(x + "c_proj.bias", {C});
      }
      continue;
    }
    add(h + "mlp.c_fc.weight", {4 * Ct, C});  // column-parallel
    add(h + "mlp.c_fc.bias", {4 * Ct});
    add(h + "mlp.c_proj.weight", {C, 4 * Ct});  // row-parallel
    add(h + "mlp.c_proj.bias", {C});
  }
  add("transformer.ln_f.weight", {C});
  add("transformer.ln_f.bias", {C});
  return ps;
}

namespace {

// torch's CPU generator (engine/core/model.cpp's torch_uniform has the float uniform_).
float uniform01(std::mt19937& gen) { return static_cast<float>(gen() & ((1u << 24) - 1)) * (1.0f / (1u << 24)); }

void torch_uniform_range(std::mt19937& gen, float* out, int64_t n, double lo, double hi) {
  const float from = static_cast<float>(lo), to = static_cast<float>(hi);
  for (int64_t i = 0; i < n; i++) {
    const double x = static_cast<double>(gen() & ((1u << 24) - 1)) * (1.0 / (1u << 24));
    out[i] = static_cast<float>(x * static_cast<double>(to - from) + from);
  }
}

void normal_fill_16(float* data, float mean, float std) {
  for (int j = 0; j < 8; j++) {
    const float u1 = 1 - data[j];
    const float u2 = data[j + 8];
    const float radius = std::sqrt(-2 * std::log(u1));
    const float theta = static_cast<float>(2.0f * M_PI * u2);
    data[j] = radius * std::cos(theta) * std + mean;
    data[j + 8] = radius * std::sin(theta) * std + mean;
  }
}

// torch.nn.init.normal_ on a contiguous float tensor of n >= 16 elements (aten's normal_fill).
void torch_normal(std::mt19937& gen, float* data, int64_t n, float mean, float std) {
  DTLAB_CHECK(n >= 16, "torch_normal: fewer than 16 elements take torch's other path");
  for (int64_t i = 0; i < n; i++) data[i] = uniform01(gen);
  for (int64_t i = 0; i < n - 15; i += 16) normal_fill_16(data + i, mean, std);
  if (n % 16 != 0) {
    float* tail = data + n - 16;
    for (int i = 0; i < 16; i++) tail[i] = uniform01(gen);
    normal_fill_16(tail, mean, std);
  }
}

double linear_kaiming_bound(int64_t fan_in) {  // kaiming_uniform_(a=sqrt(5))
  return std::sqrt(3.0) * (std::sqrt(2.0 / 6.0) / std::sqrt(static_cast<double>(fan_in)));
}

}  // namespace

void check_gpt_tp(const GptSpec& s, int tp, bool sequence_parallel) {
  if (tp <= 1) return;
  const std::string t = std::to_string(tp);
  if (s.heads % tp != 0)
    throw Error("--tp " + t + " gives each rank whole attention heads, but " + s.str() + " has " + std::to_string(s.heads) +
                " heads, which do not divide by " + t + "; use a --tp that divides heads=" + std::to_string(s.heads));
  if (sequence_parallel && s.ctx % tp != 0)
    throw Error("--sequence-parallel gives each of the --tp " + t + " ranks an equal run of every sample's " + std::to_string(s.ctx) +
                " positions, which do not divide by " + t + "; use a --tp that divides ctx=" + std::to_string(s.ctx));
}

std::vector<Parameter> gpt_stage_parameters(const GptSpec& s, GptRange r, int tp) {
  if (r.whole(s)) return gpt_parameters(s, tp);
  const std::vector<Parameter> full = gpt_parameters(s, tp);
  std::vector<Parameter> ps;
  int64_t offset = 0;
  auto take = [&](const Parameter& q, std::string name) {
    ps.push_back({std::move(name), q.shape, offset, q.numel});
    offset += q.numel;
  };
  using P = GptParamIndex;
  if (r.embeds()) {
    take(full[P::kWte], full[P::kWte].name);
    take(full[P::kWpe], full[P::kWpe].name);
  }
  for (int l = r.first_block(); l < r.end_block(s); l++)
    for (int k = 0; k < P::per_block(s, l); k++) {
      const Parameter& q = full[static_cast<size_t>(P::block(s, l, static_cast<P::Block>(k)))];
      take(q, q.name);
    }
  if (r.heads(s)) {
    for (int i : {P::ln_f_weight(s), P::ln_f_bias(s)}) take(full[static_cast<size_t>(i)], full[static_cast<size_t>(i)].name);
    if (!r.embeds()) take(full[P::kWte], "lm_head.weight");
  }
  return ps;
}

std::vector<int64_t> gpt_stage_sources(const GptSpec& s, GptRange r) {
  const std::vector<Parameter> whole = gpt_parameters(s.whole());
  std::vector<int64_t> out;
  for (const Parameter& p : gpt_stage_parameters(s, r)) {
    const std::string name = p.name == "lm_head.weight" ? "transformer.wte.weight" : p.name;
    const auto q = std::find_if(whole.begin(), whole.end(), [&](const Parameter& w) { return w.name == name; });
    DTLAB_CHECK(q != whole.end() && q->numel == p.numel, "a GPT stage's parameter is not the whole model's");
    out.push_back(q->offset);
  }
  return out;
}

namespace {

// GPT(config)'s draws from `gen` into v (gpt_parameters' layout).
void gpt_init_draws(const GptSpec& s, std::mt19937& gen, std::vector<float>& v);

}  // namespace

std::vector<float> gpt_init_values(const GptSpec& spec, uint64_t seed) {
  const GptSpec s = spec.whole();
  DTLAB_CHECK(s.vocab >= 2, "gpt_init_values: the vocabulary must be known");
  std::vector<float> v(static_cast<size_t>(s.num_params()));
  std::mt19937 gen(static_cast<uint32_t>(seed));
  gpt_init_draws(s, gen, v);
  return v;
}

std::vector<float> gpt_lora_init_values(const GptSpec& spec, const LoraSpec& lora, uint64_t seed, int first_block, int end_block) {
  const GptSpec s = spec.whole();
  std::vector<float> base(static_cast<size_t>(s.num_params()));
  std::mt19937 gen(static_cast<uint32_t>(seed));
  gpt_init_draws(s, gen, base);  // the model's own draws come first
  const int64_t r = lora.rank, C = s.embd;
  const double bound_a = linear_kaiming_bound(C), bound_b = linear_kaiming_bound(r);
  std::vector<float> out, scratch(static_cast<size_t>(3 * C * r));
  for (int l = 0; l < static_cast<int>(s.layers); l++) {
    if (!lora.adapts(l)) continue;
    torch_uniform_range(gen, scratch.data(), r * C, -bound_a, bound_a);      // nn.Linear(C, r, bias=False)
    torch_uniform_range(gen, scratch.data(), 3 * C * r, -bound_b, bound_b);  // nn.Linear(r, 3C, bias=False)
    torch_uniform_range(gen, scratch.data(), r * C, -bound_a, bound_a);      // reset_lora_parameters: A again
    if (l >= first_block && l < end_block) out.insert(out.end(), scratch.begin(), scratch.begin() + r * C);
  }
  return out;
}

namespace {

void gpt_init_draws(const GptSpec& s, std::mt19937& gen, std::vector<float>& v) {
  const std::vector<Parameter> ps = gpt_parameters(s);
  auto at = [&](int i) { return v.data() + ps[static_cast<size_t>(i)].offset; };
  auto numel = [&](int i) { return ps[static_cast<size_t>(i)].numel; };
  using P = GptParamIndex;
  const int L = static_cast<int>(s.layers);
  const int64_t C = s.embd;
  // The constructors, in GPT.__init__'s order.
  torch_normal(gen, at(P::kWte), numel(P::kWte), 0.0f, 1.0f);  // nn.Embedding: normal_(0, 1)
  torch_normal(gen, at(P::kWpe), numel(P::kWpe), 0.0f, 1.0f);
  auto linear_ctor = [&](int w, int b, int64_t fan_in) {
    torch_uniform_range(gen, at(w), numel(w), -linear_kaiming_bound(fan_in), linear_kaiming_bound(fan_in));
    const double bb = 1.0 / std::sqrt(static_cast<double>(fan_in));
    torch_uniform_range(gen, at(b), numel(b), -bb, bb);
  };
  auto blk = [&](int l, P::Block k) { return P::block(s, l, k); };
  auto ex = [&](int l, int e, P::Expert k) { return P::expert(s, l, e, k); };
  const int E = static_cast<int>(s.moe.experts);
  for (int l = 0; l < L; l++) {
    linear_ctor(blk(l, P::AttnW), blk(l, P::AttnB), C);
    linear_ctor(blk(l, P::AttnProjW), blk(l, P::AttnProjB), C);
    if (s.moe.in_block(l)) {  // nn.Linear(C, E, bias=False), then each expert's MLP
      const int r = P::router(s, l);
      torch_uniform_range(gen, at(r), numel(r), -linear_kaiming_bound(C), linear_kaiming_bound(C));
      for (int e = 0; e < E; e++) {
        linear_ctor(ex(l, e, P::ExFcW), ex(l, e, P::ExFcB), C);
        linear_ctor(ex(l, e, P::ExProjW), ex(l, e, P::ExProjB), 4 * C);
      }
      continue;
    }
    linear_ctor(blk(l, P::FcW), blk(l, P::FcB), C);
    linear_ctor(blk(l, P::FcProjW), blk(l, P::FcProjB), 4 * C);
  }
  for (int l = 0; l < L; l++)
    for (P::Block k : {P::Ln1W, P::Ln2W}) std::fill_n(at(blk(l, k)), C, 1.0f);
  std::fill_n(at(P::ln_f_weight(s)), C, 1.0f);
  // lm_head = nn.Linear(C, V, bias=False): its kaiming draws, into the weight wte is then tied to.
  torch_uniform_range(gen, at(P::kWte), numel(P::kWte), -linear_kaiming_bound(C), linear_kaiming_bound(C));
  // self.apply(self._init_weights): children first, so wte, wpe, each block's Linears (an MoE block's
  // router, then its experts' c_fc and c_proj), then lm_head.
  torch_normal(gen, at(P::kWte), numel(P::kWte), 0.0f, 0.02f);
  torch_normal(gen, at(P::kWpe), numel(P::kWpe), 0.0f, 0.02f);
  auto linear_init = [&](int w, int b) {
    torch_normal(gen, at(w), numel(w), 0.0f, 0.02f);
    if (b >= 0) std::fill_n(at(b), numel(b), 0.0f);
  };
  for (int l = 0; l < L; l++) {
    linear_init(blk(l, P::AttnW), blk(l, P::AttnB));
    linear_init(blk(l, P::AttnProjW), blk(l, P::AttnProjB));
    if (s.moe.in_block(l)) {
      linear_init(P::router(s, l), -1);
      for (int e = 0; e < E; e++) {
        linear_init(ex(l, e, P::ExFcW), ex(l, e, P::ExFcB));
        linear_init(ex(l, e, P::ExProjW), ex(l, e, P::ExProjB));
      }
      continue;
    }
    linear_init(blk(l, P::FcW), blk(l, P::FcB));
    linear_init(blk(l, P::FcProjW), blk(l, P::FcProjB));
  }
  torch_normal(gen, at(P::kWte), numel(P::kWte), 0.0f, 0.02f);  // lm_head's weight: the tied one
  // The residual projections again (every name ending in c_proj.weight, the experts' too), in
  // named_parameters() order (GPT-2's scaled init).
  const float proj_std = static_cast<float>(0.02 / std::sqrt(2.0 * static_cast<double>(L)));
  for (int l = 0; l < L; l++) {
    torch_normal(gen, at(blk(l, P::AttnProjW)), numel(blk(l, P::AttnProjW)), 0.0f, proj_std);
    if (s.moe.in_block(l))
      for (int e = 0; e < E; e++) torch_normal(gen, at(ex(l, e, P::ExProjW)), numel(ex(l, e, P::ExProjW)), 0.0f, proj_std);
    else
      torch_normal(gen, at(blk(l, P::FcProjW)), numel(blk(l, P::FcProjW)), 0.0f, proj_std);
  }
}

}  // namespace

}  // namespace dtlab
