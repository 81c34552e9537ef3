#include "engine/parallel/sizing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/core/check.h"
#include "engine/core/format.h"  // with_commas

namespace dtlab {

namespace {

std::string num(int64_t v) { return std::to_string(v); }

void validate(const SizingInput& in) {
  auto at_least_1 = [](double v, const char* what) {
    if (!(v >= 1)) throw Error(std::string(what) + " must be at least 1");
  };
  if (!(in.params >= 1)) throw Error("the parameter count must be at least 1");
  at_least_1(in.layers, "the number of layers");
  at_least_1(double(in.hidden), "the hidden size");
  at_least_1(in.heads, "the number of attention heads");
  at_least_1(double(in.seq), "the sequence length");
  at_least_1(double(in.global_batch), "the global batch");
  at_least_1(double(in.micro_batch), "the micro-batch");
  at_least_1(in.dp, "--dp");
  at_least_1(in.tp, "--tp");
  at_least_1(in.pp, "--pp");
  if (in.zero < 0 || in.zero > 3) throw Error("ZeRO stage " + std::to_string(in.zero) + " does not exist; use 0 (DDP), 1, 2 or 3");
  if (!(in.mfu > 0 && in.mfu <= 1)) throw Error("the MFU is a share of the peak; give one above 0 and at most 1, e.g. 0.4");
  if (!(in.compute_seconds >= 0)) throw Error("the compute time per step cannot be negative");
  if (!(in.gpu_memory > 0)) throw Error("the GPU memory must be above 0 bytes");
  if (in.layers % in.pp != 0)
    throw Error(num(in.layers) + " layers do not split evenly over " + num(in.pp) + " pipeline stages; every stage holds the same number of layers");
  if (in.heads % in.tp != 0)
    throw Error(num(in.heads) + " attention heads do not split evenly over tp " + num(in.tp) + "; every TP rank takes whole heads");
  if (in.hidden % in.tp != 0)
    throw Error("hidden size " + num(in.hidden) + " does not split evenly over tp " + num(in.tp) + "; tensor parallelism splits it evenly");
  if (in.tp > 1 && in.sequence_parallel && in.seq % in.tp != 0)
    throw Error("sequence length " + num(in.seq) + " does not split evenly over tp " + num(in.tp) + ", as sequence parallelism needs");
  const int64_t per_step = int64_t(in.dp) * in.micro_batch;
  if (in.global_batch % per_step != 0)
    throw Error("a global batch of " + num(in.global_batch) + " sequences does not split into whole micro-batches of " +
                num(in.micro_batch) + " on " + num(in.dp) + " replicas; use a multiple of dp x micro-batch = " + num(per_step));
}

Sharding sharding_of_stage(int zero) {
  switch (zero) {
    case 1: return Sharding::Zero1;
    case 2: return Sharding::ShardGradOp;
    case 3: return Sharding::FullShard;
    default: return Sharding::NoShard;
  }
}

// memory_plan.h's layer_activation_bytes, counted for 2-byte activations: twice that in fp32.
double sizing_layer_bytes(const SizingInput& in, bool sp) {
  const double bytes = layer_activation_bytes(in.seq, in.micro_batch, in.hidden, in.heads, in.tp, sp, in.recompute);
  return in.precision == PlanDType::Fp32 ? 2 * bytes : bytes;
}

std::string activation_formula(const SizingInput& in, bool sp) {
  std::string f;
  if (in.recompute) f = sp ? "2·s·b·h/t (each layer's input, sequence parallel)" : "2·s·b·h (each layer's input)";
  else if (in.tp == 1) f = "s·b·h·(34 + 5·a·s/h)";
  else if (sp) f = "s·b·h·(34 + 5·a·s/h)/t";
  else f = "s·b·h·(10 + 24/t + 5·a·s/(h·t))";
  f = "(L/p)·" + std::string(in.pp > 1 ? "min(m, p)·" : "") + f;
  return in.precision == PlanDType::Fp32 ? f + " · 2 (fp32)" : f;
}

}  // namespace

double gpu_peak_flops(const HardwareProfile& profile) {
  if (profile.name.rfind("dgx-h100", 0) == 0) return 989e12;  // H100 SXM, dense bf16
  if (profile.name == "this" || profile.name == "ideal") return profile.flops_per_s > 0 ? profile.flops_per_s : 312e12;
  return 312e12;  // A100, dense bf16: the class the other profiles model
}

SizingPlan plan_sizing(const SizingInput& in) {
  validate(in);
  const HardwareProfile profile = find_profile(in.profile);  // its sentence for an unknown name
  const bool sp = in.sequence_parallel && in.tp > 1;
  SizingPlan p;
  p.world = in.dp * in.tp * in.pp;
  p.micro_batches = in.global_batch / (int64_t(in.dp) * in.micro_batch);
  p.tokens = double(in.global_batch) * double(in.seq);

  MeshPlanInput mi;
  mi.memory.params = in.params;
  mi.memory.world = p.world;
  mi.memory.sharding = sharding_of_stage(in.zero);
  mi.memory.dtype = in.precision;
  mi.tp = in.tp;
  mi.stages = in.pp;
  mi.sequence_parallel = sp;
  mi.shape = TransformerShape{.layers = in.layers, .hidden = in.hidden, .seq = in.seq, .micro_batch = in.micro_batch,
                              .micro_batches = static_cast<int>(std::min<int64_t>(p.micro_batches, 1 << 30))};
  p.mesh = plan_mesh(mi, &profile);

  // Memory per GPU: the model split over tp x pp, its states sharded over dp by the ZeRO stage.
  p.params = p.mesh.memory.parameters;
  p.grads = p.mesh.memory.gradients;
  p.optimizer = p.mesh.memory.optimizer_state;
  p.in_flight = in.pp > 1 ? static_cast<int>(std::min<int64_t>(p.micro_batches, in.pp)) : 1;
  p.activations = double(in.layers / in.pp) * p.in_flight * sizing_layer_bytes(in, sp);
  p.total = p.params + p.grads + p.optimizer + p.activations;
  p.fits = p.total <= in.gpu_memory;

  // FLOPs per step: 2 per parameter and token forward, 4 backward (Kaplan et al.), plus the attention
  // scores and their product with V, 12·L·h·s per token (PaLM, Appendix B). Recomputation runs the
  // forward again: a third more.
  p.dense_flops = 6 * in.params * p.tokens;
  p.attention_flops = 12.0 * in.layers * double(in.hidden) * double(in.seq) * p.tokens;
  p.model_flops = p.dense_flops + p.attention_flops;
  p.recompute_flops = in.recompute ? p.model_flops / 3 : 0;
  p.peak_flops = gpu_peak_flops(profile);
  p.compute_seconds = in.compute_seconds > 0 ? in.compute_seconds
                                             : (p.model_flops + p.recompute_flops) / (p.world * p.peak_flops * in.mfu);
  // 1F1B's idle time: (p-1) micro-batch slots of each stage's m, so (p-1)/m of the compute.
  p.bubble = in.pp > 1 ? double(in.pp - 1) / double(p.micro_batches + in.pp - 1) : 0;
  p.bubble_seconds = in.pp > 1 ? p.compute_seconds * double(in.pp - 1) / double(p.micro_batches) : 0;

  // Traffic per GPU per step on each dimension's slowest hop (mesh_plan.h's counts); recomputation
  // repeats the forward's two TP collectives per layer, 6 instead of 4.
  const DimTraffic& dp = p.mesh.traffic[static_cast<size_t>(MeshDim::DP)];
  const DimTraffic& tp = p.mesh.traffic[static_cast<size_t>(MeshDim::TP)];
  const DimTraffic& pp = p.mesh.traffic[static_cast<size_t>(MeshDim::PP)];
  const double tp_factor = in.recompute ? 1.5 : 1.0;
  p.dp_bytes = in.dp > 1 ? dp.bytes : 0;
  p.tp_bytes = in.tp > 1 ? tp.bytes * tp_factor : 0;
  p.pp_bytes = in.pp > 1 ? pp.bytes : 0;
  p.dp_seconds = in.dp > 1 ? dp.link_seconds : 0;
  p.tp_seconds = in.tp > 1 ? tp.link_seconds * tp_factor : 0;
  p.pp_seconds = in.pp > 1 ? pp.link_seconds : 0;
  p.comm_seconds = p.dp_seconds + p.tp_seconds + p.pp_seconds;
  p.step_seconds = p.compute_seconds + p.bubble_seconds + p.comm_seconds;
  p.ratio = p.comm_seconds / p.compute_seconds;
  p.overhead = p.comm_seconds / (p.compute_seconds + p.comm_seconds);
  p.grad_bytes = in.params * bytes_per_param(in.precision, OptimizerKind::AdamW, false).gradients;

  const BytesPerParam bpp = bytes_per_param(in.precision, OptimizerKind::AdamW, false);
  const std::string g = std::to_string(bpp.gradients), k = std::to_string(bpp.optimizer_state);
  const std::string nd = in.zero == 0 ? "" : "/d";
  const std::string shard = "Ψ/(t·p)";
  auto link_of = [&](const DimTraffic& d, double bytes_per_s_beta) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " on %s (%s, %.0f GB/s)", d.link.c_str(),
                  d.groups_spanning_nodes ? "across nodes" : "inside a node", bytes_per_s_beta > 0 ? 1e-9 / bytes_per_s_beta : 0.0);
    return std::string(buf);
  };
  const Link dp_link = dp.groups_spanning_nodes ? profile.inter : profile.intra;
  const Link tp_link = tp.groups_spanning_nodes ? profile.inter : profile.intra;
  const Link pp_link = pp.groups_spanning_nodes ? profile.inter : profile.intra;
  const std::string mfu_text = in.compute_seconds > 0 ? "given (--compute-time)" : "(model + recompute FLOPs) / (GPUs · peak · MFU)";
  const double achieved = p.model_flops / (p.world * p.peak_flops * p.compute_seconds);
  using U = SizingUnit;
  p.lines = {
      {"Layout", "world", "GPUs", double(p.world), U::Count, "dp · tp · pp"},
      {"Layout", "micro_batches", "micro-batches per replica per step", double(p.micro_batches), U::Count, "m = B / (dp · b)"},
      {"Layout", "tokens", "tokens per step", p.tokens, U::Count, "B · s"},
      {"Memory per GPU", "memory.params", "parameters", p.params, U::Bytes, std::to_string(bpp.parameters) + "·" + shard + (in.zero >= 3 ? "/d" : "")},
      {"Memory per GPU", "memory.grads", "gradients", p.grads, U::Bytes, g + "·" + shard + (in.zero >= 2 ? "/d" : "")},
      {"Memory per GPU", "memory.optimizer", "optimizer states", p.optimizer, U::Bytes, k + "·" + shard + (in.zero >= 1 ? "/d" : "")},
      {"Memory per GPU", "memory.activations", "activations", p.activations, U::Bytes, activation_formula(in, sp)},
      {"Memory per GPU", "memory.total", "memory per GPU", p.total, U::Bytes, "the four above" + std::string(p.fits ? "" : ": more than the GPU holds")},
      {"Compute per step", "flops.dense", "dense FLOPs per step", p.dense_flops, U::Flops, "6 · N · B·s"},
      {"Compute per step", "flops.attention", "attention FLOPs per step", p.attention_flops, U::Flops, "12 · L · h · s · B·s"},
      {"Compute per step", "flops.recompute", "recomputed forward", p.recompute_flops, U::Flops, in.recompute ? "(dense + attention) / 3" : "no recomputation"},
      {"Compute per step", "flops.step", "model FLOPs per step", p.model_flops, U::Flops, "dense + attention"},
      {"Compute per step", "compute.seconds", "compute (forward + backward)", p.compute_seconds, U::Seconds, mfu_text},
      {"Compute per step", "mfu", "MFU achieved", achieved, U::Share, "model FLOPs / (GPUs · peak · compute time)"},
      {"Compute per step", "bubble.seconds", "pipeline bubble", p.bubble_seconds, U::Seconds, in.pp > 1 ? "compute · (p-1)/m (1F1B)" : "no pipeline"},
      {"Communication per GPU per step", "grad.bytes", "gradients of the whole model", p.grad_bytes, U::Bytes, "N · " + g},
      {"Communication per GPU per step", "dp.bytes", "DP: bytes per GPU per step", p.dp_bytes, U::Bytes, in.dp > 1 ? dp.formula : "no DP groups"},
      {"Communication per GPU per step", "dp.seconds", "DP: time on its link", p.dp_seconds, U::Seconds,
       in.dp > 1 ? "bytes / bandwidth" + link_of(dp, dp_link.beta) : "no DP groups"},
      {"Communication per GPU per step", "tp.bytes", "TP: bytes per GPU per step", p.tp_bytes, U::Bytes,
       in.tp > 1 ? (in.recompute ? "1.5 · " : "") + tp.formula + (in.recompute ? " (recompute: 6 per layer)" : "") : "no TP groups"},
      {"Communication per GPU per step", "tp.seconds", "TP: time on its link", p.tp_seconds, U::Seconds,
       in.tp > 1 ? "bytes / bandwidth" + link_of(tp, tp_link.beta) : "no TP groups"},
      {"Communication per GPU per step", "pp.bytes", "PP: bytes per GPU per step", p.pp_bytes, U::Bytes, in.pp > 1 ? pp.formula : "no pipeline"},
      {"Communication per GPU per step", "pp.seconds", "PP: time on its link", p.pp_seconds, U::Seconds,
       in.pp > 1 ? "bytes / bandwidth" + link_of(pp, pp_link.beta) : "no pipeline"},
      {"Communication per GPU per step", "comm.seconds", "communication", p.comm_seconds, U::Seconds, "dp + tp + pp, none overlapped"},
      {"Balance", "step.seconds", "step time", p.step_seconds, U::Seconds, "compute + bubble + communication"},
      {"Balance", "ratio", "communication / computation", p.ratio, U::Share, "comm / compute"},
      {"Balance", "overhead", "communication overhead", p.overhead, U::Share, "comm / (compute + comm); aim below 20%"},
      {"Balance", "efficiency", "scaling efficiency", 1 - p.overhead, U::Share, "compute / (compute + comm)"},
  };
  return p;
}

