// The inspector: everything known about the pending or current collective (what it is, who has
// arrived, how far it got, what the cost model predicts and what it took), then one row per rank:
// what its two threads do and at which stepper gate each waits. A failed run's watchdog diagnosis
// comes first, in red, since it explains everything below it.
#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "app/snapshot_builder.h"  // pending_text
#include "app/views/views.h"
#include <imgui_internal.h>  // the value cells' wrap position (key)
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

const ImVec4 kRed(0.95f, 0.33f, 0.28f, 1.0f);
const ImVec4 kGreen(0.45f, 0.85f, 0.45f, 1.0f);
const ImVec4 kAmber(1.0f, 0.72f, 0.3f, 1.0f);

ImVec4 dim() { return ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled); }

// "12.5 µs", "1.250 ms", "2.000 s"
std::string duration(double s) {
  const bool micro = ImGui::GetFont()->FindGlyphNoFallback(0x00B5) != nullptr;
  char buf[48];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f %s", s * 1e6, micro ? "\u00b5s" : "us");
  else if (s < 1.0) std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

// Bandwidth with a unit that keeps three significant digits: a 12-byte bucket's all-reduce runs at
// MB/s, not "0.00 GB/s".
std::string bandwidth(double gbs) {
  char buf[32];
  if (gbs >= 1.0) std::snprintf(buf, sizeof buf, "%.2f GB/s", gbs);
  else if (gbs >= 1e-3) std::snprintf(buf, sizeof buf, "%.3g MB/s", gbs * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3g KB/s", gbs * 1e6);
  return buf;
}

const char* ordinal_suffix(int n) {
  if (n % 100 >= 11 && n % 100 <= 13) return "th";
  switch (n % 10) {
    case 1: return "st";
    case 2: return "nd";
    case 3: return "rd";
    default: return "th";
  }
}

// A two-column row of the collective table; the value is drawn by the caller.
// A dim remark after a value: on its line when it fits, else on the next (a narrow panel).
void remark(const std::string& text) {
  flow(ImGui::CalcTextSize(text.c_str()).x);
  ImGui::TextColored(dim(), "%s", text.c_str());
}

// The panel's tables: as wide as the panel, and counted as that wide. ImGui 1.86's EndTable extends
// its window's content to the columns' auto-fit width (their widest content plus cell padding), so
// a wrapped value column made the narrow panel report content wider than itself: end_table puts the
// window's extent back to the table's own right edge.
struct PanelTable {
  float max_x = 0, right = 0;
};
bool begin_table(const char* id, int columns, ImGuiTableFlags flags, PanelTable& t) {
  ImGuiWindow* w = ImGui::GetCurrentWindow();
  t.max_x = w->DC.CursorMaxPos.x;
  t.right = w->InnerRect.Max.x - w->WindowPadding.x;
  const float width = std::max(t.right - ImGui::GetCursorScreenPos().x, ImGui::GetFontSize() * 8);
  t.right = ImGui::GetCursorScreenPos().x + width;
  return ImGui::BeginTable(id, columns, flags, ImVec2(width, 0));
}
void end_table(const PanelTable& t) {
  ImGui::EndTable();
  ImGui::GetCurrentWindow()->DC.CursorMaxPos.x = std::max(t.max_x, t.right);
}

// What a value cell may fill (see key).
float value_width() { return ImGui::GetContentRegionAvail().x - 1.5f * ImGui::GetFontSize(); }

void key(const char* name) {
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  ImGui::PushTextWrapPos(-1.0f);  // the key stays whole
  ImGui::TextColored(dim(), "%s", name);
  ImGui::PopTextWrapPos();
  ImGui::TableSetColumnIndex(1);
  // The value wraps short of its column's edge: the host window takes the table's auto-fit width, its
  // columns' content plus their cell padding and borders, as its content; a value to the edge makes
  // that wider than the panel (draw_collective pushed a wrap position for the table; this sets it
  // for the row).
  ImGui::GetCurrentWindow()->DC.TextWrapPos = ImGui::GetCursorPos().x + value_width();
}

void ranks_inline(const std::vector<int>& ranks, int world, const char* none) {
  if (ranks.empty()) {
    ImGui::TextColored(dim(), "%s", none);
    return;
  }
  for (size_t i = 0; i < ranks.size(); i++) {
    if (i) ImGui::SameLine(0, ImGui::GetFontSize() * 0.45f);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(rank_color(ranks[i], world)), "%d", ranks[i]);
  }
}

void draw_error(const std::string& error) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float pad = ImGui::GetFontSize() * 0.4f;
  dl->ChannelsSplit(2);
  dl->ChannelsSetCurrent(1);
  ImGui::SetCursorPos(ImVec2(ImGui::GetCursorPosX() + pad, ImGui::GetCursorPosY() + pad));
  ImGui::BeginGroup();
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + ImGui::GetContentRegionAvail().x - pad);
  ImGui::TextColored(ImVec4(1.0f, 0.55f, 0.5f, 1.0f), "The run failed");
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.78f, 0.74f, 1.0f));
  ImGui::TextWrapped("%s", error.c_str());
  ImGui::PopStyleColor();
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
  dl->ChannelsSetCurrent(0);
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  dl->AddRectFilled(ImVec2(a.x - pad, a.y - pad), ImVec2(b.x + pad, b.y + pad), IM_COL32(110, 22, 18, 200), pad);
  dl->AddRect(ImVec2(a.x - pad, a.y - pad), ImVec2(b.x + pad, b.y + pad), ImGui::ColorConvertFloat4ToU32(kRed), pad, 0, 1.5f);
  dl->ChannelsMerge();
  ImGui::Dummy(ImVec2(0, pad));
}

