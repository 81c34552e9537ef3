// Pipeline view: the schedule as it runs. A Gantt chart with one row per pipeline rank of the shown
// replica (the focused rank's, else replica 0), labelled by its stages and world ranks
// (PipelineView::rows: "stage 1: ranks 2, 3" with --tp 2, whose TP group runs the row's actions
// together), on the shown clock, from the iteration's first action:
// F blocks blue, B orange (I red, W green), later micro-batches darker, "F3" inside when it fits; a
// rank's idle time between its actions hatched and labelled "bubble"; the actions not run yet as
// outlines where the plan puts them with this run's mean action costs; the current action pulsing. Hovering an action draws the send it
// waited for (an arrow from the producing action) and the one it makes. Above: the controls (they
// restart the run), the bubble measured against the formula, and the planned grid, one slot per
// action. Below, on request, another schedule simulated with the same costs (GPipe beside 1F1B: the
// same bubble, not the same micro-batches in flight).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                                   ScheduleKind::ZBH1};
constexpr ImU32 kTrack = IM_COL32(255, 255, 255, 14);
constexpr ImU32 kIdle = IM_COL32(150, 150, 160, 150);
constexpr ImU32 kGhost = IM_COL32(170, 172, 182, 150);
constexpr ImU32 kArrow = IM_COL32(255, 255, 255, 240);

// One action box drawn this frame, for hovering and the send arrows.
struct Box {
  int rank = 0, index = 0;  // pipeline rank; position in its row's actions
  Action action;
  float x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  double begin = 0, end = 0;  // seconds from the iteration's start
  bool done = false;
  int64_t bytes = 0;
};

// A simulated (or measured) timetable: [rank][k] begin, end, relative to the iteration's start.
struct Timed {
  Action action;
  double begin = 0, end = 0;
};

const char* type_name(ActionType t) {
  switch (t) {
    case ActionType::Forward: return "forward";
    case ActionType::Backward: return "backward";
    case ActionType::BackwardInput: return "input gradient (I)";
    case ActionType::BackwardWeight: return "weight gradient (W)";
    default: return "communication";
  }
}

// "F3" (one stage per rank) or "1F3" (several: the stage tells them apart).
std::string short_label(const Action& a, int v) {
  const std::string s = action_str(a);
  return v > 1 ? s : s.substr(std::to_string(a.stage).size());
}