const SizingLine& sizing_line(const SizingPlan& p, const std::string& key) {
  for (const SizingLine& l : p.lines)
    if (l.key == key) return l;
  std::string keys;
  for (const SizingLine& l : p.lines) keys += (keys.empty() ? "" : ", ") + l.key;
  throw Error("'" + key + "' is not a sizing figure; use " + keys);
}

std::string format_sizing_value(double v, SizingUnit unit) {
  char buf[48];
  switch (unit) {
    case SizingUnit::Bytes: {
      const char* names[] = {"bytes", "kB", "MB", "GB", "TB", "PB"};
      int i = 0;
      double x = v;
      while (i < 5 && std::fabs(x) >= 1000) x /= 1000, i++;
      if (i == 0 || x == 0) std::snprintf(buf, sizeof buf, "%.0f bytes", v);
      else std::snprintf(buf, sizeof buf, "%.2f %s", x, names[i]);
      return buf;
    }
    case SizingUnit::Seconds:
      if (v == 0) return "0 s";
      if (v < 1e-3) std::snprintf(buf, sizeof buf, "%.1f µs", v * 1e6);
      else if (v < 1) std::snprintf(buf, sizeof buf, "%.1f ms", v * 1e3);
      else std::snprintf(buf, sizeof buf, "%.2f s", v);
      return buf;
    case SizingUnit::Flops: {
      const char* names[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP", "ZFLOP"};
      int i = 0;
      double x = v;
      while (i < 7 && std::fabs(x) >= 1000) x /= 1000, i++;
      if (v == 0) return "0 FLOP";
      std::snprintf(buf, sizeof buf, "%.2f %s", x, names[i]);
      return buf;
    }
    case SizingUnit::Share: std::snprintf(buf, sizeof buf, "%.1f%%", 100 * v); return buf;
    case SizingUnit::Count: break;
  }
  return with_commas(std::llround(v));  // 2,097,152 tokens
}

std::vector<std::string> sizing_mirror_flags(const SizingInput& in) {
  const int tp = std::min(in.tp, 2), pp = std::min(in.pp, 2);
  const int dp = std::max(1, std::min(in.dp, 8 / (tp * pp)));
  const int64_t m = std::clamp<int64_t>(in.global_batch / std::max<int64_t>(1, int64_t(in.dp) * in.micro_batch), 1, 4);
  std::vector<std::string> f;
  auto add = [&](const std::string& k, const std::string& v) { f.push_back(k), f.push_back(v); };
  if (pp > 1) {
    // A pipeline of the 4-Linear MLP, split 2 | 3 layers as lesson 21's; ZeRO does not apply to it.
    add("--strategy", "pipeline");
    add("--stages", "2");
    add("--dp", std::to_string(dp));
    add("--model", "mlp:2,64,64,64,64,3");
    add("--split", "2,3");
    add("--microbatches", std::to_string(std::max<int64_t>(m, 2)));
    add("--batch", "32");
  } else if (in.zero == 0) {
    add("--strategy", dp * tp > 1 ? "ddp" : "single");
    add("--batch", "16");
    add("--accum", std::to_string(m));
  } else {
    add("--strategy", "fsdp");
    add("--sharding", in.zero == 1 ? "zero1" : in.zero == 2 ? "grad-op" : "full");
    add("--batch", "16");
    add("--accum", std::to_string(m));
  }
  add("--world", std::to_string(dp * tp * pp));
  if (tp > 1) add("--tp", std::to_string(tp));
  if (tp > 1 && pp == 1 && in.sequence_parallel) f.push_back("--sequence-parallel");  // the lab's pipeline sends whole activations
  add("--precision", plan_dtype_name(in.precision));
  if (in.recompute) f.push_back("--activation-checkpointing");
  add("--profile", in.profile);
  return f;
}

SizingInput parse_sizing_spec(const std::string& spec) {
  SizingInput in;
  std::istringstream words(spec);
  std::string w;
  while (words >> w) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) throw Error("sizing: '" + w + "' is not key=value; write e.g. \"params=70B dp=64 tp=8\"");
    const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    const bool numeric = !v.empty() && end == v.c_str() + v.size() && std::isfinite(x);
    auto whole = [&]() -> int64_t {
      if (!numeric || x != std::floor(x) || x < 0 || x > 1e15) throw Error("sizing: " + k + "=" + v + " is not a whole number");
      return static_cast<int64_t>(x);
    };
    auto number = [&]() {
      if (!numeric) throw Error("sizing: " + k + "=" + v + " is not a number");
      return x;
    };
    auto small = [&]() -> int {
      const int64_t n = whole();
      if (n > (1 << 30)) throw Error("sizing: " + k + "=" + v + " is too large");
      return static_cast<int>(n);
    };
    if (k == "params") in.params = parse_param_count(v);
    else if (k == "layers") in.layers = small();
    else if (k == "hidden") in.hidden = whole();
    else if (k == "heads") in.heads = small();
    else if (k == "seq") in.seq = whole();
    else if (k == "global_batch") in.global_batch = whole();
    else if (k == "micro_batch") in.micro_batch = whole();
    else if (k == "dp") in.dp = small();
    else if (k == "tp") in.tp = small();
    else if (k == "pp") in.pp = small();
    else if (k == "precision") in.precision = parse_plan_dtype(v);
    else if (k == "zero") in.zero = small();
    else if (k == "recompute") in.recompute = whole() != 0;
    else if (k == "sp") in.sequence_parallel = whole() != 0;
    else if (k == "profile") in.profile = v;
    else if (k == "mfu") in.mfu = number();
    else if (k == "compute_s") in.compute_seconds = number();
    else if (k == "gpu_gb") in.gpu_memory = number() * 1e9;
    else
      throw Error("sizing: '" + k + "' is not a sizing setting; use params, layers, hidden, heads, seq, global_batch, micro_batch, "
                  "dp, tp, pp, precision, zero, recompute, sp, profile, mfu, compute_s or gpu_gb");
  }
  return in;
}

std::string sizing_spec(const SizingInput& in) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "params=%.0f layers=%d hidden=%lld heads=%d seq=%lld global_batch=%lld micro_batch=%lld dp=%d tp=%d pp=%d "
                "precision=%s zero=%d recompute=%d sp=%d profile=%s mfu=%g compute_s=%g gpu_gb=%g",
                in.params, in.layers, static_cast<long long>(in.hidden), in.heads, static_cast<long long>(in.seq),
                static_cast<long long>(in.global_batch), static_cast<long long>(in.micro_batch), in.dp, in.tp, in.pp,
                plan_dtype_name(in.precision), in.zero, in.recompute ? 1 : 0, in.sequence_parallel ? 1 : 0, in.profile.c_str(),
                in.mfu, in.compute_seconds, in.gpu_memory / 1e9);
  return buf;
}

}  // namespace dtlab