// The protocol the call ran with and the tuning model's why (engine/trace/tuning.h's explain()).
void tuning_rows(const CollectiveView& cv) {
  key("protocol");
  if (cv.proto == Protocol::Default)  // NCCL_PROTO unset: the call's protocol is the tuning model's pick
    ImGui::TextColored(dim(), cv.why.empty() ? "auto (the tuning model's pick)" : "auto (the tuning model's pick, below)");
  else ImGui::TextUnformatted(protocol_name(cv.proto));
  if (cv.why.empty()) return;
  key("why");
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.60f, 0.85f, 1.0f, 1.0f));
  ImGui::TextUnformatted(cv.why.c_str());  // wrapped at the row's wrap position (key)
  ImGui::PopStyleColor();
}

// "tp0: ranks 0,1", the process group a collective ran in.
std::string group_text(const CollectiveView& cv) { return describe_group_label(group_label(cv.group_name, cv.members)); }
const ImVec4 kGroupColor(0.75f, 0.65f, 1.0f, 1.0f);

// Rank r's index in the shown collective's group (r itself for the world's); -1 outside the group.
int group_index(const CollectiveView& cv, int r) {
  if (cv.members.empty()) return r;
  const auto it = std::find(cv.members.begin(), cv.members.end(), r);
  return it == cv.members.end() ? -1 : static_cast<int>(it - cv.members.begin());
}