std::string percent(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

// One stage's micro-batch in one direction: F with F, B with B or I (the action that sends a gradient).
bool same_direction(const Action& a, const Action& b) {
  const auto is_b = [](ActionType t) { return t == ActionType::Backward || t == ActionType::BackwardInput; };
  return a.mb == b.mb && a.stage == b.stage && ((a.type == ActionType::Forward && b.type == ActionType::Forward) ||
                                                (is_b(a.type) && is_b(b.type)));
}
// The actions this one waits for across the pipeline (its input) and that wait for it (its output).
std::optional<Action> producer_of(const Action& a, int stages) {
  if (a.type == ActionType::Forward && a.stage > 0) return Action{a.stage - 1, a.type, a.mb};
  if ((a.type == ActionType::Backward || a.type == ActionType::BackwardInput) && a.stage + 1 < stages)
    return Action{a.stage + 1, a.type, a.mb};
  return std::nullopt;
}
std::optional<Action> consumer_of(const Action& a, int stages) {
  if (a.type == ActionType::Forward && a.stage + 1 < stages) return Action{a.stage + 1, a.type, a.mb};
  if ((a.type == ActionType::Backward || a.type == ActionType::BackwardInput) && a.stage > 0)
    return Action{a.stage - 1, a.type, a.mb};
  return std::nullopt;
}
const Box* find_box(const std::vector<Box>& boxes, const Action& a) {
  for (const Box& b : boxes)
    if (same_direction(b.action, a)) return &b;
  return nullptr;
}

// Places the next item on this line when `w` more pixels fit, else on the next.
void arrow(ImDrawList* dl, ImVec2 a, ImVec2 b, float fs) {
  dl->AddLine(a, b, kArrow, std::max(1.5f, fs * 0.1f));
  const float len = std::max(1.0f, std::hypot(b.x - a.x, b.y - a.y));
  const ImVec2 d((b.x - a.x) / len, (b.y - a.y) / len), n(-d.y, d.x);
  const float h = fs * 0.45f;
  dl->AddTriangleFilled(b, ImVec2(b.x - d.x * h + n.x * h * 0.5f, b.y - d.y * h + n.y * h * 0.5f),
                        ImVec2(b.x - d.x * h - n.x * h * 0.5f, b.y - d.y * h - n.y * h * 0.5f), kArrow);
}

// A time ruler under [x0, x1] for [0, T] seconds, 1-2-5 steps about seven font sizes apart.
void ruler(ImDrawList* dl, float x0, float x1, float y, double T, float fs) {
  const double raw = T * 7.0 * fs / std::max(1.0f, x1 - x0);
  const double p10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = (raw / p10 <= 1 ? 1 : raw / p10 <= 2 ? 2 : raw / p10 <= 5 ? 5 : 10) * p10;
  const ImU32 line = ImGui::GetColorU32(ImGuiCol_Text, 0.45f), text = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  dl->AddLine(ImVec2(x0, y), ImVec2(x1, y), line);
  for (int k = 0; k * step <= T * 1.0001 && k < 200; k++) {
    const float x = x0 + static_cast<float>(k * step / T) * (x1 - x0);
    dl->AddLine(ImVec2(x, y), ImVec2(x, y + fs * 0.3f), line);
    const std::string t = time_text(k * step);
    const float w = ImGui::CalcTextSize(t.c_str()).x;
    if (x + w * 0.5f <= x1 + fs) dl->AddText(ImVec2(x - (k ? w * 0.5f : 0), y + fs * 0.3f), text, t.c_str());
  }
}

// The simulated timetable of a schedule, per rank; cached (simulate() validates the whole grid).
struct SimulatedRows {
  std::string key;  // the schedule and costs it was simulated for
  std::vector<std::vector<Timed>> rows;
};

const std::vector<std::vector<Timed>>& simulated(SimulatedRows& e, const PipelineSchedule& s, const ActionCosts& c) {
  char key[160];
  std::snprintf(key, sizeof key, "%s %d %d %d %.9g %.9g %.9g %.9g", s.name.c_str(), s.ranks, s.microbatches, s.chunks,
                c.forward, c.backward, c.backward_input, c.backward_weight);
  if (e.key != key) {
    e.key = key;
    e.rows.clear();
    for (const auto& row : simulate(s, c).ranks) {
      e.rows.emplace_back();
      for (const TimedAction& t : row) e.rows.back().push_back({t.action, t.start, t.end});
    }
  }
  return e.rows;
}

struct Geometry {
  float fs = 16, label_w = 0, right_w = 0, x0 = 0, x1 = 0, row_h = 0;
  double T = 1;  // seconds across [x0, x1]
  float x(double t) const { return x0 + static_cast<float>(std::clamp(t / T, -0.01, 1.01)) * (x1 - x0); }
};

// One action block: filled when it ran, an outline where the plan puts it otherwise.
void draw_block(ImDrawList* dl, const Box& b, int m, int v) {
  const ImU32 fill = pipeline_action_color(b.action.type, b.action.mb, m);
  const ImVec2 a(b.x0, b.y0), c(std::max(b.x1, b.x0 + 1.0f), b.y1);
  if (b.done) {
    dl->AddRectFilled(a, c, fill);
    if (c.x - a.x > 4) dl->AddRect(a, c, IM_COL32(0, 0, 0, 120));
  } else {
    dl->AddRectFilled(a, c, with_alpha(fill, 0.16f));
    dl->AddRect(a, c, kGhost);
  }
  const std::string t = short_label(b.action, v);
  const ImVec2 ts = ImGui::CalcTextSize(t.c_str());
  if (c.x - a.x >= ts.x + 4)
    dl->AddText(ImVec2(0.5f * (a.x + c.x - ts.x), 0.5f * (a.y + c.y - ts.y)), b.done ? ink_on(fill) : kGhost, t.c_str());
}

// Idle time [t0, t1] on a row: hatched, labelled when it fits.
void draw_bubble(ImDrawList* dl, const Geometry& g, double t0, double t1, float y0, float y1) {
  const float a = g.x(t0), b = g.x(t1);
  if (b - a < 2) return;
  draw_hatch(dl, ImVec2(a, y0 + 2), ImVec2(b, y1 - 2), kIdle, 6.0f);
  const ImVec2 ts = ImGui::CalcTextSize("bubble");
  if (b - a >= ts.x + 6) {
    const ImVec2 p(0.5f * (a + b - ts.x), 0.5f * (y0 + y1 - ts.y));
    dl->AddRectFilled(ImVec2(p.x - 2, p.y), ImVec2(p.x + ts.x + 2, p.y + ts.y), IM_COL32(30, 30, 36, 230));
    dl->AddText(p, IM_COL32(200, 200, 210, 255), "bubble");
  }
}

// A row's color: its world rank's, as the timeline and the memory view color that rank.
ImU32 row_color(const PipelineView& pv, int r) {
  const int rank = r < static_cast<int>(pv.rows.size()) ? pv.rows[static_cast<size_t>(r)].rank : r;
  return rank_color(rank, std::max(static_cast<int>(pv.ranks.size()), pv.p));
}

// The world ranks of pipeline rank r's row: "rank 1", "ranks 2, 3".
const char* row_ranks(const PipelineView& pv, int r) {
  return r >= 0 && r < static_cast<int>(pv.rows.size()) ? pv.rows[static_cast<size_t>(r)].ranks.c_str() : "rank ?";
}

// `simulated`: a box of the comparison, which never ran.
void action_tooltip(const PipelineView& pv, const Box& b, const Box* from, const Box* to, double idle_before, bool simulated) {
  ImGui::BeginTooltip();
  ImGui::Text("%s   %s of micro-batch %d, stage %d on %s", action_str(b.action).c_str(), type_name(b.action.type),
              b.action.mb, b.action.stage, row_ranks(pv, b.rank));
  ImGui::Text("%s %s -> %s (%s)", simulated ? "simulated" : b.done ? "ran" : "planned", time_text(b.begin).c_str(), time_text(b.end).c_str(),
              time_text(b.end - b.begin).c_str());
  if (from)
    ImGui::Text("input: %s from %s (%s, %s %s)", from->done && !simulated ? human_bytes(from->bytes).c_str() : "a tensor", row_ranks(pv, from->rank),
                action_str(from->action).c_str(), from->done && !simulated ? "ended" : "planned to end", time_text(from->end).c_str());
  else if (b.action.type == ActionType::Forward) ImGui::TextUnformatted("input: the micro-batch's rows (stage 0)");
  else if (b.action.type != ActionType::BackwardWeight) ImGui::TextUnformatted("input: the loss gradient (last stage)");
  if (to) ImGui::Text("sends: %s to %s for %s", b.done && !simulated ? human_bytes(b.bytes).c_str() : "its output", row_ranks(pv, to->rank), action_str(to->action).c_str());
  if (pv.tp > 1) ImGui::TextDisabled("each rank of a tp group sends to and receives from the rank of its tp index");
  if (b.done && !simulated && idle_before > 0) ImGui::Text("idle before it: %s (bubble)", time_text(idle_before).c_str());
  if (b.action.type == ActionType::BackwardWeight) ImGui::TextDisabled("W needs no message: the weight gradient stays here");
  ImGui::EndTooltip();
}

void draw_legend(const PipelineView& pv) {
  const float fs = ImGui::GetFontSize();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  auto swatch = [&](ImU32 fill, ImU32 line, bool hatch, const char* text) {
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const ImVec2 a(p.x, p.y + 0.15f * fs), b(p.x + 1.4f * fs, p.y + 0.95f * fs);
    if (fill) dl->AddRectFilled(a, b, fill);
    if (hatch) draw_hatch(dl, a, b, kIdle, 5.0f);
    if (line) dl->AddRect(a, b, line, 0, 0, 1.5f);
    ImGui::Dummy(ImVec2(1.5f * fs, fs));
    ImGui::SameLine(0, 0.25f * fs);
    ImGui::TextDisabled("%s", text);
    flow(ImGui::CalcTextSize("micro-batch 0 -> 7 ").x + 2 * fs);
  };
  const bool zb = pv.kind == ScheduleKind::ZBH1;
  swatch(pipeline_action_color(ActionType::Forward, 0, pv.m), 0, false, "F forward");
  if (zb) {
    swatch(pipeline_action_color(ActionType::BackwardInput, 0, pv.m), 0, false, "I input grad");
    swatch(pipeline_action_color(ActionType::BackwardWeight, 0, pv.m), 0, false, "W weight grad");
  } else {
    swatch(pipeline_action_color(ActionType::Backward, 0, pv.m), 0, false, "B backward");
  }
  char mbs[48];
  std::snprintf(mbs, sizeof mbs, "micro-batch 0 -> %d", pv.m - 1);
  const ImVec2 p = ImGui::GetCursorScreenPos();
  for (int k = 0; k < 4; k++)
    dl->AddRectFilled(ImVec2(p.x + k * 0.35f * fs, p.y + 0.15f * fs), ImVec2(p.x + (k + 1) * 0.35f * fs, p.y + 0.95f * fs),
                      pipeline_action_color(ActionType::Forward, k * (pv.m - 1) / 3, pv.m));
  ImGui::Dummy(ImVec2(1.5f * fs, fs));
  ImGui::SameLine(0, 0.25f * fs);
  ImGui::TextDisabled("%s", mbs);
  flow(6 * fs);
  swatch(0, 0, true, "bubble (idle)");
  swatch(0, kGhost, false, "not run yet (plan)");
  swatch(0, IM_COL32_WHITE, false, "current");
  ImGui::NewLine();
}

// The planned grid: one slot per action per time step, done ones colored, the current one outlined.
float draw_plan(const PipelineView& pv, float x0, float width, float pulse) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const int steps = num_steps(pv.plan);
  const float cw = std::min(fs * 1.8f, width / static_cast<float>(std::max(1, steps))), ch = fs * 0.95f;
  const ImVec2 o = ImGui::GetCursorScreenPos();
  for (int r = 0; r < pv.p; r++) {
    const PipelineRankView& rv = pv.row(r);
    const float y = o.y + static_cast<float>(r) * (ch + 1);
    dl->AddText(ImGui::GetFont(), fs * 0.8f, ImVec2(o.x, y), row_color(pv, r), pv.rows[static_cast<size_t>(r)].label.c_str());
    int k = 0;
    const auto& row = pv.plan.order[static_cast<size_t>(r)];
    for (size_t t = 0; t < row.size(); t++) {
      const ImVec2 a(x0 + static_cast<float>(t) * cw, y), b(a.x + cw - 1, y + ch);
      if (!row[t]) {
        dl->AddRectFilled(a, b, kTrack);
        continue;
      }
      const ImU32 fill = pipeline_action_color(row[t]->type, row[t]->mb, pv.m);
      const bool done = k < rv.next, current = k == rv.next && !pv.complete;
      dl->AddRectFilled(a, b, done ? fill : with_alpha(fill, 0.22f));
      if (current) dl->AddRect(a, b, with_alpha(IM_COL32_WHITE, pulse), 0, 0, 2.0f);
      const std::string t_lab = short_label(*row[t], pv.v);
      if (cw >= ImGui::CalcTextSize(t_lab.c_str()).x * 0.8f + 2)
        dl->AddText(ImGui::GetFont(), fs * 0.75f, ImVec2(a.x + 1, y + 0.1f * fs), done ? ink_on(fill) : kGhost, t_lab.c_str());
      k++;
    }
  }
  const float h = static_cast<float>(pv.p) * (ch + 1);
  ImGui::Dummy(ImVec2(width, h));
  return h;
}

