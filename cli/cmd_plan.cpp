// dtlab-cli plan: per-rank memory and communication of each data-parallel sharding strategy
// (engine/parallel/memory_plan.h), as one table or one JSON object; with --tp/--stages the 3-D mesh
// (engine/parallel/mesh_plan.h): the model split over tp x pp first, then the same table over dp,
// and each dimension's traffic per step with its formula and, on a --profile, the link it crosses.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/mesh_plan.h"

namespace dtlab::cli {

namespace {

struct PlanArgs {
  double params = 0, unit_params = 0;
  int world = 1, node_size = 0;
  std::string strategy = "all", dtype = "fp32", optimizer = "adamw";
  bool momentum = false, prefetch = false, json = false;
  CLI::Option *node_size_opt = nullptr, *unit_opt = nullptr;
  // The mesh (any of these given turns it on): tp x stages x dp = world.
  int tp = 1, stages = 1;
  bool sequence_parallel = false;
  TransformerShape shape;
  std::string profile;
  std::vector<CLI::Option*> mesh_opts;   // --tp, --stages, --sequence-parallel, the shape, --profile
  std::vector<CLI::Option*> shape_opts;  // --layers, --hidden, --seq, --micro-batch
  bool mesh() const {
    for (CLI::Option* o : mesh_opts)
      if (o->count()) return true;
    return false;
  }
};

// --params 7B: parse_param_count() both checks the text and rewrites it as a plain whole number for
// CLI11 to store, so its message comes out as "--params: '7Q' is not a parameter count; ...".
CLI::Validator param_count() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          char buf[32];
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

// Left-aligned text columns, right-aligned number columns, widths from the contents.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::vector<bool>& right) {
  // Ψ and × are two bytes in UTF-8 but one column on screen.
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  std::vector<size_t> w(right.size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); c++) w[c] = std::max(w[c], width(r[c]));
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); c++) {
      const std::string pad(w[c] - width(r[c]), ' ');
      line += (c ? "  " : "") + (right[c] ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : ""));
    }
    out << line << "\n";
  }
}

// What the optimizer-state bytes hold, for the header: the number alone teaches little.
std::string optimizer_state_note(const MemoryPlanInput& in) {
  const bool mixed = in.dtype == PlanDType::Mixed;
  std::vector<std::string> parts;
  if (mixed) parts.push_back("fp32 master copy");
  if (in.optimizer == OptimizerKind::AdamW) parts.push_back(mixed ? "m, v" : "AdamW m, v");
  else if (in.sgd_momentum) parts.push_back("SGD momentum");
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
  in.dtype = parse_plan_dtype(a.dtype);
  in.optimizer = parse_optimizer_kind(a.optimizer);
  in.sgd_momentum = a.momentum;
  in.largest_unit_params = a.unit_params;
  in.units_in_flight = a.prefetch ? 2 : 1;
  return in;
}

MeshPlanInput mesh_input(const PlanArgs& a, const MemoryPlanInput& in) {
  return MeshPlanInput{.memory = in, .tp = a.tp, .stages = a.stages, .sequence_parallel = a.sequence_parallel, .shape = a.shape};
}

// Flags that only matter to some strategies: refuse them where they would be silently ignored.
std::vector<Sharding> check_flags(const PlanArgs& a, const MemoryPlanInput& in) {
  std::vector<Sharding> strategies(kAllShardings.begin(), kAllShardings.end());
  if (a.strategy != "all") {
    try {
      strategies = {parse_sharding(a.strategy)};
    } catch (const Error&) {  // same list as the engine's, plus the table
      throw Error("--strategy '" + a.strategy + "' is not known; use no-shard, zero1, grad-op, full, hybrid or all");
    }
  }
  if (a.momentum && in.optimizer != OptimizerKind::SGD)
    throw Error("--momentum applies to --optimizer sgd; AdamW keeps its own moments (m and v)");
  if (a.node_size_opt->count() && a.strategy != "all" && strategies.front() != Sharding::Hybrid)
    throw Error("--node-size sets HYBRID_SHARD's shard group; use it with --strategy hybrid or all");
  if (a.prefetch && a.unit_opt->count() == 0)
    throw Error("--prefetch counts the next unit's gathered parameters; give the largest unit's size with --unit-params");
  // --tp 4 without the transformer's shape: name what is still missing.
  std::vector<std::string> missing;
  for (CLI::Option* o : a.shape_opts)
    if (o->count() == 0) missing.push_back(o->get_name());
  if ((a.tp > 1 || a.stages > 1) && !missing.empty())
    throw Error((a.tp > 1 ? "--tp " + std::to_string(a.tp) : "--stages " + std::to_string(a.stages)) +
                " counts its traffic in activations of b x s x h elements per micro-batch; add " + join(missing, ", "));
  return strategies;
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
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum);
  nlohmann::json j = {{"params", json_bytes(a.params)},
                      {"world", a.world},
                      {"node_size", a.node_size},
                      {"dtype", plan_dtype_name(in.dtype)},
                      {"optimizer", optimizer_name(in.optimizer)},
                      {"momentum", a.momentum},
                      {"unit_params", json_bytes(a.unit_params)},
                      {"units_in_flight", in.units_in_flight},
                      {"bytes_per_param",
                       {{"parameters", b.parameters},
                        {"gradients", b.gradients},
                        {"optimizer_state", b.optimizer_state}}}};
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