void draw_collective(const CollectiveView& cv) {
  const int N = cv.world;
  const bool done = cv.steps_done >= cv.steps && !cv.in_flight;
  // "reduce-scatter world #6 in flight", wrapping between its parts in a narrow panel.
  ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1.0f), "%s", collective_name(cv.op));
  char id[64];
  std::snprintf(id, sizeof id, "%s #%" PRIu64, cv.group != 0 ? cv.group_name.c_str() : "world", cv.seq);
  flow(ImGui::CalcTextSize(id).x, ImGui::GetFontSize() * 0.35f);
  ImGui::TextColored(dim(), "%s", id);
  const char* state = done ? "done" : cv.in_flight ? "in flight" : "issued, no rank started it yet";
  flow(ImGui::CalcTextSize(state).x, ImGui::GetFontSize() * 0.8f);
  ImGui::TextColored(done ? kGreen : cv.in_flight ? kAmber : dim(), "%s", state);

  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit;
  PanelTable table;
  if (!begin_table("##collective", 2, flags, table)) return;
  ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed);
  ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthStretch);
  ImGui::PushTextWrapPos(0.0f);  // in a table: each value wraps at its column's edge (a narrow panel)
  key("group");
  if (cv.group != 0) ImGui::TextColored(kGroupColor, "%s", group_text(cv).c_str());
  else ImGui::TextColored(dim(), "the world (every rank)");
  key("algorithm");
  ImGui::TextUnformatted(algorithm_name(cv.algo));
  tuning_rows(cv);
  key("dtype");
  const int elem = static_cast<int>(dtype_size(cv.dtype));
  ImGui::Text("%s (%d B per element)", dtype_name(cv.dtype), elem);
  key("reduce op");
  if (collective_traits(cv.op).reduces) ImGui::TextUnformatted(reduce_op_name(cv.reduce));
  else ImGui::TextColored(dim(), "none (data is only copied)");
  key("root");
  if (collective_traits(cv.op).has_root && cv.root >= 0 && cv.group != 0)
    ImGui::Text("rank %d of %s (rank %d)", cv.root, cv.group_name.c_str(), cv.members[static_cast<size_t>(std::min(cv.root, cv.world - 1))]);
  else if (collective_traits(cv.op).has_root && cv.root >= 0) ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(rank_color(cv.root, N)), "rank %d", cv.root);
  else ImGui::TextColored(dim(), "none (every rank is equal)");
  key("count");
  ImGui::Text("%s elements per rank", with_commas(cv.count).c_str());
  key("payload");
  ImGui::Text("%s", human_bytes(cv.bytes).c_str());
  remark("(" + with_commas(cv.bytes) + " B)");
  if (!cv.label.empty()) {
    key("carries");
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.75f, 0.65f, 1.0f, 1.0f));
    ImGui::TextUnformatted(cv.label.c_str());  // wrapped at the row's wrap position (key)
    ImGui::PopStyleColor();
  }
  key("arrived");
  if (cv.in_flight) ranks_inline(cv.arrived, N, "nobody yet");
  else ImGui::TextColored(dim(), done ? "every rank (finished)" : "nobody yet");
  if (cv.in_flight && !cv.arrived.empty()) {
    remark("(in arrival order)");
  }
  key("missing");
  if (cv.in_flight && !cv.missing.empty()) {
    ImGui::TextColored(kRed, "waiting for");
    ImGui::SameLine();
    ranks_inline(cv.missing, N, "");
  } else {
    ImGui::TextColored(dim(), "none");
  }
  key("steps");
  {
    char overlay[48];
    if (cv.steps == 0) std::snprintf(overlay, sizeof overlay, "none: one rank");
    else std::snprintf(overlay, sizeof overlay, "%d / %d done", cv.steps_done, cv.steps);
    const float frac = cv.steps > 0 ? static_cast<float>(cv.steps_done) / static_cast<float>(cv.steps) : 1.0f;
    // Short of the cell's edge, like the wrapped values (key): a bar to the edge widens the table.
    ImGui::ProgressBar(frac, ImVec2(value_width(), 0), overlay);
    if (cv.steps_done < cv.steps) {
      ImGui::TextColored(dim(), cv.phase != RingPhase::None ? "next: step %d," : "next: step %d", cv.steps_done + 1);
      if (cv.phase != RingPhase::None) {  // an all-to-all has no phases
        flow(ImGui::CalcTextSize(ring_phase_name(cv.phase)).x);
        ImGui::TextUnformatted(ring_phase_name(cv.phase));
      }
    }
  }
  key("predicted");
  if (cv.predicted_s > 0) {
    ImGui::Text("%s", duration(cv.predicted_s).c_str());
    remark("(cost model)");
    // Two models, two times, on purpose: say which is which where both show.
    if (!cv.why.empty())  // (wrapped at the row's wrap position, key)
      ImGui::TextColored(dim(), "the steps as drawn, one hop each on one channel; the tuner's time (why) "
                                "prices NCCL's channels and pipelined chunks, so it differs");
  } else {
    ImGui::TextColored(dim(), "n/a");
  }
  key("algbw");
  if (cv.algbw_gbs > 0) {
    ImGui::TextUnformatted(bandwidth(cv.algbw_gbs).c_str());
    remark("(payload / time)");
  } else {
    ImGui::TextColored(dim(), "n/a");
  }
  key("busbw");
  if (cv.busbw_gbs > 0) {
    const bool times = ImGui::GetFont()->FindGlyphNoFallback(0x00D7) != nullptr;
    const double factor = cv.algbw_gbs > 0 ? cv.busbw_gbs / cv.algbw_gbs : 0.0;
    ImGui::TextUnformatted(bandwidth(cv.busbw_gbs).c_str());
    char algbw[48];
    std::snprintf(algbw, sizeof algbw, "(algbw %s %.3g)", times ? "\u00d7" : "x", factor);
    remark(algbw);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("bus bandwidth (nccl-tests): what each link carries, comparable across ranks and ops;\n"
                        "algbw times %.3g for %s on %d ranks", factor, collective_name(cv.op), N);
  } else {
    ImGui::TextColored(dim(), "n/a");
  }
  key("measured");
  if (cv.measured_s >= 0) {
    ImGui::Text("%s", duration(cv.measured_s).c_str());
    remark("(wall clock, rank 0)");
  } else {
    ImGui::TextColored(dim(), done ? "n/a" : "when done");
  }
  ImGui::PopTextWrapPos();
  end_table(table);
}

