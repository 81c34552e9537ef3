// dtlab-cli plan: per-rank memory and communication of each data-parallel sharding strategy
// (engine/parallel/memory_plan.h), as one table or one JSON object; with --tp/--stages the 3-D mesh
// (engine/parallel/mesh_plan.h): the model split over tp x pp first, then the same table over dp,
// and each dimension's traffic per step with its formula and, on a --profile, the link it crosses.
// With --global-batch (or --dp, --pp, --zero, --recompute, --mfu, --compute-time, --cp, --experts, ...)
// it sizes a whole run instead (engine/parallel/sizing.h, printed by cli/plan_sizing.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/text_table.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/mesh_plan.h"
#include "engine/parallel/sizing.h"
#include "cli/plan_sizing.h"

namespace dtlab::cli {

namespace {

struct PlanArgs {
  double params = 0, unit_params = 0;
  int world = 1, node_size = 0;
  std::string strategy = "all", dtype = "fp32", precision = "fp32", optimizer = "adamw", optimizer_dtype = "fp32";
  bool momentum = false, prefetch = false, json = false;
  CLI::App* app = nullptr;
  CLI::Option *node_size_opt = nullptr, *unit_opt = nullptr, *dtype_opt = nullptr, *precision_opt = nullptr;
  // LoRA: --lora-rank on the transformer's shape, or --lora-params counted elsewhere.
  int lora_rank = 0, lora_modules = 4, heads = 0;
  double lora_params = 0;
  CLI::Option *lora_modules_opt = nullptr, *lora_params_opt = nullptr, *heads_opt = nullptr;
  bool activation_checkpointing = false;
  // The mesh (any of these given turns it on): tp x stages x dp = world.
  int tp = 1, stages = 1;
  bool sequence_parallel = false;
  TransformerShape shape;
  std::string profile;
  std::vector<CLI::Option*> mesh_opts;   // --tp, --stages, --sequence-parallel, the shape, --profile
  std::vector<CLI::Option*> shape_opts;  // --layers, --hidden, --seq, --micro-batch
  CLI::Option *world_opt = nullptr, *stages_opt = nullptr, *profile_opt = nullptr, *micro_batch_opt = nullptr;
  // Sizing (engine/parallel/sizing.h): any of these given turns it on.
  int64_t global_batch = 0;
  int dp = 1, pp = 1, zero = 0;
  bool recompute = false;
  double mfu = 0.4, compute_time = 0;
  CLI::Option *dp_opt = nullptr, *pp_opt = nullptr;
  // Context and expert parallelism (sizing only): engine/parallel/context_plan.h, moe_plan.h.
  int cp = 1, kv_heads = 0, ep = 1, experts = 0, top_k = 2, moe_every = 1;
  std::string cp_layout = "ring";
  double capacity_factor = 1.0;
  CLI::Option* cp_layout_opt = nullptr;
  std::vector<CLI::Option*> moe_opts;  // --ep, --top-k, --capacity-factor, --moe-every: meaningless without --experts
  std::vector<CLI::Option*> sizing_opts;
  bool sizing() const {
    return std::any_of(sizing_opts.begin(), sizing_opts.end(), [](CLI::Option* o) { return o->count() > 0; });
  }
  // The shape flags alone turn the mesh on, unless LoRA or activations are what they size.
  bool mesh() const {
    const bool shape_for_other = lora_rank > 0 || activation_checkpointing;
    for (CLI::Option* o : mesh_opts) {
      const bool is_shape = std::find(shape_opts.begin(), shape_opts.end(), o) != shape_opts.end();
      if (o->count() && !(is_shape && shape_for_other)) return true;
    }
    return false;
  }
  // --precision, or the older --dtype (mixed = fp16)
  std::string precision_name() const { return dtype_opt->count() ? dtype : precision; }
  // Ψ_L: the adapters LoRA trains (0: full fine-tuning)
  double lora_count() const {
    // Without its shape (0 here) check_memory_flags() names what is missing.
    if (lora_rank > 0 && shape.layers > 0 && shape.hidden > 0)
      return lora_param_count(shape.layers, shape.hidden, lora_rank, lora_modules);
    return lora_params;
  }
};

// --params 7B: parse_param_count() both checks the text and rewrites it as a plain whole number for
// CLI11 to store, so its message comes out as "--params: '7Q' is not a parameter count; ...".
CLI::Validator param_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          char buf[32];  // at most 1e15: 16 digits
          std::snprintf(buf, sizeof buf, "%.0f", parse_param_count(text));
          text = buf;
          return "";
        } catch (const Error& e) {
          return e.what();
        }
      },
      "COUNT");
}

// One unit for the whole table so strategies compare at a glance, picked by the SMALLEST total so
// the most sharded row keeps its digits (70B on 512 ranks: 1120.00 GB beside 6.20 GB, not 1.12 TB
// beside 0.01). A toy model stays in exact bytes, to compare with the engine's memory tracker.
struct Unit {
  double scale;
  const char* legend;  // "GB per rank (1 GB = 1e9 bytes)"
  const char* binary;  // "GiB", or "" for bytes
  double binary_scale;
};

