#include "engine/parallel/pipeline_schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "engine/core/format.h"
#include "engine/io/atomic_file.h"

namespace dtlab {

namespace {

// What an action needs, in three kinds: B and I both play "the backward that passes the gradient
// on" (an I-and-W schedule and a B schedule depend on each other's stages the same way).
enum Phase : int { kFwd = 0, kBwd = 1, kWgt = 2 };

Phase phase_of(ActionType t) {
  if (t == ActionType::Forward) return kFwd;
  if (t == ActionType::BackwardWeight) return kWgt;
  return kBwd;
}

struct Dep {
  int stage;
  Phase phase;
};

// F(s) needs F(s-1); B/I(s) needs F(s) and B/I(s+1); W(s) needs I(s). Same micro-batch always.
int deps_of(const Action& a, int stages, Dep out[2]) {
  switch (phase_of(a.type)) {
    case kFwd:
      if (a.stage == 0) return 0;
      out[0] = {a.stage - 1, kFwd};
      return 1;
    case kBwd:
      out[0] = {a.stage, kFwd};
      if (a.stage == stages - 1) return 1;
      out[1] = {a.stage + 1, kBwd};
      return 2;
    case kWgt:
      out[0] = {a.stage, kBwd};
      return 1;
  }
  return 0;
}

using Orders = std::vector<std::vector<Action>>;  // [rank][k]: compute actions in order, no idles

// Runs every rank's actions in order, each as early as its rank and dependencies allow. Stops when
// all ran or no rank can make progress (then next[r] points at each rank's blocked action).
struct OrderRun {
  std::vector<std::vector<double>> start, end;  // [rank][k]
  std::vector<size_t> next;                     // [rank]: actions that ran
  std::vector<double> done;                     // [phase][stage][mb] end time, NaN until run
  int stages = 0, microbatches = 0;