// Rows of one timetable (measured + planned, or simulated), returning the boxes drawn.
struct RowSet {
  std::vector<std::vector<Box>> rows;  // [rank]
  std::vector<double> makespan_end;    // [rank]: where its trailing bubble ends (0: none)
};

void draw_rows(const PipelineView& pv, const RowSet& set, const Geometry& g, float y, int v, const std::vector<std::string>& right,
               const std::vector<int>& current, float pulse, bool interactive) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const int m = pv.m;
  for (size_t r = 0; r < set.rows.size(); r++) {
    const float y0 = y + static_cast<float>(r) * g.row_h, y1 = y0 + g.row_h - 3;
    const ImU32 color = row_color(pv, static_cast<int>(r));
    // A compared schedule may place other stages on the rank: its rows are named by their ranks only.
    const char* lab = r >= pv.rows.size() ? "" : interactive ? pv.rows[r].label.c_str() : pv.rows[r].ranks.c_str();
    dl->AddRectFilled(ImVec2(g.x0 - g.label_w, y0 + 0.2f * g.row_h), ImVec2(g.x0 - g.label_w + 0.25f * g.fs, y1 - 0.2f * g.row_h),
                      color);
    dl->AddText(ImVec2(g.x0 - g.label_w + 0.45f * g.fs, 0.5f * (y0 + y1) - 0.5f * g.fs), color, lab);
    dl->AddRectFilled(ImVec2(g.x0, y0), ImVec2(g.x1, y1), kTrack);
    // Idle: from the iteration's start to the first action, between actions that ran, and after
    // the last one to the makespan's end.
    double at = 0;
    for (const Box& b : set.rows[r]) {
      if (!b.done) break;
      draw_bubble(dl, g, at, b.begin, y0, y1);
      at = b.end;
    }
    if (set.makespan_end[r] > at) draw_bubble(dl, g, at, set.makespan_end[r], y0, y1);
    for (const Box& b : set.rows[r]) draw_block(dl, b, m, v);
    if (interactive && r < current.size() && current[r] >= 0 && current[r] < static_cast<int>(set.rows[r].size())) {
      const Box& c = set.rows[r][static_cast<size_t>(current[r])];
      dl->AddRect(ImVec2(c.x0 - 2, c.y0 - 2), ImVec2(std::max(c.x1, c.x0 + 1) + 2, c.y1 + 2), with_alpha(IM_COL32_WHITE, pulse), 0, 0, 2.5f);
    }
    if (r < right.size())
      dl->AddText(ImVec2(g.x1 + 0.6f * g.fs, 0.5f * (y0 + y1) - 0.5f * g.fs), ImGui::GetColorU32(ImGuiCol_Text), right[r].c_str());
  }
}