Unit pick_unit(double smallest) {
  if (smallest < 1e6) return {1, "bytes per rank", "", 1};
  if (smallest < 1e9) return {1e6, "MB per rank (1 MB = 1e6 bytes)", "MiB", 1048576.0};
  if (smallest < 1e12) return {1e9, "GB per rank (1 GB = 1e9 bytes)", "GiB", 1073741824.0};
  return {1e12, "TB per rank (1 TB = 1e12 bytes)", "TiB", 1099511627776.0};
}

std::string amount(double bytes, const Unit& u) {
  char buf[48];
  if (u.scale == 1) std::snprintf(buf, sizeof buf, "%.0f", bytes);
  else if (bytes > 0 && bytes / u.scale < 0.005) return "<0.01";  // not nothing, only small
  else std::snprintf(buf, sizeof buf, "%.2f", bytes / u.scale);
  return buf;
}


// What the optimizer-state bytes hold, for the header: the number alone teaches little.
std::string optimizer_state_note(const MemoryPlanInput& in) {
  const bool master = is_half(in.dtype) && !in.half_optimizer_state;
  const std::string in_dtype = in.half_optimizer_state ? std::string(" in ") + plan_dtype_name(in.dtype) + ", no fp32 master copy" : "";
  std::vector<std::string> parts;
  if (master) parts.push_back("fp32 master copy");
  if (in.optimizer == OptimizerKind::AdamW) parts.push_back((master ? "m, v" : "AdamW m, v") + in_dtype);
  else if (in.sgd_momentum) parts.push_back("SGD momentum" + in_dtype);
  if (parts.empty()) return "plain SGD keeps none";
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

nlohmann::json json_bytes(double v) {  // whole byte counts print as integers, not 72752.0
  if (std::floor(v) == v && std::fabs(v) < 9007199254740992.0) return static_cast<int64_t>(v);
  return v;
}

MemoryPlanInput memory_input(const PlanArgs& a) {
  MemoryPlanInput in;
  in.params = a.params;
  in.world = a.world;
  in.node_size = a.node_size;
  in.dtype = parse_plan_dtype(a.precision_name());
  in.half_optimizer_state = a.optimizer_dtype == "half";
  in.lora_params = a.lora_count();
  in.optimizer = parse_optimizer_kind(a.optimizer);
  in.sgd_momentum = a.momentum;
  in.largest_unit_params = a.unit_params;
  in.units_in_flight = a.prefetch ? 2 : 1;
  return in;
}

MeshPlanInput mesh_input(const PlanArgs& a, const MemoryPlanInput& in) {
  return MeshPlanInput{.memory = in, .tp = a.tp, .stages = a.stages, .sequence_parallel = a.sequence_parallel, .shape = a.shape};
}

std::vector<std::string> missing_of(const std::vector<CLI::Option*>& opts) {
  std::vector<std::string> missing;
  for (CLI::Option* o : opts)
    if (o->count() == 0) missing.push_back(o->get_name());
  return missing;
}

// --precision, --optimizer-dtype, LoRA and activation checkpointing: refuse combinations that
// describe no run, in one sentence naming the flag.
void check_memory_flags(const PlanArgs& a) {
  if (a.dtype_opt->count() && a.precision_opt->count())
    throw Error("give the precision once: --precision fp32|bf16|fp16 (--dtype mixed is the older name for fp16)");
  if (a.optimizer_dtype != "fp32" && a.optimizer_dtype != "half")
    throw Error("--optimizer-dtype '" + a.optimizer_dtype + "' is not known; use fp32 (the ZeRO paper's, with an fp32 master copy) or half (the course's)");
  if (a.optimizer_dtype == "half" && !is_half(parse_plan_dtype(a.precision_name())))
    throw Error("--optimizer-dtype half keeps the optimizer state in the training dtype; add --precision bf16 or fp16");
  if (a.lora_rank > 0 && a.lora_params_opt->count())
    throw Error("give LoRA's size once: --lora-rank with the shape flags, or --lora-params as a count");
  if (a.lora_modules_opt->count() && a.lora_rank == 0)
    throw Error("--lora-modules says how many projections per layer get adapters; add --lora-rank");
  if (a.lora_rank > 0) {
    const std::vector<std::string> missing = missing_of({a.shape_opts[0], a.shape_opts[1]});  // --layers, --hidden
    if (!missing.empty())
      throw Error("--lora-rank " + std::to_string(a.lora_rank) + " counts adapters on each layer's h x h projections; add " + join(missing, ", "));
  }
  if (a.heads_opt->count() && !a.activation_checkpointing)
    throw Error("--heads sizes the attention's activations; add --activation-checkpointing");
  // Megatron splits the hidden size (and the heads) evenly over a TP group, and sequence parallelism
  // the sequence: a degree that does not divide them has no layout to plan.
  if (a.tp > 1 && a.shape.hidden > 0 && a.shape.hidden % a.tp != 0)
    throw Error("--hidden " + std::to_string(a.shape.hidden) + " is not divisible by --tp " + std::to_string(a.tp) +
                ": tensor parallelism splits the hidden size evenly over the TP ranks; pick a multiple of " + std::to_string(a.tp));
  if (a.tp > 1 && a.heads > 0 && a.heads % a.tp != 0)
    throw Error("--heads " + std::to_string(a.heads) + " is not divisible by --tp " + std::to_string(a.tp) +
                ": tensor parallelism gives each TP rank whole attention heads; pick a multiple of " + std::to_string(a.tp));
  if (a.tp > 1 && a.sequence_parallel && a.shape.seq > 0 && a.shape.seq % a.tp != 0)
    throw Error("--seq " + std::to_string(a.shape.seq) + " is not divisible by --tp " + std::to_string(a.tp) +
                ": sequence parallelism splits the sequence evenly over the TP ranks; pick a multiple of " + std::to_string(a.tp));
  if (!a.activation_checkpointing) return;
  if (a.tp > 1 || a.stages > 1)
    throw Error("--activation-checkpointing plans one rank's full stack of layers; leave out --tp and --stages");
  std::vector<std::string> missing = missing_of(a.shape_opts);
  if (a.heads_opt->count() == 0) missing.push_back("--heads");
  if (!missing.empty())
    throw Error("--activation-checkpointing counts activations of s x b x h per layer (Korthikanti et al.); add " + join(missing, ", "));
}

// --strategy all: the table of every sharding strategy.
constexpr const char* kEverySharding = "all";

// Flags that only matter to some strategies: refuse them where they would be silently ignored.
std::vector<Sharding> check_flags(const PlanArgs& a, const MemoryPlanInput& in) {
  std::vector<Sharding> strategies(kAllShardings.begin(), kAllShardings.end());
  const bool every = a.strategy == kEverySharding;
  if (!every) {
    try {
      strategies = {parse_sharding(a.strategy)};
    } catch (const Error&) {  // same list as the engine's, plus the table
      throw Error("--strategy '" + a.strategy + "' is not known; use no-shard, zero1, grad-op, full, hybrid or all");
    }
  }
  if (a.momentum && in.optimizer != OptimizerKind::SGD)
    throw Error("--momentum applies to --optimizer sgd; AdamW keeps its own moments (m and v)");
  if (a.node_size_opt->count() && !every && strategies.front() != Sharding::Hybrid)
    throw Error("--node-size sets HYBRID_SHARD's shard group; use it with --strategy hybrid or all");
  if (a.prefetch && a.unit_opt->count() == 0)
    throw Error("--prefetch counts the next unit's gathered parameters; give the largest unit's size with --unit-params");
  check_memory_flags(a);
  // --tp 4 without the transformer's shape: name what is still missing.
  const std::vector<std::string> missing = missing_of(a.shape_opts);
  if ((a.tp > 1 || a.stages > 1) && !missing.empty())
    throw Error((a.tp > 1 ? "--tp " + std::to_string(a.tp) : "--stages " + std::to_string(a.stages)) +
                " counts its traffic in activations of b x s x h elements per micro-batch; add " + join(missing, ", "));
  return strategies;
}

ActivationPlan activation_plan(const PlanArgs& a) {
  return plan_activations(a.shape.layers, a.shape.hidden, a.shape.seq, a.shape.micro_batch, a.heads);
}

nlohmann::json mesh_json(const MeshPlan& p, const PlanArgs& a) {
  nlohmann::json j = {{"dp", p.mesh.dp}, {"pp", p.mesh.pp}, {"tp", p.mesh.tp},
                      {"sequence_parallel", a.sequence_parallel},
                      {"rank_params", json_bytes(p.rank_params)},
                      {"layers", a.shape.layers}, {"hidden", a.shape.hidden}, {"seq", a.shape.seq},
                      {"micro_batch", a.shape.micro_batch}, {"micro_batches", a.shape.micro_batches},
                      {"layers_per_stage", p.layers_per_stage},
                      {"activation_bytes", p.activation_bytes},
                      {"activation_elems", p.activation_elems}};
  j["traffic"] = nlohmann::json::array();
  for (const DimTraffic& d : p.traffic) {
    nlohmann::json t = {{"dim", mesh_dim_name(d.dim)}, {"degree", d.degree}, {"bytes", json_bytes(d.bytes)},
                        {"what", d.what}, {"formula", d.formula}};
    if (!a.profile.empty())
      t.update({{"groups", d.groups}, {"groups_spanning_nodes", d.groups_spanning_nodes}, {"link", d.link},
                {"link_seconds", d.link_seconds}});
    j["traffic"].push_back(t);
  }
  if (!a.profile.empty())
    j.update({{"profile", a.profile}, {"node_size", p.node_size}, {"nodes", p.nodes}, {"slowest_link", p.slowest_link},
              {"slowest_link_bytes", json_bytes(p.slowest_link_bytes)}, {"slowest_link_dims", p.slowest_link_dims}});
  return j;
}

void print_json(const PlanArgs& a, const MemoryPlanInput& in, const std::vector<Sharding>& strategies,
                const std::vector<MemoryPlan>& plans, const MeshPlan* mesh, Streams& io) {
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum, in.half_optimizer_state);
  nlohmann::json j = {{"params", json_bytes(a.params)},
                      {"world", a.world},
                      {"node_size", a.node_size},
                      {"dtype", is_half(in.dtype) ? "mixed" : "fp32"},
                      {"precision", plan_dtype_name(in.dtype)},
                      {"optimizer_dtype", in.half_optimizer_state ? "half" : "fp32"},
                      {"grad_payload", json_bytes(plans.front().grad_payload)},
                      {"optimizer", optimizer_name(in.optimizer)},
                      {"momentum", a.momentum},
                      {"unit_params", json_bytes(a.unit_params)},
                      {"units_in_flight", in.units_in_flight},
                      {"bytes_per_param",
                       {{"parameters", b.parameters},
                        {"gradients", b.gradients},
                        {"optimizer_state", b.optimizer_state},
                        {"master_weights", b.master_weights}}}};
  if (in.lora_params > 0)
    j["lora"] = {{"rank", a.lora_rank}, {"modules", a.lora_rank > 0 ? a.lora_modules : 0},
                 {"params", json_bytes(in.lora_params)}, {"fraction", in.lora_params / a.params}};
  if (a.activation_checkpointing) {
    const ActivationPlan ap = activation_plan(a);
    j["activations"] = {{"heads", a.heads}, {"per_layer", json_bytes(ap.per_layer)},
                        {"per_layer_checkpointed", json_bytes(ap.per_layer_checkpointed)}, {"total", json_bytes(ap.total)},
                        {"total_checkpointed", json_bytes(ap.total_checkpointed)}, {"saved", json_bytes(ap.saved)}};
  }
  j["strategies"] = nlohmann::json::array();
  for (size_t i = 0; i < plans.size(); i++) {
    const MemoryPlan& p = plans[i];
    j["strategies"].push_back({{"strategy", sharding_flag(strategies[i])},
                               {"name", sharding_name(strategies[i])},
                               {"zero_stage", zero_stage(strategies[i])},
                               {"shard_ranks", p.shard_ranks},
                               {"parameters", json_bytes(p.parameters)},
                               {"gradients", json_bytes(p.gradients)},
                               {"optimizer_state", json_bytes(p.optimizer_state)},
                               {"gathered", json_bytes(p.gathered)},
                               {"total", json_bytes(p.total)},
                               {"comm_bytes", json_bytes(p.comm_bytes)},
                               {"comm_cross_group_bytes", json_bytes(p.comm_cross_group_bytes)},
                               {"formula", p.formula},
                               {"comm_formula", p.comm_formula}});
  }
  if (mesh) j["mesh"] = mesh_json(*mesh, a);
  io.out << j.dump() << "\n";
}