  double& done_at(int stage, Phase ph, int mb) {
    return done[(static_cast<size_t>(ph) * stages + stage) * microbatches + mb];
  }
  double done_at(int stage, Phase ph, int mb) const {
    return done[(static_cast<size_t>(ph) * stages + stage) * microbatches + mb];
  }
  bool complete(const Orders& orders) const {
    for (size_t r = 0; r < orders.size(); r++)
      if (next[r] < orders[r].size()) return false;
    return true;
  }
};

OrderRun run_orders(const Orders& orders, int stages, int microbatches, const ActionCosts& costs) {
  const size_t ranks = orders.size();
  OrderRun run;
  run.stages = stages;
  run.microbatches = microbatches;
  run.done.assign(3ull * stages * microbatches, std::numeric_limits<double>::quiet_NaN());
  run.next.assign(ranks, 0);
  run.start.resize(ranks);
  run.end.resize(ranks);
  std::vector<int> stage_rank(stages, -1);
  for (size_t r = 0; r < ranks; r++)
    for (const Action& a : orders[r]) stage_rank[a.stage] = static_cast<int>(r);
  std::vector<double> free_at(ranks, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t r = 0; r < ranks; r++) {
      while (run.next[r] < orders[r].size()) {
        const Action& a = orders[r][run.next[r]];
        Dep deps[2];
        const int n = deps_of(a, stages, deps);
        double start = free_at[r];
        bool ready = true;
        for (int i = 0; i < n && ready; i++) {
          const double t = run.done_at(deps[i].stage, deps[i].phase, a.mb);
          ready = !std::isnan(t);
          const bool hop = stage_rank[deps[i].stage] != static_cast<int>(r);
          if (ready) start = std::max(start, t + (hop ? costs.hop_latency : 0));
        }
        if (!ready) break;
        const double end = start + cost_of(a.type, costs);
        run.start[r].push_back(start);
        run.end[r].push_back(end);
        run.done_at(a.stage, phase_of(a.type), a.mb) = end;
        free_at[r] = end;
        run.next[r]++;
        progress = true;
      }
    }
  }
  return run;
}

// PyTorch's _get_1f1b_rank_ops: `warmup` forwards, then (F, B) pairs, then the remaining Bs. With
// `deferred_w` >= 0 (zero bubble) each B is an I, and once `deferred_w` pairs ran every I is
// followed by the W of the oldest I still waiting; the last Ws close the list. Stages cycle through
// the rank's chunks in rounds of `per_round` micro-batches: forwards from the first chunk up,
// backwards from the last chunk down.
std::vector<Action> one_f_one_b_ops(int rank, int p, int m, int v, int warmup, int per_round, int deferred_w) {
  const bool zero_bubble = deferred_w >= 0;
  auto fwd_stage = [&](int op) { return ((op / per_round) % v) * p + rank; };
  auto bwd_stage = [&](int op) { return (v - 1 - ((op - warmup) / per_round) % v) * p + rank; };
  std::vector<int> fwd_mb(p * v, 0), bwd_mb(p * v, 0), w_mb(p * v, 0);
  std::vector<int> bwd_ops;
  size_t w_count = 0;
  std::vector<Action> ops;
  auto add_w = [&] {
    const int s = bwd_stage(bwd_ops[w_count++]);
    ops.push_back({s, ActionType::BackwardWeight, w_mb[s]++});
  };
  const int total = v * m;  // forwards, and as many backwards
  for (int op = 0; op < warmup + total; op++) {
    if (op < total) {
      const int s = fwd_stage(op);
      ops.push_back({s, ActionType::Forward, fwd_mb[s]++});
    }
    if (op >= warmup) {
      const int s = bwd_stage(op);
      ops.push_back({s, zero_bubble ? ActionType::BackwardInput : ActionType::Backward, bwd_mb[s]++});
      bwd_ops.push_back(op);
      if (zero_bubble && op - warmup >= deferred_w) add_w();
    }
  }
  while (zero_bubble && w_count < bwd_ops.size()) add_w();
  return ops;
}

int interleaved_warmup(int rank, int p, int m, int v) {
  return std::min((v - 1) * p + 2 * (p - rank - 1), m * v);
}

// One action per unit time step at its earliest start: unit costs and no latency make every start
// a whole number, the step.
PipelineSchedule lay_out(PipelineSchedule s, const Orders& orders) {
  const OrderRun run = run_orders(orders, s.stages, s.microbatches, ActionCosts{});
  DTLAB_CHECK(run.complete(orders), "a generated pipeline order deadlocks; the generator is wrong");
  s.order.assign(s.ranks, {});
  for (int r = 0; r < s.ranks; r++) {
    for (size_t k = 0; k < orders[r].size(); k++) {
      const auto step = static_cast<size_t>(run.start[r][k]);
      if (s.order[r].size() <= step) s.order[r].resize(step + 1);
      s.order[r][step] = orders[r][k];
    }
  }
  return s;
}

// The cells of one (stage, mb, phase): where it runs and as which type (B or I for kBwd).
struct Cell {
  int rank = -1, step = -1;
  ActionType type = ActionType::Forward;
};

std::string where(const Cell& c) {
  return "rank " + std::to_string(c.rank) + ", step " + std::to_string(c.step);
}

std::string grid_label(int rank, int step) {
  return "Rank " + std::to_string(rank) + ", step " + std::to_string(step) + ": ";
}

[[noreturn]] void fail(const PipelineSchedule& s, int rank, int step, const std::string& sentence) {
  throw ScheduleError(sentence, rank, step, format_schedule(s, step));
}

}  // namespace

double cost_of(ActionType t, const ActionCosts& c) {
  switch (t) {
    case ActionType::Forward: return c.forward;
    case ActionType::Backward: return c.backward;
    case ActionType::BackwardInput: return c.backward_input;
    case ActionType::BackwardWeight: return c.backward_weight;
    default: return 0;
  }
}

int num_steps(const PipelineSchedule& s) {
  size_t n = 0;
  for (const auto& row : s.order) n = std::max(n, row.size());
  return static_cast<int>(n);
}

// ---- kinds and generators ----

ScheduleKind parse_schedule_kind(std::string_view flag) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1})
    if (flag == schedule_kind_flag(k)) return k;
  throw Error("'" + std::string(flag) + "' is not a pipeline schedule; use gpipe, 1f1b, interleaved or zb-h1");
}