// Boxes of a timetable: `timed` [rank] all actions in order (measured ones first), `done` how many ran.
RowSet layout_rows(const std::vector<std::vector<Timed>>& timed, const std::vector<int>& done,
                   const std::vector<std::vector<int64_t>>& bytes, const Geometry& g, float y, bool complete) {
  RowSet set;
  double end = 0;
  for (const auto& row : timed)
    for (const Timed& t : row) end = std::max(end, t.end);
  for (size_t r = 0; r < timed.size(); r++) {
    const float y0 = y + static_cast<float>(r) * g.row_h, y1 = y0 + g.row_h - 3;
    set.rows.emplace_back();
    for (size_t k = 0; k < timed[r].size(); k++) {
      const Timed& t = timed[r][k];
      Box b{static_cast<int>(r), static_cast<int>(k), t.action, g.x(t.begin), g.x(t.end), y0 + 2, y1 - 2, t.begin, t.end,
            static_cast<int>(k) < done[r], r < bytes.size() && k < bytes[r].size() ? bytes[r][k] : 0};
      set.rows.back().push_back(b);
    }
    set.makespan_end.push_back(complete ? end : 0);
  }
  return set;
}

void hover_rows(const PipelineView& pv, const RowSet& set, int stages, bool simulated) {
  if (!ImGui::IsWindowHovered()) return;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  std::vector<Box> all;
  for (const auto& row : set.rows) all.insert(all.end(), row.begin(), row.end());
  for (const auto& row : set.rows)
    for (size_t k = 0; k < row.size(); k++) {
      const Box& b = row[k];
      if (mouse.x < b.x0 - 1 || mouse.x > std::max(b.x1, b.x0 + 2) + 1 || mouse.y < b.y0 || mouse.y > b.y1) continue;
      const auto pa = producer_of(b.action, stages), ca = consumer_of(b.action, stages);
      const Box* from = pa ? find_box(all, *pa) : nullptr;
      const Box* to = ca ? find_box(all, *ca) : nullptr;
      ImDrawList* dl = ImGui::GetWindowDrawList();
      const float fs = ImGui::GetFontSize();
      dl->AddRect(ImVec2(b.x0 - 1, b.y0 - 1), ImVec2(b.x1 + 1, b.y1 + 1), kArrow, 0, 0, 2.0f);
      if (from && from->rank != b.rank) arrow(dl, ImVec2(from->x1, 0.5f * (from->y0 + from->y1)), ImVec2(b.x0, 0.5f * (b.y0 + b.y1)), fs);
      if (to && to->rank != b.rank) arrow(dl, ImVec2(b.x1, 0.5f * (b.y0 + b.y1)), ImVec2(to->x0, 0.5f * (to->y0 + to->y1)), fs);
      const double idle = k > 0 && row[k - 1].done ? b.begin - row[k - 1].end : b.begin;
      action_tooltip(pv, b, from, to, idle, simulated);
      return;
    }
}

}  // namespace