// "28.00 GB", "14.00 MB", "512 bytes": decimal units, as the course and the ZeRO paper write them.
std::string human_decimal(double bytes) {
  if (bytes < 1e3) return std::to_string(std::llround(bytes)) + " bytes";
  const char* names[] = {"kB", "MB", "GB", "TB"};
  int i = 0;
  double scale = 1e3;
  while (i < 3 && bytes >= scale * 1e3) scale *= 1e3, i++;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes / scale, names[i]);
  return buf;
}

// LoRA's count, and the gradients one step reduces: the course's 28 GB / 14 GB / ~14 MB at 7B.
void print_lora_and_payload(const PlanArgs& a, const MemoryPlanInput& in, const BytesPerParam& b, Streams& io) {
  const double trained = in.lora_params > 0 ? in.lora_params : a.params;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.3g%%", 100 * in.lora_params / a.params);
  if (a.lora_rank > 0)
    io.out << "LoRA: r = " << a.lora_rank << " on " << a.lora_modules << " h x h projections in each of " << a.shape.layers
           << " layers (h = " << a.shape.hidden << "): Ψ_L = L·n·r·2h = " << with_commas(std::llround(in.lora_params))
           << " trainable parameters (" << pct << " of Ψ); the base is frozen: no gradients, no optimizer state\n";
  else if (in.lora_params > 0)
    io.out << "LoRA: Ψ_L = " << with_commas(std::llround(in.lora_params)) << " trainable parameters (" << pct
           << " of Ψ); the base is frozen: no gradients, no optimizer state\n";
  if (a.mesh()) return;  // the mesh's dp row gives each group's share
  io.out << "Gradients per step: " << human_decimal(trained * b.gradients) << " (" << (in.lora_params > 0 ? "Ψ_L" : "Ψ")
         << " x " << b.gradients << " bytes, what DDP's all-reduce carries; a ring sends about twice that per rank)\n";
}