bool gate_blocked(const StepperState& st, int rank, int lane) {
  const size_t i = static_cast<size_t>(rank * kStepperLanes + lane);
  return i < st.gates.size() && st.gates[i].blocked;
}

const char* lane_name(int lane) { return lane == kComputeLane ? "compute thread" : lane == kCommLane ? "comm worker" : "group executor"; }

// The stepper gate one rank's lane waits at, e.g. "ring step 3/6 of tp1 #12"; `compact` keeps just
// the kind and step, and says nothing for a lane at no gate. The tooltip has the gate's whole label.
// One line per cell, clipped by its column; the whole text in a tooltip.
// `text` cut to the cell's width with "..." (whole on hover): a long activity neither widens the panel
// nor runs past its edge.
void clipped(const std::string& text) {
  const std::string shown = fit_text(text, ImGui::GetContentRegionAvail().x);
  ImGui::TextUnformatted(shown.c_str());
  if (shown != text && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", text.c_str());
}

void gate_cell(const StepperState& st, int rank, int lane, bool running, bool compact = false) {
  const size_t i = static_cast<size_t>(rank * kStepperLanes + lane);
  if (i >= st.gates.size() || !st.gates[i].blocked) {
    if (compact) return;
    ImGui::PushStyleColor(ImGuiCol_Text, dim());
    clipped(i >= st.gates.size() || !running ? "-" : st.paused ? "not at a gate" : "running");
    ImGui::PopStyleColor();
    return;
  }
  const GateInfo& g = st.gates[i].gate;
  std::string text;
  switch (g.kind) {
    case GateKind::RingStep: text = "ring step " + std::to_string(g.step + 1); break;
    case GateKind::Iteration: text = "iteration " + std::to_string(g.iteration); break;
    default: text = g.label; break;
  }
  // Cut to the cell with "..." (whole on hover).
  ImGui::PushStyleColor(ImGuiCol_Text, kAmber);
  clipped(text);
  ImGui::PopStyleColor();
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("rank %d's %s waits at a %s gate: %s\nuntil a step or run command opens it", rank, lane_name(lane),
                      gate_kind_name(g.kind), g.label.c_str());
}

void rank_cell(int r, int world) {
  const float fs = ImGui::GetFontSize(), sw = fs * 0.7f;
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + (fs - sw) * 0.5f), ImVec2(p.x + sw, p.y + (fs + sw) * 0.5f),
                                            rank_color(r, world), sw * 0.25f);
  ImGui::Dummy(ImVec2(sw, fs));
  ImGui::SameLine(0, fs * 0.3f);
  ImGui::Text("%d", r);
}

