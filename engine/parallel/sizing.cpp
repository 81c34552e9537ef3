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

MegatronLayout megatron_layout(const SizingInput& in) {
  return MegatronLayout{.tp = in.tp, .cp = in.cp, .ep = in.moe.experts > 0 ? in.moe.ep : 1, .dp = in.dp, .pp = in.pp};
}

CpShape cp_shape(const SizingInput& in) {
  return CpShape{.cp = in.cp, .layout = in.cp_layout, .seq = in.seq, .micro_batch = in.micro_batch, .hidden = in.hidden,
                 .heads = in.heads, .kv_heads = in.kv_heads_or_heads(), .tp = in.tp,
                 .element_bytes = in.precision == PlanDType::Fp32 ? 4 : 2, .recompute = in.recompute};
}

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
  at_least_1(in.cp, "--cp");
  if (double(in.dp) * in.tp * in.cp * in.pp > double(1 << 24))  // in double: the degrees' product may not fit an integer
    throw Error("dp x tp x cp x pp is more GPUs than the calculator places (16,777,216); use smaller degrees");
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
  const int kv = in.kv_heads_or_heads();
  if (kv < 1 || in.heads % kv != 0)
    throw Error("--kv-heads " + num(kv) + " does not divide the " + num(in.heads) +
                " attention heads; grouped-query attention shares each K/V head among a whole number of query heads");
  if (kv % in.tp != 0)
    throw Error(num(kv) + " K/V heads do not split evenly over tp " + num(in.tp) + "; every TP rank takes whole K/V heads");
  check_context_parallel(cp_shape(in));
  if (in.cp > 1 && in.tp > 1 && in.sequence_parallel && (in.seq / in.cp) % in.tp != 0)
    throw Error("the " + num(in.seq / in.cp) + " tokens of each CP rank do not split evenly over tp " + num(in.tp) +
                ", as sequence parallelism needs; pick a --seq divisible by cp x tp = " + num(int64_t(in.cp) * in.tp));
  check_moe(in.moe, in.params, in.layers, in.hidden, in.pp);
  check_megatron_layout(megatron_layout(in));
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
  if (in.cp > 1) f += " / c (each CP rank keeps s/c tokens)";
  return in.precision == PlanDType::Fp32 ? f + " · 2 (fp32)" : f;
}

}  // namespace

double gpu_peak_flops(const HardwareProfile& profile) {
  if (profile.name.rfind("dgx-h100", 0) == 0) return 989e12;  // H100 SXM, dense bf16
  if (profile.name == "this" || profile.name == "ideal") return profile.flops_per_s > 0 ? profile.flops_per_s : 312e12;
  return 312e12;  // A100, dense bf16: the class the other profiles model
}

namespace {

// Each kind of group the layout has, placed on the profile's nodes in Megatron-core's order.
std::vector<SizingGroup> place_groups(const SizingInput& in, const HardwareProfile& profile) {
  std::vector<ParallelGroup> kinds = {ParallelGroup::TP, ParallelGroup::CP, ParallelGroup::DPCP, ParallelGroup::PP};
  if (in.moe.experts > 0) kinds.insert(kinds.end(), {ParallelGroup::EP, ParallelGroup::EDP});
  std::vector<SizingGroup> out;
  for (ParallelGroup g : kinds) {
    SizingGroup sg{.group = g, .place = place_group(megatron_layout(in), g, profile.gpus_per_node), .link = "", .beta = 0};
    const bool inter = sg.place.crosses_nodes();
    sg.link = fabric_name(inter ? profile.inter_fabric : profile.intra_fabric);
    sg.beta = (inter ? profile.inter : profile.intra).beta;
    out.push_back(sg);
  }
  return out;
}

const SizingGroup& group_of(const SizingPlan& p, ParallelGroup g) {
  for (const SizingGroup& sg : p.placement)
    if (sg.group == g) return sg;
  static const SizingGroup none;
  return none;
}

// " on NVSwitch (inside a node, 370 GB/s)"
std::string link_text(const SizingGroup& g) {
  char buf[96];
  std::snprintf(buf, sizeof buf, " on %s (%s, %.0f GB/s)", g.link.c_str(), g.place.crosses_nodes() ? "across nodes" : "inside a node",
                g.beta > 0 ? 1e-9 / g.beta : 0.0);
  return buf;
}

// "8 ranks 1 apart: inside a node", "4 ranks 16 apart: 8 of 8 groups cross nodes"
std::string placement_text(const SizingGroup& g) {
  const GroupPlacement& pl = g.place;
  if (pl.size < 2) return "1 rank each: no group";
  std::string s = std::to_string(pl.size) + " ranks " + std::to_string(pl.stride) + " apart: ";
  if (!pl.crosses_nodes()) return s + "inside a node (" + g.link + ")";
  return s + std::to_string(pl.spanning) + " of " + std::to_string(pl.groups) + " groups cross nodes (" + g.link + ")";
}

}  // namespace