void print_header(const PlanArgs& a, const MemoryPlanInput& in, const std::vector<Sharding>& strategies, const MeshPlan* mesh,
                  Streams& io) {
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum, in.half_optimizer_state);
  const char* precision = plan_dtype_name(in.dtype);
  char psi[32];
  std::snprintf(psi, sizeof psi, "%.0f", a.params);
  io.out << "Memory per rank: " << param_count_str(a.params) << " parameters (Ψ = " << psi << "), " << a.world << (a.world == 1 ? " rank, " : " ranks, ")
         << (is_half(in.dtype) ? std::string("mixed precision (") + precision + ")" : "fp32") << ", "
         << optimizer_name(in.optimizer) << (a.momentum ? " with momentum" : "") << "\n";
  io.out << "Bytes per parameter: parameters " << b.parameters << " (" << precision << "), gradients "
         << b.gradients << " (" << precision << "), optimizer state " << b.optimizer_state << " ("
         << optimizer_state_note(in) << ")\n";
  print_lora_and_payload(a, in, b, io);
  // The other 16-bit layout, torch.autocast (dtlab-cli train --amp), side by side with this one.
  if (is_half(in.dtype) && in.lora_params <= 0 && !in.half_optimizer_state && !a.mesh()) {
    const BytesPerParam f = bytes_per_param(PlanDType::Fp32, in.optimizer, in.sgd_momentum, false);
    io.out << "torch.autocast instead (--amp " << precision << "): parameters " << f.parameters << ", gradients " << f.gradients
           << ", optimizer state " << f.optimizer_state << " (fp32, no master copy: " << f.parameters + f.gradients + f.optimizer_state
           << " bytes in all); gradients per step " << human_decimal(a.params * f.gradients) << " (Ψ x " << f.gradients
           << ", fp32 .grad, unless a comm hook casts it); activations 16-bit in both layouts\n";
  }
  const int dp = mesh ? mesh->mesh.dp : a.world;
  if (mesh)
    io.out << "Mesh: " << describe_mesh(mesh->mesh) << " (torch init_device_mesh order, tp fastest); each rank holds Ψ/(t·p) = "
           << param_count_str(mesh->rank_params) << " parameters, and the table shards them over its dp group of " << dp << "\n";
  if (std::count(strategies.begin(), strategies.end(), Sharding::Hybrid) > 0) {
    const int group = a.node_size > 0 ? a.node_size : dp;
    if (group == dp)
      io.out << "HYBRID_SHARD: one group of all " << dp << " ranks, the same as FULL_SHARD (give the ranks per node with --node-size)\n";
    else
      io.out << "HYBRID_SHARD: FULL_SHARD inside groups of " << group << " ranks, replicated across " << dp / group << " groups\n";
  }
  if (a.unit_params > 0)
    io.out << "Gathered: the largest unit (Ψ_u = " << param_count_str(a.unit_params)
           << " parameters) unsharded, " << in.units_in_flight
           << (in.units_in_flight == 1 ? " unit in flight (2 with --prefetch)" : " units in flight (prefetch)") << "\n";
  io.out << "\n";
}

