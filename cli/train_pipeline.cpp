#include "cli/train_pipeline.h"

#include "cli/text_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/format.h"

namespace dtlab::cli {

namespace {


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

void print_pipeline_header(std::ostream& out, const Trainer& trainer) {
  const PipelinePlan& plan = *trainer.pipeline_plan();
  const TrainConfig& c = trainer.config();
  const PipelineOptions& o = plan.options;
  const MeshShape& mesh = trainer.mesh();
  // With --tp each pipeline rank is a TP group of neighbouring world ranks (engine/core/mesh.h); with
  // --cp each replica of a stage is a CP group of neighbouring data-parallel indices.
  const int cp = std::max(c.cp, 1), replicas = trainer.data_replicas();
  const std::string dp_index = cp == 1 ? "replica" : "(replica x " + std::to_string(cp) + " + cp rank)";
  const std::string layout = mesh.tp == 1 ? "rank = " + dp_index + " x " + std::to_string(o.stages) + " + stage rank"
                                          : "rank = (" + dp_index + " x " + std::to_string(o.stages) + " + stage rank) x " +
                                                std::to_string(mesh.tp) + " + tp rank";
  out << "  pipeline: " << plan.schedule.name << ", " << plan.stages.size() << " stages on " << o.stages
      << (o.stages == 1 ? " rank" : " ranks") << (o.chunks > 1 ? " (" + std::to_string(o.chunks) + " per rank)" : "")
      << (mesh.tp > 1 ? ", each a tp group of " + std::to_string(mesh.tp) + " ranks" : "") << ", " << o.microbatches
      << " micro-batches of " << c.batch / o.microbatches << " samples, " << replicas << (replicas == 1 ? " replica" : " replicas")
      << (cp > 1 ? " of " + std::to_string(cp) + " context-parallel ranks a stage (--cp-layout " + cp_layout_name(c.cp_layout) + ")" : "")
      << (o.dp > 1 || mesh.tp > 1 ? " (" + layout + ")" : "") << "; effective batch " << trainer.effective_batch() << "\n";
  // A stage lives on its pipeline rank's TP group in every replica.
  for (size_t s = 0; s < plan.stages.size(); s++)
    out << "    stage " << s << " on "
        << rank_runs_text(mesh_ranks_at(mesh, MeshDim::PP, rank_of_stage(static_cast<int>(s), o.stages))) << ": "
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
  // With --tp a TP group's ranks run the same actions; each is a row, its tp rank beside its replica.
  const bool tp = trainer.mesh().tp > 1;
  out << "  rank  replica" << (tp ? "  tp" : "") << "  stages  bubble  formula  in-flight  formula"
      << (zb ? "  until W  formula" : "") << "  parameters  activations (peak)\n";
  for (const PipelineRankStats& r : p.ranks) {
    const MemoryStats& m = s.rank_memory.at(static_cast<size_t>(r.rank));
    char line[256];
    int n = std::snprintf(line, sizeof line, "  %4d  %7d", r.rank, r.replica);
    if (tp) n += std::snprintf(line + n, sizeof line - n, "  %2d", r.tp_rank);
    n += std::snprintf(line + n, sizeof line - n, "  %-6s  %6s  %7s  %9d  %7d", stage_list(r.stages).c_str(),
                       percent(r.bubble).c_str(), percent(r.formula_bubble).c_str(), r.peak_inflight, r.formula_peak_inflight);
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
                     {"tp_rank", r.tp_rank},
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
