// dtlab-cli plan: per-rank memory and communication of each data-parallel sharding strategy
// (engine/parallel/memory_plan.h), as one table or one JSON object.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/parallel/memory_plan.h"

namespace dtlab::cli {

namespace {

struct PlanArgs {
  double params = 0, unit_params = 0;
  int world = 1, node_size = 0;
  std::string strategy = "all", dtype = "fp32", optimizer = "adamw";
  bool momentum = false, prefetch = false, json = false;
  CLI::Option *node_size_opt = nullptr, *unit_opt = nullptr;
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

int run_plan(const PlanArgs& a, Streams& io) {
  MemoryPlanInput in;
  in.params = a.params;
  in.world = a.world;
  in.node_size = a.node_size;
  in.dtype = parse_plan_dtype(a.dtype);
  in.optimizer = parse_optimizer_kind(a.optimizer);
  in.sgd_momentum = a.momentum;
  in.largest_unit_params = a.unit_params;
  in.units_in_flight = a.prefetch ? 2 : 1;

  std::vector<Sharding> strategies(kAllShardings.begin(), kAllShardings.end());
  if (a.strategy != "all") {
    try {
      strategies = {parse_sharding(a.strategy)};
    } catch (const Error&) {  // same list as the engine's, plus the table
      throw Error("--strategy '" + a.strategy + "' is not known; use no-shard, zero1, grad-op, full, hybrid or all");
    }
  }
  // Flags that only matter to some strategies: refuse them where they would be silently ignored.
  if (a.momentum && in.optimizer != OptimizerKind::SGD)
    throw Error("--momentum applies to --optimizer sgd; AdamW keeps its own moments (m and v)");
  const bool has_hybrid = a.strategy == "all" || strategies.front() == Sharding::Hybrid;
  if (a.node_size_opt->count() && !has_hybrid)
    throw Error("--node-size sets HYBRID_SHARD's shard group; use it with --strategy hybrid or all");
  if (a.prefetch && a.unit_opt->count() == 0)
    throw Error("--prefetch counts the next unit's gathered parameters; give the largest unit's size with --unit-params");

  std::vector<MemoryPlan> plans;
  for (Sharding s : strategies) {
    in.sharding = s;
    plans.push_back(plan_memory(in));  // validates the numbers (world, node size, unit size)
  }
  const BytesPerParam b = bytes_per_param(in.dtype, in.optimizer, in.sgd_momentum);

  if (a.json) {
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
    io.out << j.dump() << "\n";
    return 0;
  }

  const char* precision = in.dtype == PlanDType::Mixed ? "fp16" : "fp32";
  char psi[32];
  std::snprintf(psi, sizeof psi, "%.0f", a.params);
  io.out << "Memory per rank: " << param_count_str(a.params) << " parameters (Ψ = " << psi << "), " << a.world << (a.world == 1 ? " rank, " : " ranks, ")
         << (in.dtype == PlanDType::Mixed ? "mixed precision" : "fp32") << ", "
         << optimizer_name(in.optimizer) << (a.momentum ? " with momentum" : "") << "\n";
  io.out << "Bytes per parameter: parameters " << b.parameters << " (" << precision << "), gradients "
         << b.gradients << " (" << precision << "), optimizer state " << b.optimizer_state << " ("
         << optimizer_state_note(in) << ")\n";
  if (has_hybrid) {
    const int group = a.node_size > 0 ? a.node_size : a.world;
    if (group == a.world)
      io.out << "HYBRID_SHARD: one group of all " << a.world
             << " ranks, the same as FULL_SHARD (give the ranks per node with --node-size)\n";
    else
      io.out << "HYBRID_SHARD: FULL_SHARD inside groups of " << group << " ranks, replicated across "
             << a.world / group << " groups\n";
  }
  if (a.unit_params > 0)
    io.out << "Gathered: the largest unit (Ψ_u = " << param_count_str(a.unit_params)
           << " parameters) unsharded, " << in.units_in_flight
           << (in.units_in_flight == 1 ? " unit in flight (2 with --prefetch)" : " units in flight (prefetch)") << "\n";
  io.out << "\n";

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
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  app.add_option("--params", a->params, "Model size Ψ in parameters: 7.5e9, 7B, 70B, 125M, 4547")
      ->required()->transform(param_count());
  app.add_option("--world", a->world, "Data-parallel ranks N")->required()->check(whole_number(1, 1 << 20));
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
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_plan(*a, io); };
}

}  // namespace dtlab::cli