SizingPlan plan_sizing(const SizingInput& in) {
  validate(in);
  const HardwareProfile profile = find_profile(in.profile);  // its sentence for an unknown name
  const bool sp = in.sequence_parallel && in.tp > 1;
  const bool moe = in.moe.experts > 0;
  SizingPlan p;
  p.world = in.dp * in.tp * in.cp * in.pp;
  p.micro_batches = in.global_batch / (int64_t(in.dp) * in.micro_batch);
  p.tokens = double(in.global_batch) * double(in.seq);
  p.moe = moe_params(in.moe, in.params, in.layers, in.hidden);
  p.expert_dp = megatron_layout(in).expert_dp();

  // The dense (non-expert) weights: split over tp x pp, replicated over dp x cp, where ZeRO shards them
  // and their gradients are reduced (Megatron's data-parallel group with CP). Each rank's traffic
  // moves its own s/c tokens.
  MeshPlanInput mi;
  mi.memory.params = p.moe.non_expert;
  mi.memory.world = p.world;
  mi.memory.sharding = sharding_of_stage(in.zero);
  mi.memory.dtype = in.precision;
  mi.tp = in.tp;
  mi.stages = in.pp;
  mi.sequence_parallel = sp;
  mi.shape = TransformerShape{.layers = in.layers, .hidden = in.hidden, .seq = in.seq / in.cp, .micro_batch = in.micro_batch,
                              .micro_batches = static_cast<int>(std::min<int64_t>(p.micro_batches, 1 << 30))};
  p.mesh = plan_mesh(mi);
  // The experts: E/e per rank, each split over tp (Megatron's expert tensor parallelism defaults to tp)
  // and the MoE layers over pp; ZeRO shards them over their edp replicas.
  MemoryPlan experts;
  if (moe) {
    MemoryPlanInput ex = mi.memory;
    ex.params = std::ceil(p.moe.expert / (double(in.tp) * in.pp * in.moe.ep));
    ex.world = p.expert_dp;
    experts = plan_memory(ex);
  }
  p.rank_params = p.mesh.rank_params + (moe ? std::ceil(p.moe.expert / (double(in.tp) * in.pp * in.moe.ep)) : 0);

  // Memory per GPU: the model split over tp x pp (experts over ep too), its states sharded by the ZeRO stage.
  p.params = p.mesh.memory.parameters + experts.parameters;
  p.grads = p.mesh.memory.gradients + experts.gradients;
  p.optimizer = p.mesh.memory.optimizer_state + experts.optimizer_state;
  p.in_flight = in.pp > 1 ? static_cast<int>(std::min<int64_t>(p.micro_batches, in.pp)) : 1;
  // Context parallelism splits every activation along the sequence, the attention scores included
  // (a rank's s/c queries against all s keys, or all s queries of its a/c heads under Ulysses).
  p.activations = double(in.layers / in.pp) * p.in_flight * sizing_layer_bytes(in, sp) / in.cp;
  p.total = p.params + p.grads + p.optimizer + p.activations;
  p.fits = p.total <= in.gpu_memory;

  // FLOPs per step: 2 per parameter and token forward, 4 backward (Kaplan et al.), plus the attention
  // scores and their product with V, 12·L·h·s per token (PaLM, Appendix B). Recomputation runs the
  // forward again: a third more. Under MoE a token goes through k experts: the active parameters.
  p.dense_flops = 6 * p.moe.active * p.tokens;
  p.attention_flops = 12.0 * in.layers * double(in.hidden) * double(in.seq) * p.tokens;
  p.model_flops = p.dense_flops + p.attention_flops;
  p.recompute_flops = in.recompute ? p.model_flops / 3 : 0;
  p.peak_flops = gpu_peak_flops(profile);
  p.compute_seconds = in.compute_seconds > 0 ? in.compute_seconds
                                             : (p.model_flops + p.recompute_flops) / (p.world * p.peak_flops * in.mfu);
  // 1F1B's idle time: (p-1) micro-batch slots of each stage's m, so (p-1)/m of the compute.
  p.bubble = in.pp > 1 ? double(in.pp - 1) / double(p.micro_batches + in.pp - 1) : 0;
  p.bubble_seconds = in.pp > 1 ? p.compute_seconds * double(in.pp - 1) / double(p.micro_batches) : 0;
  // The contiguous ring's causal imbalance: every rank waits for the busiest one's attention.
  p.cp_imbalance = cp_causal_imbalance(in.cp_layout, in.cp);
  p.cp_wait_seconds = p.compute_seconds * p.attention_flops / p.model_flops * (p.cp_imbalance - 1);

  // Traffic per GPU per step (mesh_plan.h's counts for dp, tp, pp); recomputation repeats the
  // forward's two TP collectives per layer, 6 instead of 4.
  const DimTraffic& dp = p.mesh.traffic[static_cast<size_t>(MeshDim::DP)];
  const DimTraffic& tp = p.mesh.traffic[static_cast<size_t>(MeshDim::TP)];
  const DimTraffic& pp = p.mesh.traffic[static_cast<size_t>(MeshDim::PP)];
  const double tp_factor = in.recompute ? 1.5 : 1.0;
  const int layers_per_stage = in.layers / in.pp;
  const CpTraffic cpt = cp_layer_traffic(cp_shape(in));
  const int e = p.mesh.activation_bytes;
  p.dp_bytes = p.mesh.mesh.dp > 1 ? dp.bytes : 0;
  p.tp_bytes = in.tp > 1 ? tp.bytes * tp_factor : 0;
  p.pp_bytes = in.pp > 1 ? pp.bytes : 0;
  p.cp_bytes = double(layers_per_stage) * p.micro_batches * cpt.per_layer();
  const double rank_tokens = double(in.micro_batch) * double(in.seq) / in.cp;
  p.ep_bytes = moe ? double(layers_per_stage / in.moe.moe_every) * p.micro_batches *
                         moe_layer_alltoall_bytes(in.moe, rank_tokens, in.hidden, e, in.recompute)
                   : 0;
  p.edp_bytes = moe && p.expert_dp > 1 ? experts.comm_bytes : 0;

  // Each group on the profile's nodes, in Megatron-core's order; its link prices the bytes.
  p.placement = place_groups(in, profile);
  const SizingGroup &tp_g = group_of(p, ParallelGroup::TP), &cp_g = group_of(p, ParallelGroup::CP),
                    &dp_g = group_of(p, ParallelGroup::DPCP), &pp_g = group_of(p, ParallelGroup::PP),
                    &ep_g = group_of(p, ParallelGroup::EP), &edp_g = group_of(p, ParallelGroup::EDP);
  p.dp_seconds = p.dp_bytes * dp_g.beta;
  p.tp_seconds = p.tp_bytes * tp_g.beta;
  p.pp_seconds = p.pp_bytes * pp_g.beta;
  p.cp_seconds = p.cp_bytes * cp_g.beta;
  p.ep_seconds = p.ep_bytes * ep_g.beta;
  p.edp_seconds = p.edp_bytes * edp_g.beta;
  p.comm_seconds = p.dp_seconds + p.tp_seconds + p.pp_seconds + p.cp_seconds + p.ep_seconds + p.edp_seconds;
  p.step_seconds = p.compute_seconds + p.bubble_seconds + p.cp_wait_seconds + p.comm_seconds;
  p.ratio = p.comm_seconds / p.compute_seconds;
  p.overhead = p.comm_seconds / (p.compute_seconds + p.comm_seconds);
  p.grad_bytes = p.moe.total * bytes_per_param(in.precision, OptimizerKind::AdamW, false).gradients;

  const BytesPerParam bpp = bytes_per_param(in.precision, OptimizerKind::AdamW, false);
  const std::string g = std::to_string(bpp.gradients), k = std::to_string(bpp.optimizer_state);
  // Ψ/(t·p), sharded by ZeRO over d (d·c with CP); with experts Ψ_n/(t·p) + Ψ_x/(t·p·e), the experts
  // sharded over their edp replicas.
  auto share = [&](int stage) {
    const bool sharded = in.zero >= stage;
    const std::string d = sharded ? (in.cp > 1 ? "/(d·c)" : "/d") : "";
    if (!moe) return "Ψ/(t·p)" + d;
    return "(Ψ_n/(t·p)" + d + " + Ψ_x/(t·p·ep)" + (sharded ? "/edp" : "") + ")";
  };
  const std::string mfu_text = in.compute_seconds > 0 ? "given (--compute-time)" : "(model + recompute FLOPs) / (GPUs · peak · MFU)";
  const double achieved = p.model_flops / (p.world * p.peak_flops * p.compute_seconds);
  const std::string dp_note = std::string(moe ? ", the non-expert Ψ_n only" : "") +
                              (in.cp > 1 ? " (d = dp·cp: CP ranks reduce their gradients with DP)" : "");
  std::string imbalance_text = "no context parallelism";
  if (in.cp > 1)
    imbalance_text = in.cp_layout == CpLayout::Ring ? "2c/(c+1): contiguous ring, the last rank's queries see c blocks, the first's 1"
                     : in.cp_layout == CpLayout::Zigzag ? "1: zigzag, ranks hold chunks r and 2c-1-r, 2c+1 chunk pairs each"
                                                        : "1: Ulysses, every rank attends the whole sequence for its a/c heads";
  using U = SizingUnit;
  const std::string C = "Communication per GPU per step";
  p.lines = {
      {"Layout", "world", "GPUs", double(p.world), U::Count, in.cp > 1 ? "dp · tp · cp · pp" : "dp · tp · pp"},
      {"Layout", "micro_batches", "micro-batches per replica per step", double(p.micro_batches), U::Count, "m = B / (dp · b)"},
      {"Layout", "tokens", "tokens per step", p.tokens, U::Count, "B · s"},
  };
  if (moe) {
    const std::string moe_layers = in.moe.moe_every > 1 ? "(L/M)" : "L";
    p.lines.insert(p.lines.end(), {
        {"Layout", "moe.experts_per_rank", "experts per GPU in each MoE layer", double(in.moe.experts / in.moe.ep), U::Count, "E / ep"},
        {"Layout", "moe.edp", "expert-data-parallel size", double(p.expert_dp), U::Count,
         "d · c / ep (Megatron: the ranks holding the same experts, which reduce their gradients)"},
        {"Layout", "params.total", "parameters in all", p.moe.total, U::Count, "Ψ_n + Ψ_x: Ψ - " + moe_layers + "·8h² + " + moe_layers + "·E·(8h² + h)"},
        {"Layout", "params.active", "parameters a token goes through", p.moe.active, U::Count, "Ψ_n + " + moe_layers + "·k·8h²"},
        {"Layout", "params.rank", "parameters per GPU before ZeRO", p.rank_params, U::Count,
         "Ψ_n/(t·p) + Ψ_x/(t·p·ep): experts split E/ep, the rest replicated over ep"},
    });
  }
  p.lines.insert(p.lines.end(), {
      {"Memory per GPU", "memory.params", "parameters", p.params, U::Bytes, std::to_string(bpp.parameters) + "·" + share(3)},
      {"Memory per GPU", "memory.grads", "gradients", p.grads, U::Bytes, g + "·" + share(2)},
      {"Memory per GPU", "memory.optimizer", "optimizer states", p.optimizer, U::Bytes, k + "·" + share(1)},
      {"Memory per GPU", "memory.activations", "activations", p.activations, U::Bytes, activation_formula(in, sp)},
      {"Memory per GPU", "memory.total", "memory per GPU", p.total, U::Bytes, "the four above" + std::string(p.fits ? "" : ": more than the GPU holds")},
      {"Compute per step", "flops.dense", "dense FLOPs per step", p.dense_flops, U::Flops, moe ? "6 · N_active · B·s" : "6 · N · B·s"},
      {"Compute per step", "flops.attention", "attention FLOPs per step", p.attention_flops, U::Flops, "12 · L · h · s · B·s"},
      {"Compute per step", "flops.recompute", "recomputed forward", p.recompute_flops, U::Flops, in.recompute ? "(dense + attention) / 3" : "no recomputation"},
      {"Compute per step", "flops.step", "model FLOPs per step", p.model_flops, U::Flops, "dense + attention"},
      {"Compute per step", "compute.seconds", "compute (forward + backward)", p.compute_seconds, U::Seconds, mfu_text},
      {"Compute per step", "mfu", "MFU achieved", achieved, U::Share, "model FLOPs / (GPUs · peak · compute time)"},
      {"Compute per step", "bubble.seconds", "pipeline bubble", p.bubble_seconds, U::Seconds, in.pp > 1 ? "compute · (p-1)/m (1F1B)" : "no pipeline"},
      {"Compute per step", "cp.imbalance", "CP: busiest rank's attention / mean", p.cp_imbalance, U::Share, imbalance_text},
      {"Compute per step", "cp.wait.seconds", "CP: waiting for the busiest rank", p.cp_wait_seconds, U::Seconds,
       p.cp_imbalance > 1 ? "compute · attention / (dense + attention) · (2c/(c+1) - 1)" : imbalance_text},
      {C, "grad.bytes", "gradients of the whole model", p.grad_bytes, U::Bytes, (moe ? "N_total · " : "N · ") + g},
      {C, "dp.bytes", "DP: bytes per GPU per step", p.dp_bytes, U::Bytes, p.dp_bytes > 0 ? dp.formula + dp_note : "no DP groups"},
      {C, "dp.seconds", "DP: time on its link", p.dp_seconds, U::Seconds, p.dp_bytes > 0 ? "bytes / bandwidth" + link_text(dp_g) : "no DP groups"},
      {C, "tp.bytes", "TP: bytes per GPU per step", p.tp_bytes, U::Bytes,
       in.tp > 1 ? (in.recompute ? "1.5 · " : "") + tp.formula + (in.recompute ? " (recompute: 6 per layer)" : "") + (in.cp > 1 ? ", s = s/c" : "")
                 : "no TP groups"},
      {C, "tp.seconds", "TP: time on its link", p.tp_seconds, U::Seconds, in.tp > 1 ? "bytes / bandwidth" + link_text(tp_g) : "no TP groups"},
      {C, "cp.bytes", "CP: bytes per GPU per step", p.cp_bytes, U::Bytes,
       in.cp > 1 ? "(L/p)·m · " + cpt.formula + " (" + cpt.what + ")" : "no CP groups"},
      {C, "cp.seconds", "CP: time on its link", p.cp_seconds, U::Seconds, in.cp > 1 ? "bytes / bandwidth" + link_text(cp_g) : "no CP groups"},
  });
  if (moe) {
    const std::string every = in.moe.moe_every > 1 ? "(L/p)/M" : "(L/p)";
    p.lines.insert(p.lines.end(), {
        {C, "ep.bytes", "EP: bytes per GPU per step", p.ep_bytes, U::Bytes,
         in.moe.ep > 1 ? every + "·m · " + (in.recompute ? "6" : "4") + " · F·T·k·h·e · (ep-1)/ep, T = b·s/c tokens (dispatch + combine all-to-alls, forward and backward" +
                             (in.recompute ? ", the forward's again)" : ")")
                       : "no EP groups: every rank holds every expert"},
        {C, "ep.seconds", "EP: time on its link", p.ep_seconds, U::Seconds, in.moe.ep > 1 ? "bytes / bandwidth" + link_text(ep_g) : "no EP groups"},
        {C, "edp.bytes", "expert DP: bytes per GPU per step", p.edp_bytes, U::Bytes,
         p.edp_bytes > 0 ? experts.comm_formula + " (ring: ×(edp-1)/edp) with Ψ = Ψ_x/(t·p·ep), over edp" : "no expert-data-parallel groups"},
        {C, "edp.seconds", "expert DP: time on its link", p.edp_seconds, U::Seconds,
         p.edp_bytes > 0 ? "bytes / bandwidth" + link_text(edp_g) : "no expert-data-parallel groups"},
    });
  }
  p.lines.insert(p.lines.end(), {
      {C, "pp.bytes", "PP: bytes per GPU per step", p.pp_bytes, U::Bytes, in.pp > 1 ? pp.formula + (in.cp > 1 ? ", s = s/c" : "") : "no pipeline"},
      {C, "pp.seconds", "PP: time on its link", p.pp_seconds, U::Seconds, in.pp > 1 ? "bytes / bandwidth" + link_text(pp_g) : "no pipeline"},
      {C, "comm.seconds", "communication", p.comm_seconds, U::Seconds,
       std::string(moe ? "dp + tp + cp + ep + edp + pp" : "dp + tp + cp + pp") + ", none overlapped"},
  });
  // Where each group lands: its ranks' spacing in Megatron-core's order and how many groups cross nodes.
  const std::string P = "Placement (Megatron-core order tp-cp-ep-dp-pp)";
  p.lines.insert(p.lines.end(), {
      {P, "tp.spanning", "TP groups crossing nodes", double(tp_g.place.spanning), U::Count, placement_text(tp_g)},
      {P, "cp.spanning", "CP groups crossing nodes", double(cp_g.place.spanning), U::Count, placement_text(cp_g)},
      {P, "dp.spanning", in.cp > 1 ? "DP x CP groups crossing nodes" : "DP groups crossing nodes", double(dp_g.place.spanning), U::Count,
       placement_text(dp_g)},
  });
  if (moe)
    p.lines.insert(p.lines.end(), {
        {P, "ep.spanning", "EP groups crossing nodes", double(ep_g.place.spanning), U::Count, placement_text(ep_g)},
        {P, "edp.spanning", "expert DP groups crossing nodes", double(edp_g.place.spanning), U::Count, placement_text(edp_g)},
    });
  p.lines.insert(p.lines.end(), {
      {P, "pp.spanning", "PP groups crossing nodes", double(pp_g.place.spanning), U::Count, placement_text(pp_g)},
      {"Balance", "step.seconds", "step time", p.step_seconds, U::Seconds,
       std::string("compute + bubble + ") + (in.cp > 1 ? "CP wait + " : "") + "communication"},
      {"Balance", "ratio", "communication / computation", p.ratio, U::Share, "comm / compute"},
      {"Balance", "overhead", "communication overhead", p.overhead, U::Share, "comm / (compute + comm); aim below 20%"},
      {"Balance", "efficiency", "scaling efficiency", 1 - p.overhead, U::Share, "compute / (compute + comm)"},
  });
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
    // A degree, a count of layers or heads, a size: at least 1 (a 0 would read as a run of nothing).
    auto positive = [&](int64_t n) {
      if (n < 1) throw Error("sizing: " + k + "=" + v + " must be at least 1");
      return n;
    };
    if (k == "params") in.params = parse_param_count(v);
    else if (k == "layers") in.layers = static_cast<int>(positive(small()));
    else if (k == "hidden") in.hidden = positive(whole());
    else if (k == "heads") in.heads = static_cast<int>(positive(small()));
    else if (k == "seq") in.seq = positive(whole());
    else if (k == "global_batch") in.global_batch = positive(whole());
    else if (k == "micro_batch") in.micro_batch = positive(whole());
    else if (k == "dp") in.dp = static_cast<int>(positive(small()));
    else if (k == "tp") in.tp = static_cast<int>(positive(small()));
    else if (k == "pp") in.pp = static_cast<int>(positive(small()));
    else if (k == "precision") in.precision = parse_plan_dtype(v);
    else if (k == "zero") {
      in.zero = small();
      if (in.zero > 3) throw Error("sizing: zero=" + v + " is not a ZeRO stage; use 0 (DDP), 1, 2 or 3");
    }
    else if (k == "recompute") in.recompute = whole() != 0;
    else if (k == "sp") in.sequence_parallel = whole() != 0;
    else if (k == "profile") in.profile = v;
    else if (k == "mfu") {
      in.mfu = number();
      if (!(in.mfu > 0 && in.mfu <= 1)) throw Error("sizing: mfu=" + v + " is a share of the GPUs' peak; give one in (0, 1], e.g. mfu=0.4");
    }
    else if (k == "compute_s") in.compute_seconds = number();
    else if (k == "gpu_gb") {
      in.gpu_memory = number() * 1e9;
      if (!(in.gpu_memory > 0)) throw Error("sizing: gpu_gb=" + v + " is a GPU's memory in GB; give more than 0, e.g. gpu_gb=80");
    }
    else if (k == "cp") in.cp = static_cast<int>(positive(small()));
    else if (k == "cp_layout") in.cp_layout = parse_cp_layout(v);
    else if (k == "kv_heads") in.kv_heads = small();
    else if (k == "ep") in.moe.ep = small();
    else if (k == "experts") in.moe.experts = small();
    else if (k == "top_k") in.moe.top_k = small();
    else if (k == "capacity") in.moe.capacity_factor = number();
    else if (k == "moe_every") in.moe.moe_every = small();
    else
      throw Error("sizing: '" + k + "' is not a sizing setting; use params, layers, hidden, heads, seq, global_batch, micro_batch, "
                  "dp, tp, pp, precision, zero, recompute, sp, profile, mfu, compute_s, gpu_gb, cp, cp_layout, kv_heads, ep, "
                  "experts, top_k, capacity or moe_every");
  }
  return in;
}

std::string sizing_spec(const SizingInput& in) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "params=%.0f layers=%d hidden=%lld heads=%d seq=%lld global_batch=%lld micro_batch=%lld dp=%d tp=%d pp=%d "
                "precision=%s zero=%d recompute=%d sp=%d profile=%s mfu=%g compute_s=%g gpu_gb=%g cp=%d cp_layout=%s kv_heads=%d "
                "ep=%d experts=%d top_k=%d capacity=%g moe_every=%d",
                in.params, in.layers, static_cast<long long>(in.hidden), in.heads, static_cast<long long>(in.seq),
                static_cast<long long>(in.global_batch), static_cast<long long>(in.micro_batch), in.dp, in.tp, in.pp,
                plan_dtype_name(in.precision), in.zero, in.recompute ? 1 : 0, in.sequence_parallel ? 1 : 0, in.profile.c_str(),
                in.mfu, in.compute_seconds, in.gpu_memory / 1e9, in.cp, cp_layout_name(in.cp_layout), in.kv_heads, in.moe.ep,
                in.moe.experts, in.moe.top_k, in.moe.capacity_factor, in.moe.moe_every);
  return buf;
}

}  // namespace dtlab