// The pipeline view's state between frames: the simulated timetables of the shown schedule and of
// the compared one, the controls' edit and the run it began from, the compared schedule.
struct PipelineViewState::Impl {
  SimulatedRows shown, compared;
  PipelineRequest edit, seen;
  PipelineSchedule other_plan;
};
PipelineViewState::PipelineViewState() : impl(std::make_unique<Impl>()) {}
PipelineViewState::~PipelineViewState() = default;

namespace {

void draw_header(const PipelineView& pv, ViewContext& ctx, PipelineViewState::Impl& st) {
  const PipelineSchedule& s = pv.plan;
  // Wrapped at the window's edge: a tile of all views at 1280 x 720 cut these lines.
  ImGui::PushTextWrapPos(0.0f);
  ImGui::Text("%s: %d stages on %d ranks%s%s, %d micro-batches", s.name.c_str(), s.stages, pv.p,
              pv.v > 1 ? (" (" + std::to_string(pv.v) + " per rank)").c_str() : "",
              pv.tp > 1 ? (", each a tp group of " + std::to_string(pv.tp) + " ranks").c_str() : "", pv.m);
  int done = 0, total = 0;
  for (int r = 0; r < pv.p; r++) {
    done += static_cast<int>(pv.row(r).done.size());
    for (const auto& a : pv.plan.order[static_cast<size_t>(r)]) total += a.has_value();
  }
  char status[96];
  if (pv.iteration < 0) std::snprintf(status, sizeof status, "- no action has run yet");
  else if (pv.complete) std::snprintf(status, sizeof status, "- iteration %d, finished", pv.iteration);
  else std::snprintf(status, sizeof status, "- iteration %d: %d of %d actions done", pv.iteration, done, total);
  flow(ImGui::CalcTextSize(status).x);
  ImGui::TextDisabled("%s", status);
  if (pv.dp > 1 && pv.cp > 1)
    ImGui::TextDisabled("%d replica%s x cp %d: showing replica %d's CP rank %d (%s)%s", pv.dp / pv.cp, pv.dp / pv.cp == 1 ? "" : "s", pv.cp,
                        pv.replica / pv.cp, pv.replica % pv.cp, pv.replica_ranks.c_str(),
                        pv.replica == 0 ? "; focus another rank to show its pipeline" : ", the focused rank's");
  else if (pv.dp > 1)
    ImGui::TextDisabled("%d data-parallel replicas: showing replica %d (%s)%s", pv.dp, pv.replica, pv.replica_ranks.c_str(),
                        pv.replica == 0 ? "; focus a rank of another replica to show it" : ", the focused rank's");
  ImGui::PopTextWrapPos();
  // The controls: a new schedule or size restarts the run.
  const PipelineRequest cur{pv.kind, pv.p, pv.m, pv.v, pv.unit_costs};
  if (!(cur == st.seen)) st.edit = st.seen = cur;
  if (pipeline_controls(st.edit, true) && !(st.edit == cur)) ctx.pipeline = st.edit, ctx.pipeline_restart = true;
  if (!ctx.restart_error.empty()) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextColored(ImVec4(1.0f, 0.4f, 0.4f, 1.0f), "%s", ctx.restart_error.c_str());
    ImGui::PopTextWrapPos();
  }
}

// Why the measured bubble is not the formula's, in a line ("" when they agree within 2 points):
// the formula assumes p equal stages and free sends, and a run measures its own stages' compute
// and its sends on the modeled clock.
std::string bubble_gap_reason(const PipelineView& pv, double measured) {
  if (std::fabs(measured - pv.formula.of_wall) < 0.02) return "";
  std::vector<double> busy(static_cast<size_t>(pv.p), 0.0);
  for (int r = 0; r < pv.p; r++)
    for (const PipelineActionView& a : pv.row(r).done) busy[static_cast<size_t>(r)] += a.model_end - a.model_begin;
  const auto [lo, hi] = std::minmax_element(busy.begin(), busy.end());
  std::string why = "They differ:";
  if (*lo > 0 && *hi > 1.15 * *lo) {
    char b[160];
    std::snprintf(b, sizeof b, " stage %d works %.1fx as long as stage %d (the formula assumes equal stages);",
                  static_cast<int>(hi - busy.begin()), *hi / *lo, static_cast<int>(lo - busy.begin()));
    why += b;
  }
  if (!pv.unit_costs) why += " the actions' times are this run's compute, and the sends between stages cost time the formula leaves out.";
  else why += " the sends between stages cost time on this profile (the ideal profile makes them free).";
  return why + (pv.unit_costs ? "" : " Tick 'equal costs' for the textbook's picture.");
}