// Korthikanti et al.'s activation memory, with and without full recomputation, and the saving.
void print_activations(const PlanArgs& a, Streams& io) {
  const ActivationPlan ap = activation_plan(a);
  const TransformerShape& s = a.shape;
  io.out << "\nActivations per rank (Korthikanti et al. 2022, 16-bit, no tensor parallelism; s = " << s.seq << ", b = "
         << s.micro_batch << ", h = " << s.hidden << ", a = " << a.heads << ", L = " << s.layers << "):\n";
  print_table(io.out,
              {{"", "per layer", "all layers", "formula per layer"},
               {"kept for backward", human_decimal(ap.per_layer), human_decimal(ap.total), "s·b·h·(34 + 5·a·s/h)"},
               {"with checkpointing", human_decimal(ap.per_layer_checkpointed), human_decimal(ap.total_checkpointed),
                "2·s·b·h (each layer's input; the rest recomputed in backward)"},
               {"saved", human_decimal(ap.per_layer - ap.per_layer_checkpointed), human_decimal(ap.saved), ""}},
              {false, true, true, false});
  io.out << "Recomputation costs about one more forward pass per step; the peak also holds one layer's full activations while it is recomputed\n";
}

void print_memory_table(const std::vector<Sharding>& strategies, const std::vector<MemoryPlan>& plans, Streams& io) {
  double smallest = plans.front().total;
  for (const auto& p : plans) smallest = std::min(smallest, p.total);
  const Unit u = pick_unit(smallest);
  const std::string total_head = *u.binary ? std::string("total (") + u.binary + ")" : "total";
  std::vector<std::vector<std::string>> rows = {{"strategy", "stage", "N_d", "parameters", "gradients",
                                                 "optimizer", "gathered", total_head, "comm/step", "memory"}};
  for (size_t i = 0; i < plans.size(); i++) {
    const MemoryPlan& p = plans[i];
    std::string total = amount(p.total, u);
    if (*u.binary) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " (%.2f)", p.total / u.binary_scale);
      total += buf;
    }
    rows.push_back({sharding_name(strategies[i]), std::to_string(zero_stage(strategies[i])),
                    strategies[i] == Sharding::NoShard ? "-" : std::to_string(p.shard_ranks),
                    amount(p.parameters, u), amount(p.gradients, u), amount(p.optimizer_state, u),
                    p.gathered > 0 ? amount(p.gathered, u) : "-", total,
                    amount(p.comm_bytes, u) + " (" + p.comm_formula + ")", p.formula});
  }
  print_table(io.out, rows, {false, true, true, true, true, true, true, false, false, false});
  io.out << "\n" << u.legend << "; comm/step: what each rank sends per step with ring collectives; activations not included\n";
}