void print_header(const PlanArgs& a, const MemoryPlanInput& in, const MeshPlan* mesh, Streams& io) {
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum);
  const char* precision = in.dtype == PlanDType::Mixed ? "fp16" : "fp32";
  char psi[32];
  std::snprintf(psi, sizeof psi, "%.0f", a.params);
  io.out << "Memory per rank: " << param_count_str(a.params) << " parameters (Ψ = " << psi << "), " << a.world << (a.world == 1 ? " rank, " : " ranks, ")
         << (in.dtype == PlanDType::Mixed ? "mixed precision" : "fp32") << ", "
         << optimizer_name(in.optimizer) << (a.momentum ? " with momentum" : "") << "\n";
  io.out << "Bytes per parameter: parameters " << b.parameters << " (" << precision << "), gradients "
         << b.gradients << " (" << precision << "), optimizer state " << b.optimizer_state << " ("
         << optimizer_state_note(in) << ")\n";
  const int dp = mesh ? mesh->mesh.dp : a.world;
  if (mesh)
    io.out << "Mesh: " << describe_mesh(mesh->mesh) << " (torch init_device_mesh order, tp fastest); each rank holds Ψ/(t·p) = "
           << param_count_str(mesh->rank_params) << " parameters, and the table shards them over its dp group of " << dp << "\n";
  if (a.strategy == "all" || a.strategy == "hybrid") {
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
         << s.hidden << " = " << with_commas(p.activation_elems) << " elements, a = " << p.activation_bytes << " bytes each, g = "
         << bytes_per_param(parse_plan_dtype(a.dtype), parse_optimizer_kind(a.optimizer), a.momentum).gradients
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

int run_plan(const PlanArgs& a, Streams& io) {
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
    in.sharding = a.strategy == "all" ? Sharding::NoShard : strategies.front();
    const HardwareProfile prof = a.profile.empty() ? HardwareProfile{} : find_profile(a.profile);
    mp = plan_mesh(mesh_input(a, in), a.profile.empty() ? nullptr : &prof);
  }
  if (a.json) {
    print_json(a, in, strategies, plans, mesh ? &mp : nullptr, io);
    return 0;
  }
  print_header(a, in, mesh ? &mp : nullptr, io);
  print_memory_table(strategies, plans, io);
  if (mesh) print_mesh_traffic(a, mp, in.sharding, io);
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option("--params", a->params, "Model size Ψ in parameters: 7.5e9, 7B, 70B, 125M, 4547")
      ->required()->transform(param_count());
  app.add_option("--world", a->world, "Ranks in all: dp x stages x tp (dp alone without --tp/--stages)")->required()->check(whole_number(1, 1 << 20));
  app.add_option("--strategy", a->strategy, "no-shard | zero1 | grad-op | full | hybrid | all (a table of every one)")
      ->capture_default_str();
  a->node_size_opt = app.add_option("--node-size", a->node_size, "HYBRID_SHARD's shard group: ranks per node (default: the whole world)")
                         ->check(whole_number(1, 1 << 20));
  app.add_option("--dtype", a->dtype, "fp32 (dtlab's engine) | mixed (the ZeRO paper: fp16 with fp32 Adam)")->capture_default_str();
  app.add_option("--optimizer", a->optimizer, "adamw | sgd")->capture_default_str();
  app.add_flag("--momentum", a->momentum, "SGD keeps a momentum buffer (4 bytes per parameter)");
  a->unit_opt = app.add_option("--unit-params", a->unit_params, "Parameters of the largest FSDP unit, counted unsharded while in flight")
                    ->transform(param_count());
  app.add_flag("--prefetch", a->prefetch, "Two units in flight: the next unit's all-gather is issued early (BACKWARD_PRE)");
  // The 3-D mesh (engine/parallel/mesh_plan.h).
  a->mesh_opts = {
      app.add_option("--tp", a->tp, "Tensor-parallel degree t (Megatron): ranks per TP group")->check(whole_number(1, 64)),
      app.add_option("--stages", a->stages, "Pipeline stages p")->check(whole_number(1, 1 << 20)),
      app.add_flag("--sequence-parallel", a->sequence_parallel, "TP's all-reduces as reduce-scatter + all-gather (Korthikanti et al.)"),
      app.add_option("--micro-batches", a->shape.micro_batches, "Micro-batches m per step")->check(whole_number(1, 1 << 20)),
      app.add_option("--profile", a->profile, "Hardware profile to place the mesh on (which link each dimension crosses)"),
  };
  a->shape_opts = {
      app.add_option("--layers", a->shape.layers, "Transformer layers L (split evenly over the stages)")->check(whole_number(1, 1 << 20)),
      app.add_option("--hidden", a->shape.hidden, "Hidden size h")->check(whole_number(1, 1 << 30)),
      app.add_option("--seq", a->shape.seq, "Sequence length s in tokens")->check(whole_number(1, 1 << 30)),
      app.add_option("--micro-batch", a->shape.micro_batch, "Sequences b per micro-batch")->check(whole_number(1, 1 << 20)),
  };
  a->mesh_opts.insert(a->mesh_opts.end(), a->shape_opts.begin(), a->shape_opts.end());
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_plan(*a, io); };
}

}  // namespace dtlab::cli