const char* schedule_kind_flag(ScheduleKind k) {
  constexpr const char* kFlags[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
  return kFlags[static_cast<int>(k)];
}

const char* schedule_kind_name(ScheduleKind k) {
  constexpr const char* kNames[] = {"GPipe", "1F1B", "Interleaved 1F1B", "ZB-H1"};
  return kNames[static_cast<int>(k)];
}

PipelineSchedule make_schedule(ScheduleKind kind, int ranks, int microbatches, int chunks) {
  const int p = ranks, m = microbatches, v = chunks;
  if (p < 1) throw Error("a pipeline needs at least one rank (stage), not " + std::to_string(p));
  if (m < 1) throw Error("a pipeline needs at least one micro-batch, not " + std::to_string(m));
  if (v < 1) throw Error("each rank needs at least one chunk (stage), not " + std::to_string(v));
  if (kind != ScheduleKind::Interleaved1F1B && v != 1)
    throw Error(std::string(schedule_kind_name(kind)) + " places one stage per rank; more chunks per rank need the interleaved schedule");
  if (kind == ScheduleKind::Interleaved1F1B && m % p != 0)
    throw Error("Interleaved 1F1B runs micro-batches in rounds of one per rank, so the micro-batches (" +
                std::to_string(m) + ") must be a multiple of the ranks (" + std::to_string(p) + "), as in PyTorch");
  PipelineSchedule s;
  s.name = schedule_kind_name(kind);
  s.stages = p * v;
  s.ranks = p;
  s.microbatches = m;
  s.chunks = v;
  Orders orders(p);
  for (int r = 0; r < p; r++) {
    switch (kind) {
      case ScheduleKind::GPipe:  // every forward is warmup
        orders[r] = one_f_one_b_ops(r, p, m, 1, m, p, -1);
        break;
      case ScheduleKind::OneFOneB:
        orders[r] = one_f_one_b_ops(r, p, m, 1, std::min(p - r - 1, m), p, -1);
        break;
      case ScheduleKind::Interleaved1F1B:
        orders[r] = one_f_one_b_ops(r, p, m, v, interleaved_warmup(r, p, m, v), p, -1);
        break;
      case ScheduleKind::ZBH1:
        orders[r] = one_f_one_b_ops(r, p, m, 1, std::min(p - r - 1, m), p, r);
        break;
    }
  }
  return lay_out(std::move(s), orders);
}

// ---- validation ----

ScheduleError::ScheduleError(std::string sentence_, int rank_, int step_, const std::string& grid)
    : Error(sentence_ + "\n\n" + (grid.empty() || grid.back() != '\n' ? grid : grid.substr(0, grid.size() - 1))),
      sentence(std::move(sentence_)),
      rank(rank_),
      step(step_) {}

namespace {

// The validation's view of a grid: which cell ran each (phase, stage, micro-batch), and where each
// stage was first seen.
struct CellTable {
  int S, M;
  std::vector<Cell> cells;       // [phase][stage][mb]
  std::vector<Cell> stage_home;  // the first cell seen of each stage
  CellTable(int S_, int M_) : S(S_), M(M_), cells(3ull * S_ * M_), stage_home(S_) {}
  Cell& at(int stage, Phase ph, int mb) { return cells[(static_cast<size_t>(ph) * S + stage) * M + mb]; }
  // The action a dependency names: the one the grid ran, or the one it should have.
  std::string dep_name(const Dep& d, int mb) {
    const Cell& c = at(d.stage, d.phase, mb);
    if (c.rank >= 0) return action_str({d.stage, c.type, mb});
    if (d.phase == kFwd) return action_str({d.stage, ActionType::Forward, mb});
    return action_str({d.stage, ActionType::Backward, mb}) + " (or " + action_str({d.stage, ActionType::BackwardInput, mb}) + ")";
  }
};

void check_sizes(const PipelineSchedule& s) {
  const int S = s.stages, M = s.microbatches;
  if (S < 1 || s.ranks < 1 || M < 1 || s.chunks < 1 || S != s.ranks * s.chunks ||
      static_cast<int>(s.order.size()) != s.ranks)
    throw Error("the schedule's sizes disagree: " + std::to_string(S) + " stages, " + std::to_string(s.ranks) +
                " ranks with " + std::to_string(s.chunks) + " chunks each, " + std::to_string(s.order.size()) +
                " rows; stages must be ranks x chunks with one row per rank");
  if (static_cast<int64_t>(S) * M > kMaxScheduleCells)
    throw Error("the schedule has " + std::to_string(S) + " stages x " + std::to_string(M) + " micro-batches; dtlab checks at most " +
                std::to_string(kMaxScheduleCells) + " (stage, micro-batch) pairs");
}

// 1. cells, in time order (step by step, rank by rank) so the first failure is the earliest.
void fill_cells(const PipelineSchedule& s, CellTable& table) {
  const int S = s.stages, M = s.microbatches, steps = num_steps(s);
  for (int t = 0; t < steps; t++) {
    for (int r = 0; r < s.ranks; r++) {
      if (t >= static_cast<int>(s.order[r].size()) || !s.order[r][t]) continue;
      const Action& a = *s.order[r][t];
      const std::string at = grid_label(r, t) + action_str(a);
      if (!is_compute(a.type))
        fail(s, r, t, at + " is a communication action; a schedule grid holds compute actions only (F, B, I, W)");
      if (a.stage < 0 || a.stage >= S)
        fail(s, r, t, at + " names stage " + std::to_string(a.stage) + ", but the schedule has stages 0 to " + std::to_string(S - 1));
      if (a.mb < 0 || a.mb >= M)
        fail(s, r, t, at + " names micro-batch " + std::to_string(a.mb) + ", but the schedule has micro-batches 0 to " + std::to_string(M - 1));
      Cell& home = table.stage_home[a.stage];
      if (home.rank < 0) home = {r, t, a.type};
      else if (home.rank != r)
        fail(s, r, t, at + " puts stage " + std::to_string(a.stage) + " on rank " + std::to_string(r) + ", but rank " +
                          std::to_string(home.rank) + " already runs it (" + action_str(*s.order[home.rank][home.step]) +
                          " at step " + std::to_string(home.step) + "); a stage lives on one rank");
      Cell& c = table.at(a.stage, phase_of(a.type), a.mb);
      if (c.rank >= 0)
        fail(s, r, t, at + " repeats " + action_str({a.stage, c.type, a.mb}) + " (" + where(c) +
                          "); each micro-batch runs F once and B (or I and W) once per stage");
      c = {r, t, a.type};
    }
  }
}

// 3. nothing missing (what others depend on was caught in 2: this is what nothing waits for).
void check_complete(const PipelineSchedule& s, CellTable& table) {
  const int S = s.stages, M = s.microbatches;
  for (int st = 0; st < S; st++) {
    const int home = table.stage_home[st].rank;
    if (home < 0)
      fail(s, -1, -1, "No rank runs stage " + std::to_string(st) + "; a schedule of " + std::to_string(S) +
                          " stages needs every one of them on some rank");
    for (int mb = 0; mb < M; mb++) {
      const std::string never = "Rank " + std::to_string(home) + " never runs ";
      if (table.at(st, kFwd, mb).rank < 0)
        fail(s, home, -1, never + action_str({st, ActionType::Forward, mb}) + ", the forward of micro-batch " +
                              std::to_string(mb) + " on stage " + std::to_string(st));
      const Cell& b = table.at(st, kBwd, mb);
      if (b.rank < 0)
        fail(s, home, -1, never + "the backward of micro-batch " + std::to_string(mb) + " on stage " + std::to_string(st) +
                              " (" + action_str({st, ActionType::Backward, mb}) + ", or " +
                              action_str({st, ActionType::BackwardInput, mb}) + " and " +
                              action_str({st, ActionType::BackwardWeight, mb}) + ")");
      if (b.type == ActionType::BackwardInput && table.at(st, kWgt, mb).rank < 0)
        fail(s, home, -1, never + action_str({st, ActionType::BackwardWeight, mb}) + ", the weight gradient that " +
                              action_str({st, ActionType::BackwardInput, mb}) + " (step " + std::to_string(b.step) + ") leaves to do");
    }
  }
}

// 4. deadlock: run the per-rank orders; every rank left must be blocked.
void check_deadlock(const PipelineSchedule& s, CellTable& table, const Orders& orders,
                    const std::vector<std::vector<int>>& order_steps) {
  const int S = s.stages, M = s.microbatches;
  const OrderRun run = run_orders(orders, S, M, ActionCosts{});
  if (run.complete(orders)) return;
  std::string sentence = "Deadlock: ";
  int first_rank = -1, first_step = num_steps(s);
  for (int r = 0; r < s.ranks; r++) {
    if (run.next[r] >= orders[r].size()) continue;
    const Action& a = orders[r][run.next[r]];
    const int t = order_steps[r][run.next[r]];
    Dep deps[2];
    const int n = deps_of(a, S, deps);
    for (int i = 0; i < n; i++) {
      if (!std::isnan(run.done_at(deps[i].stage, deps[i].phase, a.mb))) continue;
      const Cell& d = table.at(deps[i].stage, deps[i].phase, a.mb);
      if (first_rank >= 0) sentence += ", ";
      sentence += "rank " + std::to_string(r) + " waits at step " + std::to_string(t) + " with " + action_str(a) +
                  (d.rank == r ? " for its own later " + table.dep_name(deps[i], a.mb) + " (step " + std::to_string(d.step) + ")"
                               : " for " + table.dep_name(deps[i], a.mb) + " (" + where(d) + ")");
      if (t < first_step || first_rank < 0) first_step = t, first_rank = r;
      break;
    }
  }
  fail(s, first_rank, first_step, sentence + "; no rank can make progress");
}

}  // namespace

void validate(const PipelineSchedule& s) {
  check_sizes(s);
  const int S = s.stages;
  CellTable table(S, s.microbatches);
  fill_cells(s, table);

  // 2. every dependency exists; 5 (timing) is checked on the same walk but reported after 3 and 4.
  const int steps = num_steps(s);
  std::string late;
  int late_rank = -1, late_step = -1;
  Orders orders(s.ranks);
  std::vector<std::vector<int>> order_steps(s.ranks);
  for (int t = 0; t < steps; t++) {
    for (int r = 0; r < s.ranks; r++) {
      if (t >= static_cast<int>(s.order[r].size()) || !s.order[r][t]) continue;
      const Action& a = *s.order[r][t];
      orders[r].push_back(a);
      order_steps[r].push_back(t);
      Dep deps[2];
      const int n = deps_of(a, S, deps);
      for (int i = 0; i < n; i++) {
        const Cell& d = table.at(deps[i].stage, deps[i].phase, a.mb);
        const std::string waits = grid_label(r, t) + action_str(a) + " waits for " + table.dep_name(deps[i], a.mb);
        if (d.rank < 0) fail(s, r, t, waits + ", which no rank runs");
        if (a.type == ActionType::BackwardWeight && d.type == ActionType::Backward)
          fail(s, r, t, grid_label(r, t) + action_str(a) + " comes with the full backward " + table.dep_name(deps[i], a.mb) +
                            " (" + where(d) + "), which already computes the weight gradient; use I and W, or B alone");
        if (d.step >= t && late.empty()) {
          late = waits + ", which runs at step " + std::to_string(d.step) + " on rank " + std::to_string(d.rank) +
                 "; a dependency must finish in an earlier step";
          late_rank = r;
          late_step = t;
        }
      }
    }
  }

  check_complete(s, table);
  check_deadlock(s, table, orders, order_steps);
  // 5. timing.
  if (!late.empty()) fail(s, late_rank, late_step, late);
}

// ---- the grid ----

std::string format_schedule(const PipelineSchedule& s, int error_step) {
  const int steps = num_steps(s);
  const size_t digits = std::to_string(std::max(steps - 1, 0)).size();
  auto label = [&](int t) {
    std::string n = std::to_string(t);
    return "Step " + std::string(digits - n.size(), '0') + n;
  };
  auto text = [&](int r, int t) -> std::string {
    if (t >= static_cast<int>(s.order[r].size()) || !s.order[r][t]) return "";
    return action_str(*s.order[r][t]);
  };
  const size_t label_width = label(0).size();
  std::vector<size_t> width(s.order.size());
  for (size_t r = 0; r < s.order.size(); r++) {
    width[r] = std::max(label_width, ("Rank " + std::to_string(r)).size());
    for (int t = 0; t < steps; t++) width[r] = std::max(width[r], text(static_cast<int>(r), t).size());
  }
  auto row = [&](std::string line, auto cell_of, bool marked) {
    for (size_t r = 0; r < width.size(); r++) {
      std::string c = cell_of(r);
      line += (r ? " " : "") + c + std::string(width[r] - c.size(), ' ');
    }
    if (marked) return line + " <-- ERROR HERE\n";
    line.erase(line.find_last_not_of(' ') + 1);
    return line + "\n";
  };
  std::string out = row(std::string(label_width + 2, ' '), [](size_t r) { return "Rank " + std::to_string(r); }, false);
  for (int t = 0; t < steps; t++)
    out += row(label(t) + ": ", [&](size_t r) { return text(static_cast<int>(r), t); }, t == error_step);
  return out;
}

// ---- CSV ----

void save_csv(const PipelineSchedule& s, const std::string& path) {
  std::string text;
  for (const auto& row : s.order) {
    for (size_t t = 0; t < row.size(); t++) text += (t ? "," : "") + (row[t] ? action_str(*row[t]) : "");
    text += "\n";
  }
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

PipelineSchedule load_csv(const std::string& path, std::optional<int> stages, std::optional<int> microbatches) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error("'" + path + "' does not exist; check the path");
  if (std::filesystem::is_directory(path, ec)) throw Error("'" + path + "' is a directory, not a schedule CSV");
  if (const std::string why = not_a_regular_file(path); !why.empty()) throw Error("'" + path + "' " + why);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("'" + path + "' cannot be opened for reading");
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // PyTorch's csv.writer ends rows with \r\n
    lines.push_back(line);
  }
  while (!lines.empty() && trim_blanks(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) throw Error("'" + path + "' holds no schedule; give one row of actions per rank (e.g. 0F0,0F1,,0B0)");

  PipelineSchedule s;
  s.name = std::filesystem::path(path).filename().string();
  s.ranks = static_cast<int>(lines.size());
  int max_stage = -1, max_mb = -1;
  for (size_t r = 0; r < lines.size(); r++) {
    auto& row = s.order.emplace_back();
    size_t begin = 0;
    for (size_t col = 1;; col++) {
      const size_t comma = lines[r].find(',', begin);
      std::string cell = trim_blanks(std::string_view(lines[r]).substr(begin, comma - begin));
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = trim_blanks(cell.substr(1, cell.size() - 2));
      if (cell.empty()) {
        row.emplace_back();
      } else {
        try {
          row.push_back(parse_action(cell));
        } catch (const Error& e) {
          throw Error(path + ":" + std::to_string(r + 1) + ":" + std::to_string(col) + ": " + e.what());
        }
        max_stage = std::max(max_stage, row.back()->stage);
        max_mb = std::max(max_mb, row.back()->mb);
      }
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
    while (!row.empty() && !row.back()) row.pop_back();
  }
  if (max_stage < 0) throw Error("'" + path + "' holds no actions; give one row of actions per rank (e.g. 0F0,0F1,,0B0)");
  s.stages = max_stage + 1;
  s.microbatches = max_mb + 1;
  if (stages && *stages != s.stages)
    throw Error("'" + path + "' runs " + std::to_string(s.stages) + " stages, not " + std::to_string(*stages));
  if (microbatches && *microbatches != s.microbatches)
    throw Error("'" + path + "' runs " + std::to_string(s.microbatches) + " micro-batches, not " + std::to_string(*microbatches));
  if (s.stages % s.ranks != 0)
    throw Error("'" + path + "' puts " + std::to_string(s.stages) + " stages on " + std::to_string(s.ranks) +
                " ranks; give every rank the same number of stages");
  s.chunks = s.stages / s.ranks;
  validate(s);
  return s;
}

// ---- analysis ----

BubbleFormula formula_bubble(ScheduleKind kind, int p, int m, int v, const ActionCosts& c) {
  DTLAB_CHECK(p >= 1 && m >= 1 && v >= 1, "formula_bubble needs p, m, v >= 1");
  BubbleFormula f;
  f.idle = (p - 1) * (c.forward + c.backward);
  f.ideal = m * (c.forward + c.backward);
  f.idle_text = "(p-1)(T_F+T_B)";
  f.ideal_text = "m(T_F+T_B)";
  if (kind == ScheduleKind::Interleaved1F1B) {
    f.ideal *= v;
    f.ideal_text = "vm(T_F+T_B)";
  } else if (kind == ScheduleKind::ZBH1) {
    const double filler = std::min({c.forward, c.backward_input, c.backward_weight});
    f.idle = (p - 1) * (c.forward + c.backward_input) - (std::min(m, p) - 1) * filler;
    f.ideal = m * (c.forward + c.backward_input + c.backward_weight);
    f.idle_text = m >= p && c.backward_weight <= std::min(c.forward, c.backward_input)
                      ? "(p-1)(T_F+T_I-T_W)"
                      : "(p-1)(T_F+T_I)-(min(m,p)-1)min(T_F,T_I,T_W)";
    f.ideal_text = "m(T_F+T_I+T_W)";
  }
  f.of_ideal = f.ideal > 0 ? f.idle / f.ideal : 0;
  f.of_wall = f.idle + f.ideal > 0 ? f.idle / (f.idle + f.ideal) : 0;
  return f;
}

int formula_peak_inflight(ScheduleKind kind, int rank, int p, int m, int v, InflightUntil until) {
  switch (kind) {
    case ScheduleKind::GPipe: return m;
    case ScheduleKind::OneFOneB: return std::min(p - rank, m);
    case ScheduleKind::ZBH1: return std::min(until == InflightUntil::BackwardWeight ? p : p - rank, m);
    case ScheduleKind::Interleaved1F1B: return std::min(interleaved_warmup(rank, p, m, v) + 1, m * v);
  }
  return 0;
}

int measured_peak_inflight(const PipelineSchedule& s, int rank, InflightUntil until) {
  const ActionType ends = until == InflightUntil::BackwardWeight ? ActionType::BackwardWeight : ActionType::BackwardInput;
  int live = 0, peak = 0;
  for (const auto& a : s.order.at(rank)) {
    if (!a) continue;
    if (a->type == ActionType::Forward) peak = std::max(peak, ++live);
    if (a->type == ActionType::Backward || a->type == ends) live--;
  }
  return peak;
}

ScheduleTiming simulate(const PipelineSchedule& s, const ActionCosts& costs) {
  validate(s);
  Orders orders(s.ranks);
  std::vector<std::vector<int>> steps(s.ranks);
  for (int r = 0; r < s.ranks; r++)
    for (size_t t = 0; t < s.order[r].size(); t++)
      if (s.order[r][t]) orders[r].push_back(*s.order[r][t]), steps[r].push_back(static_cast<int>(t));
  const OrderRun run = run_orders(orders, s.stages, s.microbatches, costs);
  DTLAB_CHECK(run.complete(orders), "validate() passed a schedule that deadlocks");
  ScheduleTiming out;
  out.ranks.resize(s.ranks);
  for (int r = 0; r < s.ranks; r++)
    for (size_t k = 0; k < orders[r].size(); k++) {
      out.ranks[r].push_back({orders[r][k], steps[r][k], run.start[r][k], run.end[r][k]});
      out.makespan = std::max(out.makespan, run.end[r][k]);
    }
  for (int r = 0; r < s.ranks; r++) {
    double busy = 0;
    for (const TimedAction& a : out.ranks[r]) busy += a.end - a.start;
    out.bubble.push_back(out.makespan > 0 ? (out.makespan - busy) / out.makespan : 0);
  }
  return out;
}

}  // namespace dtlab