// `presentation`: fewer words (the formula's terms and the wall clock's caveat are the teacher's).
void draw_bubble_line(const PipelineView& pv, bool modeled, bool presentation) {
  double sum = 0;
  int n = 0;
  for (int r = 0; r < pv.p; r++)
    if (pv.row(r).bubble >= 0) sum += pv.row(r).bubble, n++;
  ImGui::PushTextWrapPos(0.0f);
  if (n > 0)
    ImGui::Text("bubble (iteration %d, modeled): measured %s vs formula %s", pv.bubble_iteration, percent(sum / n).c_str(),
                percent(pv.formula.of_wall).c_str());
  else
    ImGui::Text("bubble: formula %s (measured once an iteration finishes)", percent(pv.formula.of_wall).c_str());
  char terms[256];
  std::snprintf(terms, sizeof terms, "= idle %s / (idle + %s)%s", pv.formula.idle_text.c_str(), pv.formula.ideal_text.c_str(),
                pv.unit_costs ? ", every action 1 ms" : ", this run's mean action times");
  // The formula's terms beside it, or in its tooltip where the window is short (the chart needs the lines).
  const bool short_window = ImGui::GetWindowHeight() < 24 * ImGui::GetTextLineHeightWithSpacing();
  if (presentation || short_window) {
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", terms);
  } else {
    flow(std::min(ImGui::CalcTextSize(terms).x, ImGui::GetFontSize() * 16));  // wraps on its own line, never one glyph wide
    ImGui::TextDisabled("%s", terms);
  }
  if (!modeled && !presentation) ImGui::TextDisabled("(wall clock: its gaps include time held at the stepper's gates; bubbles are modeled)");
  if (n > 0) {
    std::string why = bubble_gap_reason(pv, sum / n);
    // Presentation: its first reason and the way to the textbook's picture (the rest is the teacher's).
    if (presentation && why.find(';') != std::string::npos) {
      const size_t tick = why.find("Tick ");
      why = why.substr(0, why.find(';')) + "." + (tick != std::string::npos ? " " + why.substr(tick) : "");
    }
    if (!why.empty()) ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1.0f), "%s", why.c_str());
  }
  ImGui::PopTextWrapPos();
}

}  // namespace

bool pipeline_controls(PipelineRequest& r, bool one_line) {
  const float fs = ImGui::GetFontSize();
  bool done = false;
  if (one_line) ImGui::SetNextItemWidth(fs * 10.5f);
  if (ImGui::BeginCombo("schedule", schedule_kind_name(r.kind))) {
    for (ScheduleKind k : kKinds)
      if (ImGui::Selectable(schedule_kind_name(k), r.kind == k) && r.kind != k) {
        r.kind = k, done = true;
        r.chunks = k == ScheduleKind::Interleaved1F1B ? std::max(2, r.chunks) : 1;
        if (k == ScheduleKind::Interleaved1F1B && r.microbatches % r.stages) r.microbatches = std::max(1, r.microbatches / r.stages) * r.stages;
      }
    ImGui::EndCombo();
  }
  auto slider = [&](const char* label, int& value, int lo, int hi, const char* tip) {
    if (one_line) {
      flow(fs * 5.5f + ImGui::GetStyle().ItemInnerSpacing.x + ImGui::CalcTextSize(label).x);
      ImGui::SetNextItemWidth(fs * 5.5f);
    }
    ImGui::SliderInt(label, &value, lo, hi);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", tip);
    done |= ImGui::IsItemDeactivatedAfterEdit();
  };
  slider("stages p", r.stages, 2, 8, "ranks per pipeline (restarts the run)");
  slider("micro-batches m", r.microbatches, 1, 16, "micro-batches per batch (the batch is rounded to a multiple; restarts)");
  if (r.kind == ScheduleKind::Interleaved1F1B) slider("chunks v", r.chunks, 2, 4, "stages per rank (restarts the run)");
  if (one_line) flow(ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x + ImGui::CalcTextSize("equal costs").x);
  done |= ImGui::Checkbox("equal costs", &r.unit_costs);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("every F, B, I and W costs 1 ms of modeled time (--unit-costs): the schedule's shape");
  return done;
}