// Whether the rank reached the collective: "arrived 2nd", "missing", or "finished".
void arrival_cell(const CollectiveView& cv, int r) {
  if (cv.valid && group_index(cv, r) < 0) {
    ImGui::TextColored(dim(), "not in %s", cv.group_name.c_str());
  } else if (cv.valid && cv.in_flight) {
    const auto a = std::find(cv.arrived.begin(), cv.arrived.end(), r);
    if (a != cv.arrived.end()) {
      const int n = static_cast<int>(a - cv.arrived.begin()) + 1;
      ImGui::TextColored(kGreen, "arrived %d%s", n, ordinal_suffix(n));
    } else if (std::find(cv.missing.begin(), cv.missing.end(), r) != cv.missing.end()) {
      ImGui::TextColored(kRed, "missing");
    } else {
      ImGui::TextColored(dim(), "-");
    }
  } else {
    ImGui::TextColored(dim(), cv.valid && cv.steps_done >= cv.steps ? "finished" : "-");
  }
}

void steps_cell(const CollectiveView& cv, int r) {
  const int g = group_index(cv, r);
  const size_t ur = static_cast<size_t>(g);
  if (cv.valid && g >= 0 && ur < cv.rank_steps_done.size()) {
    const int d = cv.rank_steps_done[ur];
    if (d >= cv.steps) ImGui::TextColored(kGreen, "%d/%d", d, cv.steps);
    else ImGui::Text("%d/%d", d, cv.steps);
  } else {
    ImGui::TextColored(dim(), "-");
  }
}

// Both layouts open a rank's row alike: its chip, then whether it reached the collective.
void begin_rank_row(const CollectiveView& cv, int r, int world) {
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  rank_cell(r, world);
  ImGui::TableSetColumnIndex(1);
  arrival_cell(cv, r);
}

// What a rank's thread does now (its activity list), or "-" when it reported nothing.
std::string activity_of(const std::vector<std::string>& activity, int r) {
  const size_t ur = static_cast<size_t>(r);
  return ur < activity.size() ? activity[ur] : "-";
}

