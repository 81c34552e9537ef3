#include "cli/train_pipeline.h"

#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab::cli {

namespace {

// --unit-costs: every action one modeled millisecond.
constexpr double kUnitCost = 1e-3;

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

std::string stage_list(const std::vector<int>& stages) {
  std::string s;
  for (int st : stages) s += (s.empty() ? "" : ",") + std::to_string(st);
  return s;
}

// A modeled duration in the unit that reads best: "514 ps", "1 ms", "3.2 us".
std::string model_time(double s) {
  const char* units[] = {"s", "ms", "us", "ns", "ps"};
  int u = 0;
  while (u < 4 && s != 0 && std::abs(s) < 0.9995) s *= 1e3, u++;  // 1e-3 * 1e3 may land just below 1
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", s, units[u]);
  return buf;
}

}  // namespace

void add_pipeline_flags(CLI::App& app, PipelineArgs& a, TrainConfig& c) {
  PipelineOptions& p = c.pipeline;
  a.options = {
      app.add_option("--stages", p.stages, "Pipeline: ranks per pipeline, p (the model is cut into p x --chunks stages)")
          ->check(whole_number(1, 64))->capture_default_str(),
      app.add_option("--microbatches", p.microbatches, "Pipeline: micro-batches per batch, m (--batch must be a multiple)")
          ->check(whole_number(1, 4096))->capture_default_str(),
      app.add_option("--schedule", a.schedule, "Pipeline schedule: gpipe | 1f1b | interleaved | zb-h1")->capture_default_str(),
      app.add_option("--chunks", p.chunks, "Pipeline: stages per rank, v (interleaved)")->check(whole_number(1, 64))->capture_default_str(),
      app.add_option("--dp", p.dp, "Pipeline: data-parallel replicas, D (world = stages x dp; rank = replica x p + stage rank)")
          ->check(whole_number(1, 64))->capture_default_str(),
      app.add_option("--split", a.split, "Pipeline: Linear layers per stage, e.g. 2,2,1 (default: balanced by parameter count)"),
      app.add_flag("--unit-costs", a.unit_costs, "Pipeline: every F, B, I and W costs 1 ms of modeled time (equal stages; "
                                                 "with --profile ideal the measured bubbles equal the formulas)"),
  };
}

void finish_pipeline_config(const PipelineArgs& a, TrainConfig& c, bool world_given) {
  if (c.strategy != "pipeline") {
    for (CLI::Option* o : a.options)
      if (o->count() > 0) throw Error(o->get_name() + " configures a pipeline; add --strategy pipeline --stages p");
    return;
  }
  c.pipeline.schedule = parse_schedule_kind(a.schedule);
  if (!a.split.empty()) c.pipeline.split = parse_split(a.split);
  if (a.unit_costs) c.pipeline.fixed_costs = ActionCosts{kUnitCost, kUnitCost, kUnitCost, kUnitCost, 0};
  if (!world_given) c.world_size = c.pipeline.stages * c.pipeline.dp;
}

void print_pipeline_header(std::ostream& out, const Trainer& trainer) {
  const PipelinePlan& plan = *trainer.pipeline_plan();
  const TrainConfig& c = trainer.config();
  const PipelineOptions& o = plan.options;
  out << "  pipeline: " << plan.schedule.name << ", " << plan.stages.size() << " stages on " << o.stages
      << (o.stages == 1 ? " rank" : " ranks") << (o.chunks > 1 ? " (" + std::to_string(o.chunks) + " per rank)" : "")
      << ", " << o.microbatches << " micro-batches of " << c.batch / o.microbatches << " samples, " << o.dp
      << (o.dp == 1 ? " replica" : " replicas (rank = replica x " + std::to_string(o.stages) + " + stage rank)")
      << "; effective batch " << trainer.effective_batch() << "\n";
  for (size_t s = 0; s < plan.stages.size(); s++)
    out << "    stage " << s << " on rank " << rank_of_stage(static_cast<int>(s), o.stages) << ": "
        << describe_stage(c.model, plan.stages[s]) << "\n";
  if (o.fixed_costs) out << "    every F, B, I and W costs " << model_time(o.fixed_costs->forward) << " of modeled time\n";
}

void print_pipeline_summary(std::ostream& out, const Trainer& trainer, const TrainSummary& s) {
  const PipelinePlan& plan = *trainer.pipeline_plan();
  const PipelineOptions& o = plan.options;
  const PipelineStats& p = s.pipeline;
  const bool zb = o.schedule == ScheduleKind::ZBH1;
  const BubbleFormula f = formula_bubble(o.schedule, o.stages, o.microbatches, o.chunks, p.costs);
  out << "pipeline " << p.schedule << " (modeled, profile " << trainer.config().profile << "; mean over " << p.iterations
      << " iterations, makespan " << model_time(p.makespan) << "):\n";
  out << "  bubble = idle / makespan; formula: idle " << f.idle_text << " over idle + " << f.ideal_text
      << ", with this run's mean T_F " << model_time(p.costs.forward);
  if (zb) out << ", T_I " << model_time(p.costs.backward_input) << ", T_W " << model_time(p.costs.backward_weight) << "\n";
  else out << ", T_B " << model_time(p.costs.backward) << "\n";
  out << "  rank  replica  stages  bubble  formula  in-flight  formula" << (zb ? "  until W  formula" : "")
      << "  parameters  activations (peak)\n";
  for (const PipelineRankStats& r : p.ranks) {
    const MemoryStats& m = s.rank_memory.at(static_cast<size_t>(r.rank));
    char line[256];
    int n = std::snprintf(line, sizeof line, "  %4d  %7d  %-6s  %6s  %7s  %9d  %7d", r.rank, r.replica,
                          stage_list(r.stages).c_str(), percent(r.bubble).c_str(), percent(r.formula_bubble).c_str(),
                          r.peak_inflight, r.formula_peak_inflight);
    if (zb) n += std::snprintf(line + n, sizeof line - n, "  %7d  %7d", r.peak_inflight_w, r.formula_peak_inflight_w);
    std::snprintf(line + n, sizeof line - n, "  %10s  %18s", human_bytes(m.current_of(MemCategory::Parameters)).c_str(),
                  human_bytes(m.peak_of(MemCategory::Activations)).c_str());
    out << line << "\n";
  }
}

nlohmann::json pipeline_json(const TrainSummary& s) {
  const PipelineStats& p = s.pipeline;
  nlohmann::json ranks = nlohmann::json::array();
  for (const PipelineRankStats& r : p.ranks) {
    const MemoryStats& m = s.rank_memory.at(static_cast<size_t>(r.rank));
    ranks.push_back({{"rank", r.rank},
                     {"replica", r.replica},
                     {"stages", r.stages},
                     {"bubble", r.bubble},
                     {"formula_bubble", r.formula_bubble},
                     {"peak_inflight", r.peak_inflight},
                     {"formula_peak_inflight", r.formula_peak_inflight},
                     {"peak_inflight_until_w", r.peak_inflight_w},
                     {"formula_peak_inflight_until_w", r.formula_peak_inflight_w},
                     {"parameter_bytes", m.current_of(MemCategory::Parameters)},
                     {"activation_peak_bytes", m.peak_of(MemCategory::Activations)}});
  }
  return {{"schedule", p.schedule},
          {"iterations", p.iterations},
          {"makespan_s", p.makespan},
          {"t_f", p.costs.forward},
          {"t_b", p.costs.backward},
          {"t_i", p.costs.backward_input},
          {"t_w", p.costs.backward_weight},
          {"ranks", ranks}};
}

}  // namespace dtlab::cli