namespace {

// The shown iteration on the shown clock, per rank, from its first action: the finished actions as
// they ran, then the ones not run yet where the plan puts them with this run's mean costs, shifted
// so none starts before the rank's last one ended.
struct LiveRows {
  std::vector<std::vector<Timed>> timed;
  std::vector<std::vector<int64_t>> bytes;  // what each finished action sent
  std::vector<int> done;                    // finished actions per rank
  std::vector<int> current;                 // the action under way per rank; -1 once complete
};

LiveRows live_rows(const PipelineView& pv, const std::vector<std::vector<Timed>>& sim, bool modeled) {
  double t0 = 1e300;
  for (int r = 0; r < pv.p; r++)
    if (!pv.row(r).done.empty()) {
      const PipelineActionView& a = pv.row(r).done.front();
      t0 = std::min(t0, modeled ? a.model_begin : static_cast<double>(a.wall_begin_ns) * 1e-9);
    }
  LiveRows live;
  live.timed.resize(static_cast<size_t>(pv.p));
  live.bytes.resize(static_cast<size_t>(pv.p));
  live.done.resize(static_cast<size_t>(pv.p));
  live.current.assign(static_cast<size_t>(pv.p), -1);
  for (int r = 0; r < pv.p; r++) {
    const PipelineRankView& rv = pv.row(r);
    const auto& plan_row = sim[static_cast<size_t>(r)];
    auto& timed = live.timed[static_cast<size_t>(r)];
    double shift = 0;
    for (const PipelineActionView& a : rv.done) {
      const double b = (modeled ? a.model_begin : static_cast<double>(a.wall_begin_ns) * 1e-9) - t0;
      const double e = (modeled ? a.model_end : static_cast<double>(a.wall_end_ns) * 1e-9) - t0;
      timed.push_back({a.action, b, e});
      live.bytes[static_cast<size_t>(r)].push_back(a.bytes);
      const size_t k = timed.size() - 1;
      if (k < plan_row.size()) shift = std::max(0.0, e - plan_row[k].end);
    }
    for (size_t k = rv.done.size(); k < plan_row.size(); k++)
      timed.push_back({plan_row[k].action, plan_row[k].begin + shift, plan_row[k].end + shift});
    live.done[static_cast<size_t>(r)] = static_cast<int>(rv.done.size());
    if (!pv.complete) live.current[static_cast<size_t>(r)] = rv.next;
  }
  return live;
}

// The schedule to compare with (made again only when it changes), or null: none picked, or it
// cannot be made at these sizes (`error` says why).
const PipelineSchedule* compared_schedule(const PipelineView& pv, int compare, PipelineSchedule& other_plan, std::string& error) {
  if (compare < 0 || compare >= 4 || kKinds[compare] == pv.kind) return nullptr;
  const ScheduleKind k = kKinds[compare];
  try {
    if (other_plan.name != schedule_kind_name(k) || other_plan.ranks != pv.p || other_plan.microbatches != pv.m)
      other_plan = make_schedule(k, pv.p, pv.m, k == ScheduleKind::Interleaved1F1B ? std::max(2, pv.v) : 1);
    return &other_plan;
  } catch (const Error& e) {
    error = e.what();
    return nullptr;
  }
}

// The chart's title on the left, its right column's heading above that column, then the rows and the ruler.
RowSet draw_live_chart(const PipelineView& pv, const LiveRows& live, const Geometry& g, ImVec2 origin, float avail_w,
                       bool modeled, float pulse) {
  std::vector<std::string> right;
  for (int r = 0; r < pv.p; r++) {
    const PipelineRankView& rv = pv.row(r);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s / %s  %d / %d", rv.bubble >= 0 ? percent(rv.bubble).c_str() : "-",
                  percent(pv.formula.of_wall).c_str(), rv.peak_inflight, pv.formula_peak[static_cast<size_t>(r)]);
    right.push_back(buf);
  }
  ImGui::SetCursorScreenPos(ImVec2(origin.x, ImGui::GetCursorScreenPos().y));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 title = ImGui::GetCursorScreenPos();
  const std::string what = std::string(pv.complete ? "as it ran" : "as it runs") + ", " + (modeled ? "modeled" : "wall") + " clock";
  dl->AddText(title, ImGui::GetColorU32(ImGuiCol_TextDisabled), what.c_str());
  const char* column = "bubble / formula  in-flight";
  const float cx = std::max(g.x1 + 0.6f * g.fs, title.x + ImGui::CalcTextSize(what.c_str()).x + g.fs);
  dl->AddText(ImVec2(cx, title.y), ImGui::GetColorU32(ImGuiCol_TextDisabled), column);
  ImGui::Dummy(ImVec2(1, ImGui::GetTextLineHeight()));
  const ImVec2 head = ImGui::GetCursorScreenPos();
  RowSet set = layout_rows(live.timed, live.done, live.bytes, g, head.y, pv.complete);
  draw_rows(pv, set, g, head.y, pv.v, right, live.current, pulse, true);
  const float y = head.y + static_cast<float>(pv.p) * g.row_h;
  ruler(dl, g.x0, g.x1, y + 2, g.T, g.fs);
  ImGui::Dummy(ImVec2(avail_w, static_cast<float>(pv.p) * g.row_h + 1.6f * g.fs));
  return set;
}

void compare_combo(const PipelineView& pv, int& compare, float fs) {
  ImGui::SetNextItemWidth(fs * 9);
  const char* cur_name = compare >= 0 && compare < 4 ? schedule_kind_name(kKinds[compare]) : "nothing";
  if (ImGui::BeginCombo("compare with", cur_name)) {
    if (ImGui::Selectable("nothing", compare < 0)) compare = -1;
    for (int i = 0; i < 4; i++)
      if (kKinds[i] != pv.kind && ImGui::Selectable(schedule_kind_name(kKinds[i]), compare == i)) compare = i;
    ImGui::EndCombo();
  }
}

// The other schedule, simulated with this run's costs: its bubble and peaks, its rows and ruler.
void draw_comparison(const PipelineView& pv, const PipelineSchedule& other, const std::vector<std::vector<Timed>>& other_rows,
                     const Geometry& g, float avail_w, float pulse) {
  double end = 0;
  for (const auto& row : other_rows)
    for (const Timed& t : row) end = std::max(end, t.end);
  std::vector<std::string> other_right;
  std::string peaks;
  double bubble_sum = 0;
  for (int r = 0; r < pv.p; r++) {
    double busy = 0;
    for (const Timed& t : other_rows[static_cast<size_t>(r)]) busy += t.end - t.begin;
    const int peak = measured_peak_inflight(other, r);
    const double bubble = end > 0 ? (end - busy) / end : 0;
    bubble_sum += bubble;
    peaks += (r ? " " : "") + std::to_string(peak);
    other_right.push_back(percent(bubble) + "  " + std::to_string(peak));
  }
  ImGui::SameLine();
  ImGui::TextDisabled("%s simulated with this run's action costs: bubble %s, in-flight peaks %s", other.name.c_str(),
                      percent(bubble_sum / pv.p).c_str(), peaks.c_str());
  const float oy = ImGui::GetCursorScreenPos().y;
  std::vector<int> other_done(static_cast<size_t>(pv.p));
  for (int r = 0; r < pv.p; r++) other_done[static_cast<size_t>(r)] = static_cast<int>(other_rows[static_cast<size_t>(r)].size());
  const RowSet cmp = layout_rows(other_rows, other_done, {}, g, oy, true);
  draw_rows(pv, cmp, g, oy, other.chunks, other_right, {}, pulse, false);
  ruler(ImGui::GetWindowDrawList(), g.x0, g.x1, oy + static_cast<float>(pv.p) * g.row_h + 2, g.T, g.fs);
  ImGui::Dummy(ImVec2(avail_w, static_cast<float>(pv.p) * g.row_h + 1.6f * g.fs));
  hover_rows(pv, cmp, other.stages, true);
}

}  // namespace

