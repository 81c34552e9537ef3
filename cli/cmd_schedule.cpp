// dtlab-cli schedule: a pipeline schedule (engine/parallel/pipeline_schedule.h) as PyTorch's grid,
// then per rank the peak in-flight micro-batches and the bubble, measured beside the formulas. The
// schedule is generated (--schedule) or read from a CSV (--load), and can be saved (--csv).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/text_table.h"
#include "engine/core/check.h"
#include "engine/io/atomic_file.h"
#include "engine/parallel/pipeline_schedule.h"

namespace dtlab::cli {

namespace {

struct ScheduleArgs {
  std::string schedule, csv, load;
  int stages = 0, microbatches = 0, chunks = 1;
  bool json = false;
  CLI::Option *stages_opt = nullptr, *mb_opt = nullptr, *chunks_opt = nullptr;
};


std::string rank_stages(const PipelineSchedule& s, int rank) {
  std::set<int> stages;
  for (const auto& a : s.order[rank])
    if (a) stages.insert(a->stage);
  std::string text;
  for (int st : stages) text += (text.empty() ? "" : ",") + std::to_string(st);
  return text;
}

// The flags describe the pipeline a loaded file must match, or the one to generate.
PipelineSchedule get_schedule(const ScheduleArgs& a, std::optional<ScheduleKind> kind) {
  if (!a.load.empty()) {
    PipelineSchedule s = load_csv(a.load);
    auto expect = [&](const CLI::Option* opt, int want, int got, const char* what) {
      if (opt->count() && want != got)
        throw Error(opt->get_name() + " " + std::to_string(want) + " does not match '" + a.load + "', which has " +
                    std::to_string(got) + " " + what);
    };
    expect(a.stages_opt, a.stages, s.ranks, "ranks (rows)");
    expect(a.mb_opt, a.microbatches, s.microbatches, "micro-batches");
    expect(a.chunks_opt, a.chunks, s.chunks, "stages per rank");
    if (kind && *kind != ScheduleKind::Interleaved1F1B && s.chunks != 1)
      throw Error("'" + a.load + "' has " + std::to_string(s.chunks) + " stages per rank, but --schedule " +
                  schedule_kind_flag(*kind) + " places one; compare it with --schedule interleaved");
    return s;
  }
  if (!kind) throw Error("give --schedule gpipe|1f1b|interleaved|zb-h1 with --stages and --microbatches, or --load FILE");
  if (!a.stages_opt->count() || !a.mb_opt->count())
    throw Error("--schedule needs --stages p (ranks in the pipeline) and --microbatches m");
  if (*kind != ScheduleKind::Interleaved1F1B && a.chunks_opt->count() && a.chunks != 1)
    throw Error("--chunks applies to --schedule interleaved; " + std::string(schedule_kind_flag(*kind)) +
                " places one stage per rank");
  const int chunks = *kind == ScheduleKind::Interleaved1F1B && !a.chunks_opt->count() ? 2 : a.chunks;
  return make_schedule(*kind, a.stages, a.microbatches, chunks);
}

bool has_weight_grads(const PipelineSchedule& s) {
  for (const auto& row : s.order)
    for (const auto& a : row)
      if (a && a->type == ActionType::BackwardWeight) return true;
  return false;
}


int run_schedule(const ScheduleArgs& a, Streams& io) {
  std::optional<ScheduleKind> kind;
  if (!a.schedule.empty()) kind = parse_schedule_kind(a.schedule);
  if (!a.csv.empty()) check_output_path("--csv", a.csv);
  const PipelineSchedule s = get_schedule(a, kind);
  const int p = s.ranks, m = s.microbatches, v = s.chunks;
  const ScheduleTiming timing = simulate(s);
  std::optional<BubbleFormula> bubble;
  if (kind) bubble = formula_bubble(*kind, p, m, v);
  const bool split = has_weight_grads(s);
  if (!a.csv.empty()) save_csv(s, a.csv);

  // Per rank: measured and formula peaks, until B/I and (zero bubble) until W.
  std::vector<std::vector<int>> peaks(4);
  for (int r = 0; r < p; r++) {
    for (int u = 0; u < 2; u++) {
      const auto until = static_cast<InflightUntil>(u);
      peaks[2 * u].push_back(measured_peak_inflight(s, r, until));
      if (kind) peaks[2 * u + 1].push_back(formula_peak_inflight(*kind, r, p, m, v, until));
    }
  }

  if (a.json) {
    nlohmann::json order = nlohmann::json::array();
    for (const auto& row : s.order) {
      nlohmann::json cells = nlohmann::json::array();
      for (const auto& cell : row) cells.push_back(cell ? nlohmann::json(action_str(*cell)) : nlohmann::json(nullptr));
      order.push_back(cells);
    }
    auto or_null = [&](const auto& x, bool has) { return has ? nlohmann::json(x) : nlohmann::json(nullptr); };
    nlohmann::json j = {{"name", s.name}, {"stages", s.stages}, {"ranks", p}, {"microbatches", m}, {"chunks", v},
                        {"steps", num_steps(s)}, {"order", order}, {"makespan", timing.makespan}};
    j["bubble"] = {{"simulated", timing.bubble},
                   {"formula", or_null(bubble ? bubble->of_wall : 0, bubble.has_value())},
                   {"formula_of_ideal", or_null(bubble ? bubble->of_ideal : 0, bubble.has_value())}};
    j["peak_inflight"] = {{"measured", peaks[0]}, {"formula", or_null(peaks[1], kind.has_value())}};
    if (split) {
      j["peak_inflight"]["measured_until_w"] = peaks[2];
      j["peak_inflight"]["formula_until_w"] = or_null(peaks[3], kind.has_value());
    }
    io.out << j.dump() << "\n";
    return 0;
  }

  io.out << s.name << ": " << p << (p == 1 ? " rank, " : " ranks, ") << s.stages << (s.stages == 1 ? " stage, " : " stages, ")
         << m << (m == 1 ? " micro-batch, " : " micro-batches, ") << num_steps(s) << " time steps (one per action)\n\n"
         << format_schedule(s) << "\n";
  std::vector<std::vector<std::string>> rows = {{"rank", "stages", "peak in-flight", "formula"}};
  if (split) rows[0].insert(rows[0].end(), {"until W", "formula"});
  rows[0].insert(rows[0].end(), {"bubble", "formula"});
  auto formula = [&](int u, int r) { return kind ? std::to_string(peaks[2 * u + 1][r]) : "-"; };
  for (int r = 0; r < p; r++) {
    std::vector<std::string> row = {std::to_string(r), rank_stages(s, r), std::to_string(peaks[0][r]), formula(0, r)};
    if (split) row.insert(row.end(), {std::to_string(peaks[2][r]), formula(1, r)});
    row.insert(row.end(), {percent(timing.bubble[r]), bubble ? percent(bubble->of_wall) : "-"});
    rows.push_back(row);
  }
  std::vector<bool> right(rows[0].size(), true);  // right-aligned numbers; the stage lists (column 1) left
  right[1] = false;
  print_table(io.out, rows, right);
  io.out << "\npeak in-flight: " << (v > 1 ? "(stage, micro-batch) pairs" : "micro-batches")
         << " whose F ran and whose B (or I) has not, i.e. activations held"
         << (split ? "; until W: whose W has not (W still needs the layer inputs)" : "") << "\n"
         << "bubble: idle share of the makespan, simulated with one time unit per action";
  if (bubble)
    io.out << "; formula: idle " << bubble->idle_text << " over ideal " << bubble->ideal_text << ", "
           << percent(bubble->of_wall) << " of wall time, " << percent(bubble->of_ideal) << " of the ideal";
  io.out << "\n";
  if (!a.csv.empty()) io.out << "saved " << a.csv << "\n";
  return 0;
}

}  // namespace

Runner add_schedule_command(CLI::App& app) {
  auto a = std::make_shared<ScheduleArgs>();
  app.add_option("--schedule", a->schedule, "gpipe | 1f1b | interleaved | zb-h1 (optional with --load: adds the formulas)");
  a->stages_opt = app.add_option("--stages", a->stages, "Pipeline depth p: ranks, each holding one stage (interleaved: --chunks stages)")
                      ->check(whole_number(1, 64));
  a->mb_opt = app.add_option("--microbatches", a->microbatches, "Micro-batches m per step")->check(whole_number(1, 1024));
  a->chunks_opt = app.add_option("--chunks", a->chunks, "Interleaved: stages per rank v (default 2), placed looped: stage s on rank s % p")
                      ->check(whole_number(1, 16));
  app.add_option("--csv", a->csv, "Save the schedule as PyTorch's CSV (one row per rank)")->check(output_path());
  app.add_option("--load", a->load, "Read a schedule from CSV instead of generating one");
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_schedule(*a, io); };
}

}  // namespace dtlab::cli