// "850 ns", "12.3 µs", "4.56 ms", "1.23 s": a link's bandwidth term, for scale.
std::string time_text_s(double seconds) {
  char buf[32];
  if (seconds < 1e-6) std::snprintf(buf, sizeof buf, "%.0f ns", seconds * 1e9);
  else if (seconds < 1e-3) std::snprintf(buf, sizeof buf, "%.1f µs", seconds * 1e6);
  else if (seconds < 1) std::snprintf(buf, sizeof buf, "%.2f ms", seconds * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  return buf;
}

// Each dimension's traffic per rank and step, its formula, and on a profile the link it crosses.
void print_mesh_traffic(const PlanArgs& a, const MeshPlan& p, Sharding dp_sharding, Streams& io) {
  const TransformerShape& s = a.shape;
  io.out << "\nCommunication per rank per step (" << (a.sequence_parallel ? "sequence parallel, " : "")
         << "DP as " << sharding_name(dp_sharding) << "): L = " << s.layers << ", p = " << p.mesh.pp << ", t = " << p.mesh.tp
         << ", d = " << p.mesh.dp << ", m = " << s.micro_batches << ", b·s·h = " << s.micro_batch << "·" << s.seq << "·"
         << s.hidden << " = " << with_commas(p.activation_elems) << " elements, e = " << p.activation_bytes << " bytes each, g = "
         << bytes_per_param(parse_plan_dtype(a.precision_name()), parse_optimizer_kind(a.optimizer), a.momentum).gradients
         << " bytes per gradient\n";
  std::vector<std::vector<std::string>> rows = {{"dim", "size", "bytes", "formula", "what"}};
  if (!a.profile.empty()) rows[0].insert(rows[0].end(), {"link", "time at its bandwidth"});
  for (int i = kNumMeshDims - 1; i >= 0; i--) {  // tp, pp, dp: the order of the mesh from the inside out
    const DimTraffic& d = p.traffic[static_cast<size_t>(i)];
    const bool idle = d.degree < 2;
    rows.push_back({mesh_dim_name(d.dim), std::to_string(d.degree), idle ? "-" : human_bytes(std::llround(d.bytes)),
                    idle ? "-" : d.formula, idle ? "no " + std::string(mesh_dim_name(d.dim)) + " groups" : d.what});
    if (!a.profile.empty())
      rows.back().insert(rows.back().end(),
                         {idle ? "-" : d.link + (d.groups_spanning_nodes ? " (across nodes)" : " (inside a node)"),
                          idle ? "-" : time_text_s(d.link_seconds)});
  }
  print_table(io.out, rows, {false, true, true, false, false, false, true});
  if (a.profile.empty()) return;
  const HardwareProfile prof = find_profile(a.profile);
  io.out << "\nOn " << prof.name << " (" << p.node_size << " GPUs per node): the mesh needs " << p.nodes
         << (p.nodes == 1 ? " node" : " nodes") << (p.nodes > prof.nodes ? " (more than the profile's " + std::to_string(prof.nodes) + "; its node repeated)" : "")
         << ". Slowest link used: " << (p.slowest_link.empty() ? "none (no traffic)" : p.slowest_link + ", carrying " +
                                         human_bytes(std::llround(p.slowest_link_bytes)) + " per rank per step (" + p.slowest_link_dims + ")")
         << "\n";
}

// Sizing: the layout is dp x tp x pp (--world, when given, must be their product); the shape, the
// global batch and the heads are required, the rest has the calculator's defaults.
SizingInput sizing_input(const PlanArgs& a) {
  std::vector<std::string> missing = missing_of({a.shape_opts[0], a.shape_opts[1], a.shape_opts[2], a.heads_opt});
  if (a.global_batch == 0) missing.push_back("--global-batch");
  if (!missing.empty())
    throw Error("sizing a run needs the model's shape and the global batch; add " + join(missing, ", "));
  if (a.stages_opt->count() && a.pp_opt->count()) throw Error("give the pipeline degree once: --pp (or its older name --stages)");
  for (const char* flag : {"--lora-rank", "--lora-params", "--unit-params", "--node-size", "--activation-checkpointing", "--strategy",
                           "--micro-batches", "--optimizer", "--optimizer-dtype", "--dtype", "--momentum", "--prefetch"})
    if (a.app->get_option(flag)->count())
      throw Error(std::string(flag) + " is not part of sizing (--global-batch, --dp, --pp, --zero, ...); leave it out or size without them");
  SizingInput in;
  in.params = a.params;
  in.layers = a.shape.layers;
  in.hidden = a.shape.hidden;
  in.seq = a.shape.seq;
  in.heads = a.heads;
  in.global_batch = a.global_batch;
  in.micro_batch = a.micro_batch_opt->count() ? a.shape.micro_batch : 1;
  in.tp = a.tp;
  in.pp = a.stages_opt->count() ? a.stages : a.pp;
  in.dp = a.dp;
  in.cp = a.cp;
  if (a.cp_layout_opt->count() && a.cp < 2)
    throw Error("--cp-layout chooses how a context-parallel group splits attention; add --cp 2 or more");
  in.cp_layout = parse_cp_layout(a.cp_layout);
  in.kv_heads = a.kv_heads;
  for (CLI::Option* o : a.moe_opts)
    if (o->count() && a.experts == 0)
      throw Error(o->get_name() + " describes a mixture of experts; add --experts E (the expert MLPs per MoE layer)");
  in.moe = MoeConfig{.experts = a.experts, .top_k = a.top_k, .ep = a.ep, .capacity_factor = a.capacity_factor, .moe_every = a.moe_every};
  if (a.world_opt->count()) {
    const int model = in.tp * in.cp * in.pp;
    const std::string names = in.cp > 1 ? "tp x cp x pp" : "tp x pp";
    if (!a.dp_opt->count()) {
      if (a.world % model != 0)
        throw Error("--world " + std::to_string(a.world) + " is not a multiple of " + names + " = " + std::to_string(model) +
                    "; make --world a multiple of " + std::to_string(model) + " (or smaller degrees), or give --dp D instead of --world");
      in.dp = a.world / model;
    } else if (a.world != in.dp * model) {
      throw Error("--world " + std::to_string(a.world) + " is not dp x " + names + " = " + std::to_string(in.dp * model) +
                  "; leave --world out or make it their product");
    }
  }
  in.precision = parse_plan_dtype(a.precision);
  in.zero = a.zero;
  in.recompute = a.recompute;
  in.sequence_parallel = a.sequence_parallel;
  if (a.profile_opt->count()) in.profile = a.profile;
  in.mfu = a.mfu;
  in.compute_seconds = a.compute_time;
  return in;
}

int run_plan(const PlanArgs& a, Streams& io) {
  if (a.sizing()) {
    const SizingInput in = sizing_input(a);
    print_sizing(in, plan_sizing(in), a.json, io);
    return 0;
  }
  if (a.world_opt->count() == 0) throw Error("--world is required (or size a run with --global-batch and --dp, --tp, --pp)");
  MemoryPlanInput in = memory_input(a);
  const std::vector<Sharding> strategies = check_flags(a, in);
  const bool mesh = a.mesh();
  std::vector<MemoryPlan> plans;
  for (Sharding s : strategies) {  // validates the numbers (world, node size, unit size, the mesh)
    in.sharding = s;
    plans.push_back(mesh ? plan_mesh(mesh_input(a, in)).memory : plan_memory(in));
  }
  MeshPlan mp;
  if (mesh) {  // the traffic table's DP: the one strategy asked for, or DDP beside the whole table
    in.sharding = strategies.size() > 1 ? Sharding::NoShard : strategies.front();
    const HardwareProfile prof = a.profile.empty() ? HardwareProfile{} : find_profile(a.profile);
    mp = plan_mesh(mesh_input(a, in), a.profile.empty() ? nullptr : &prof);
  }
  if (a.json) {
    print_json(a, in, strategies, plans, mesh ? &mp : nullptr, io);
    return 0;
  }
  print_header(a, in, strategies, mesh ? &mp : nullptr, io);
  print_memory_table(strategies, plans, io);
  if (mesh) print_mesh_traffic(a, mp, in.sharding, io);
  if (a.activation_checkpointing) print_activations(a, io);
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option("--params", a->params, "Model size Ψ in parameters: 7.5e9, 7B, 70B, 125M, 4547")
      ->required()->transform(param_count());
  a->app = &app;
  a->world_opt = app.add_option("--world", a->world, "Ranks in all: dp x stages x tp (dp alone without --tp/--stages); required except when sizing")
                     ->check(whole_number(1, 1 << 20));
  app.add_option("--strategy", a->strategy, "no-shard | zero1 | grad-op | full | hybrid | all (a table of every one)")
      ->capture_default_str();
  a->node_size_opt = app.add_option("--node-size", a->node_size, "HYBRID_SHARD's shard group: ranks per node (default: the whole world)")
                         ->check(whole_number(1, 1 << 20));
  a->precision_opt = app.add_option("--precision", a->precision, "fp32 (dtlab's engine) | bf16 | fp16: 2-byte parameters and gradients, fp32 master and Adam (2+2+12 = 16 bytes)")
                         ->capture_default_str();
  a->dtype_opt = app.add_option("--dtype", a->dtype, "The older name: fp32 | mixed (= --precision fp16)");
  app.add_option("--optimizer", a->optimizer, "adamw | sgd")->capture_default_str();
  app.add_option("--optimizer-dtype", a->optimizer_dtype,
                 "fp32 (the ZeRO paper's: fp32 master copy and state) | half (the course's: state in the training dtype, no master copy)")
      ->capture_default_str();
  app.add_option("--lora-rank", a->lora_rank, "LoRA rank r on each layer's h x h projections (needs --layers, --hidden)")->check(whole_number(1, 1 << 20));
  a->lora_modules_opt = app.add_option("--lora-modules", a->lora_modules, "Projections per layer with adapters: 4 (q, k, v, o) or 2 (q, v: peft's Llama default)")
                            ->check(whole_number(1, 64))->capture_default_str();
  a->lora_params_opt = app.add_option("--lora-params", a->lora_params, "LoRA's trainable parameters as a count: 7M (the course's 0.1% of 7B)")->transform(param_count());
  app.add_flag("--activation-checkpointing", a->activation_checkpointing,
               "Activations with and without full recomputation (needs --layers, --hidden, --seq, --micro-batch, --heads)");
  a->heads_opt = app.add_option("--heads", a->heads, "Attention heads a (for --activation-checkpointing)")->check(whole_number(1, 1 << 20));
  app.add_flag("--momentum", a->momentum, "SGD keeps a momentum buffer (4 bytes per parameter)");
  a->unit_opt = app.add_option("--unit-params", a->unit_params, "Parameters of the largest FSDP unit, counted unsharded while in flight")
                    ->transform(param_count());
  app.add_flag("--prefetch", a->prefetch, "Two units in flight: the next unit's all-gather is issued early (BACKWARD_PRE)");
  // The 3-D mesh (engine/parallel/mesh_plan.h).
  a->mesh_opts = {
      app.add_option("--tp", a->tp, "Tensor-parallel degree t (Megatron): ranks per TP group")->check(whole_number(1, 64)),
      a->stages_opt = app.add_option("--stages", a->stages, "Pipeline stages p")->check(whole_number(1, 1 << 20)),
      app.add_flag("--sequence-parallel", a->sequence_parallel, "TP's all-reduces as reduce-scatter + all-gather (Korthikanti et al.)"),
      app.add_option("--micro-batches", a->shape.micro_batches, "Micro-batches m per step")->check(whole_number(1, 1 << 20)),
      a->profile_opt = app.add_option("--profile", a->profile, "Hardware profile to place the mesh on (which link each dimension crosses); sizing: dgx-h100x2 unless given"),
  };
  a->shape_opts = {
      app.add_option("--layers", a->shape.layers, "Transformer layers L (split evenly over the stages)")->check(whole_number(1, 1 << 20)),
      app.add_option("--hidden", a->shape.hidden, "Hidden size h")->check(whole_number(1, 1 << 30)),
      app.add_option("--seq", a->shape.seq, "Sequence length s in tokens")->check(whole_number(1, 1 << 30)),
      a->micro_batch_opt = app.add_option("--micro-batch", a->shape.micro_batch, "Sequences b per micro-batch (sizing: 1 unless given)")->check(whole_number(1, 1 << 20)),
  };
  a->mesh_opts.insert(a->mesh_opts.end(), a->shape_opts.begin(), a->shape_opts.end());
  // Sizing a run (engine/parallel/sizing.h): any of these prints the calculator instead of the table.
  a->dp_opt = app.add_option("--dp", a->dp, "Sizing: data-parallel degree d (default: --world / (tp x pp), else 1)")->check(whole_number(1, 1 << 20));
  a->pp_opt = app.add_option("--pp", a->pp, "Sizing: pipeline-parallel degree p (1F1B)")->check(whole_number(1, 1 << 20));
  a->sizing_opts = {
      app.add_option("--global-batch", a->global_batch, "Sizing: sequences B per optimizer step over all replicas (needs --layers, --hidden, --seq, --heads)")
          ->check(whole_number(1, 1 << 30)),
      a->dp_opt, a->pp_opt,
      app.add_option("--zero", a->zero, "Sizing: ZeRO stage 0 (DDP), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)")->check(whole_number(0, 3)),
      app.add_flag("--recompute", a->recompute, "Sizing: full activation recomputation (keep each layer's input; one more forward)"),
      app.add_option("--mfu", a->mfu, "Sizing: model FLOPs utilization, 0 to 1 (default 0.4)")->check(CLI::Range(1e-6, 1.0)),
      app.add_option("--compute-time", a->compute_time, "Sizing: take forward + backward as this many seconds instead of FLOPs / MFU")
          ->check(CLI::Range(1e-9, 1e9)),
      app.add_option("--cp", a->cp, "Sizing: context-parallel degree c, the sequence split over c ranks (world = dp x tp x cp x pp)")
          ->check(whole_number(1, 1 << 16)),
      a->cp_layout_opt = app.add_option("--cp-layout", a->cp_layout,
                                        "Sizing: ring (K/V blocks around the ring, contiguous chunks) | zigzag (the ring, causal work balanced) | "
                                        "ulysses (all-to-alls to a head split; heads must divide by tp x cp)")
                             ->capture_default_str(),
      app.add_option("--kv-heads", a->kv_heads, "Sizing: K/V heads under grouped-query attention (default: --heads)")->check(whole_number(1, 1 << 20)),
      app.add_option("--experts", a->experts, "Sizing: experts E per MoE layer (each an MLP of 8·h²); --params stays the dense model's count")
          ->check(whole_number(1, 1 << 20)),
  };
  a->moe_opts = {
      app.add_option("--ep", a->ep, "Sizing: expert-parallel degree e, E/e experts per GPU; divides dp x cp (Megatron)")
          ->check(whole_number(1, 1 << 20)),
      app.add_option("--top-k", a->top_k, "Sizing: experts per token (default 2, GShard's; Switch Transformer's 1)")->check(whole_number(1, 1 << 20)),
      app.add_option("--capacity-factor", a->capacity_factor, "Sizing: F, each expert takes at most F·k·T/E tokens (default 1.0)")
          ->check(CLI::Range(1e-6, 1e6)),
      app.add_option("--moe-every", a->moe_every, "Sizing: every M-th layer is an MoE layer (default 1: all; GShard's 2)")->check(whole_number(1, 1 << 20)),
  };
  a->sizing_opts.insert(a->sizing_opts.end(), a->moe_opts.begin(), a->moe_opts.end());
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_plan(*a, io); };
}

}  // namespace dtlab::cli