void draw_ranks(const Snapshot& s, const CollectiveView& cv) {
  const int N = std::max({1, s.config.world, static_cast<int>(s.stepper.gates.size() / kStepperLanes), static_cast<int>(s.comm_activity.size())});
  const StepperState& st = s.stepper;
  ImGui::TextColored(dim(), "stepper:");
  ImGui::SameLine();
  if (st.paused) {
    ImGui::TextColored(kAmber, "paused");
    ImGui::SameLine();
    ImGui::PushTextWrapPos(0.0f);
    if (st.pending.valid) ImGui::TextColored(dim(), "before %s", pending_text(st.pending).c_str());
    else ImGui::TextColored(dim(), "%s", st.waiting.empty() ? "(settling)" : st.waiting.c_str());
    ImGui::PopTextWrapPos();
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("The next step releases this item: an operation once all its members are at its gate, a ring\n"
                        "step, a layer, a gradient, a pipeline action or an iteration, in one global order\n"
                        "(engine/trace/stepper.h). Until every rank has reached a gate, it says whom it waits for.");
  } else if (s.running) {
    if (st.speed > 0) ImGui::TextColored(kGreen, "running at %.3g modeled s per second", st.speed);
    else ImGui::TextColored(kGreen, "running");
  } else {
    ImGui::TextColored(dim(), s.finished ? "finished" : "stopped");
  }
  if (s.iteration >= 0) {
    char it[96];
    std::snprintf(it, sizeof it, "iteration %d, step %" PRId64 " of %" PRId64, s.iteration, s.step, s.total_steps);
    flow(ImGui::CalcTextSize(it).x, ImGui::GetFontSize() * 0.8f);
    ImGui::TextColored(dim(), "%s", it);
  }

  const float fs = ImGui::GetFontSize();
  const bool wide = ImGui::GetContentRegionAvail().x >= fs * 36;
  ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_BordersOuterH;
  if (wide) {
    // One line per rank; fixed columns fit their contents, the activities take the rest.
    PanelTable table;
    if (!begin_table("##ranks", 7, flags | ImGuiTableFlags_Resizable, table)) return;
    ImGui::TableSetupColumn("rank", ImGuiTableColumnFlags_WidthFixed);
    ImGui::TableSetupColumn("collective", ImGuiTableColumnFlags_WidthFixed);
    ImGui::TableSetupColumn("steps", ImGuiTableColumnFlags_WidthFixed);
    ImGui::TableSetupColumn("compute thread", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    ImGui::TableSetupColumn("comm worker", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    // (The gates stretch too, their labels cut to the cell: fitted to their text, "world #0 allgather of
    // 2 int64 (ring)" pushed the last column past a 1280 x 720 panel's edge.)
    ImGui::TableSetupColumn("compute gate", ImGuiTableColumnFlags_WidthStretch, 0.8f);
    ImGui::TableSetupColumn("comm gate", ImGuiTableColumnFlags_WidthStretch, 0.8f);
    ImGui::TableHeadersRow();
    for (int r = 0; r < N; r++) {
      begin_rank_row(cv, r, N);
      ImGui::TableSetColumnIndex(2);
      steps_cell(cv, r);
      ImGui::TableSetColumnIndex(3);
      clipped(activity_of(s.compute_activity, r));
      ImGui::TableSetColumnIndex(4);
      clipped(activity_of(s.comm_activity, r));
      ImGui::TableSetColumnIndex(5);
      gate_cell(st, r, kComputeLane, s.running);
      ImGui::TableSetColumnIndex(6);
      gate_cell(st, r, gate_blocked(st, r, kGroupLane) ? kGroupLane : kCommLane, s.running);
    }
    end_table(table);
    return;
  }
  // Narrow panel: a rank per row, its state on the first line and what its threads do below.
  PanelTable table;
  if (!begin_table("##ranks_narrow", 2, flags, table)) return;
  ImGui::TableSetupColumn("rank", ImGuiTableColumnFlags_WidthFixed);
  ImGui::TableSetupColumn("state, gate, threads", ImGuiTableColumnFlags_WidthStretch);
  ImGui::TableHeadersRow();
  for (int r = 0; r < N; r++) {
    begin_rank_row(cv, r, N);
    ImGui::SameLine(0, fs * 0.6f);
    steps_cell(cv, r);
    for (int lane : {kGroupLane, kCommLane, kComputeLane}) {
      if (!gate_blocked(st, r, lane)) continue;  // each gate on a line of its own: a narrow panel
      if (lane == kComputeLane) {
        ImGui::TextColored(dim(), "compute:");
        ImGui::SameLine(0, fs * 0.25f);
      }
      gate_cell(st, r, lane, s.running, true);
    }
    ImGui::PushStyleColor(ImGuiCol_Text, dim());
    clipped("compute: " + activity_of(s.compute_activity, r));
    clipped("comm: " + activity_of(s.comm_activity, r));
    ImGui::PopStyleColor();
  }
  end_table(table);
}

}  // namespace

void draw_inspector_view(const Snapshot& s, ViewContext& ctx) {
  if (!s.error.empty()) draw_error(s.error);
  draw_focus_line(s);
  // What the stepper holds when it is not a collective (a send/recv, a layer, a gradient, an action
  // or an iteration): the Collective panel below then shows the last collective.
  const PendingItem& h = s.held;
  if (h.valid && !(h.kind == GateKind::Collective && !h.gate.op.p2p && !h.gate.op2.p2p) && h.kind != GateKind::RingStep) {
    ImGui::TextColored(kAmber, "paused before");
    ImGui::SameLine();
    ImGui::TextWrapped("%s", pending_text(h).c_str());
    ImGui::Separator();
  }
  const CollectiveView& cv = s.collective;
  if (cv.valid) {
    draw_collective(cv);
  } else {
    ImGui::TextColored(dim(), "No collective yet: press C (next collective) or Space (run).");
  }
  ImGui::Spacing();
  ImGui::Separator();
  draw_ranks(s, cv);
}

}  // namespace dtlab::app