void draw_pipeline_view(const Snapshot& s, ViewContext& ctx, PipelineViewState& state) {
  PipelineViewState::Impl& st = *state.impl;
  draw_focus_line(s);
  const PipelineView& pv = s.pipeline;
  if (!pv.valid) {
    ImGui::TextUnformatted("The pipeline view shows --strategy pipeline runs.");
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("A pipeline cuts the model into stages, one per rank, and streams micro-batches through them; "
                        "the ranks idle (the bubble) while the pipeline fills and drains. Pick pipeline in the Run panel.");
    ImGui::PopTextWrapPos();
    return;
  }
  const float fs = ImGui::GetFontSize();
  const float pulse = 0.45f + 0.55f * static_cast<float>(0.5 + 0.5 * std::sin(ctx.time * 6.0));
  draw_header(pv, ctx, st);
  draw_bubble_line(pv, ctx.modeled_clock, ctx.presentation);
  if (!ctx.presentation) draw_legend(pv);  // presentation: the blocks' own labels (F0, B3) say it

  ImGui::BeginChild("pipeline", ImVec2(0, 0), false);
  Geometry g;
  g.fs = fs;
  g.label_w = ImGui::CalcTextSize("rank 00 ").x;
  for (const PipelineRowView& row : pv.rows) g.label_w = std::max(g.label_w, ImGui::CalcTextSize((row.label + " ").c_str()).x);
  g.label_w += 0.6f * fs;
  g.right_w = ImGui::CalcTextSize("100.0% / 100.0%  16 / 16").x + 1.2f * fs;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float avail_w = std::max(ImGui::GetContentRegionAvail().x, g.label_w + g.right_w + 10 * fs);
  g.x0 = origin.x + g.label_w;
  g.x1 = origin.x + avail_w - g.right_w;
  // The plan's grid above the chart as it ran, unless the window is too short for both: then the
  // chart alone (its outlines are the plan's actions not run yet).
  const float chart_need = (static_cast<float>(pv.p) * 1.3f + 4.5f) * fs;  // rows of 1.3 lines: room to read them
  const float plan_need = static_cast<float>(pv.p + 2) * ImGui::GetTextLineHeightWithSpacing();
  if (ImGui::GetContentRegionAvail().y >= chart_need + plan_need) {
    ImGui::TextDisabled("plan: one slot per action (PyTorch's order)");
    ImGui::SetCursorScreenPos(ImVec2(origin.x, ImGui::GetCursorScreenPos().y));
    draw_plan(pv, g.x0, g.x1 - g.x0, pulse);
    ImGui::Spacing();
  }

  const bool have_time = pv.costs_measured || pv.unit_costs;
  if (!have_time) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("No action has run yet: step the run (A: one time step, I: an iteration) to see it on the clock.");
    ImGui::PopTextWrapPos();
    ImGui::EndChild();
    return;
  }
  const bool modeled = ctx.modeled_clock;
  const ActionCosts& costs = modeled ? pv.model_costs : pv.wall_costs;
  const LiveRows live = live_rows(pv, simulated(st.shown, pv.plan, costs), modeled);
  // The comparison, simulated with the same costs.
  int& compare = ctx.pipeline_compare;
  std::string compare_error;
  const PipelineSchedule* other = compared_schedule(pv, compare, st.other_plan, compare_error);
  // Its stages hold v / v' of this run's stages each: its actions cost that much more.
  ActionCosts other_costs = costs;
  if (other) {
    const double k = static_cast<double>(pv.v) / other->chunks;
    for (double* c : {&other_costs.forward, &other_costs.backward, &other_costs.backward_input, &other_costs.backward_weight}) *c *= k;
  }
  const std::vector<std::vector<Timed>>* other_rows = other ? &simulated(st.compared, *other, other_costs) : nullptr;
  g.T = 0;
  for (const std::vector<std::vector<Timed>>* rows : {&live.timed, other_rows})
    if (rows)
      for (const auto& row : *rows)
        for (const Timed& t : row) g.T = std::max(g.T, t.end);
  g.T = std::max(g.T, 1e-12);
  ctx.own_span = g.T;  // A/B: both sides on the longer one's scale
  if (ctx.shared_span > g.T) g.T = ctx.shared_span;
  // Rows as tall as the space allows (the comparison takes as much again).
  const int row_count = pv.p * (other ? 2 : 1);
  const float spare = ImGui::GetContentRegionAvail().y - 4.5f * fs - (other ? 2.5f * fs : 0);
  g.row_h = std::clamp(spare / static_cast<float>(row_count), 1.05f * fs, 2.4f * fs);
  const RowSet live_set = draw_live_chart(pv, live, g, origin, avail_w, modeled, pulse);

  // ---- compare with another schedule
  if (!ctx.presentation || compare >= 0) compare_combo(pv, compare, fs);  // presentation: the comparison when one was chosen
  if (!compare_error.empty()) ImGui::TextColored(ImVec4(1.0f, 0.4f, 0.4f, 1.0f), "%s", compare_error.c_str());
  if (other) draw_comparison(pv, *other, *other_rows, g, avail_w, pulse);
  hover_rows(pv, live_set, pv.plan.stages, false);
  ImGui::EndChild();
}

}  // namespace dtlab::app
