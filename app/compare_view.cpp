#include "app/compare_view.h"

#include <imgui.h>

#include <algorithm>

namespace dtlab::app {

void CompareState::pin(const Snapshot& s) {
  pinned.snapshot = std::make_shared<const Snapshot>(s);
  pinned.summary = summarize_run(s);
  timeline = TimelineViewState();
  memory = MemoryViewState();
  pipeline = std::make_unique<PipelineViewState>();
  scales.clear();
  b_key = UINT64_MAX;
}

void CompareState::unpin() {
  pinned = Pinned();
  scales.clear();
}

const RunSummary& CompareState::summary_b(const Snapshot& live) {
  // What summarize_run reads changes only with a new event (each rank's newest order) or report.
  uint64_t key = static_cast<uint64_t>(live.steps_reported) * 0x9E3779B97F4A7C15ull;
  for (const std::vector<Event>& evs : live.events) key = key * 1099511628211ull + (evs.empty() ? 0 : evs.back().order + 1);
  if (key != b_key) b = summarize_run(live), b_key = key;
  return b;
}

namespace {

// "A (pinned)  --bucket-cap-mb 1", the settings cut to the line with "..." (whole on hover).
void caption(const CompareState& c, const Snapshot& live, bool a) {
  const std::vector<SettingDifference> diff = setting_differences(c.pinned.snapshot->config, live.config);
  const std::string what = side_caption(diff, a);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(side_color(a)));
  ImGui::TextUnformatted(a ? "A (pinned)" : "B (live)");
  ImGui::PopStyleColor();
  ImGui::SameLine();
  const std::string shown = fit_text(what, ImGui::GetContentRegionAvail().x);
  ImGui::TextDisabled("%s", shown.c_str());
  if (ImGui::IsItemHovered() && shown != what) ImGui::SetTooltip("%s", what.c_str());
}

}  // namespace

void draw_sides(CompareState& c, const Snapshot& live, ViewContext& ctx, const char* id,
                const std::function<void(const Snapshot& s, bool a)>& draw) {
  CompareState::Scale& scale = c.scales[id];
  const float gap = ImGui::GetStyle().ItemSpacing.y;
  const float half = std::max((ImGui::GetContentRegionAvail().y - gap) * 0.5f, 4 * ImGui::GetFrameHeight());
  ctx.compare_side = 1;
  ctx.shared_span = scale.span, ctx.shared_bytes = scale.bytes;
  CompareState::Scale own[2];
  for (int side = 0; side < 2; side++) {
    const bool a = side == 0;
    ImGui::PushID(side);
    ImGui::BeginChild("##side", ImVec2(0, a ? half : 0), false, ImGuiWindowFlags_NoScrollbar | ImGuiWindowFlags_NoScrollWithMouse);
    // A thin rule in the side's color down its left edge, so a glance tells the halves apart.
    const ImVec2 p = ImGui::GetWindowPos();
    ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + 3, p.y + ImGui::GetWindowHeight()), side_color(a));
    ImGui::Indent(6);
    caption(c, live, a);
    ctx.compare_side = a ? 1 : 2;
    ctx.own_span = 0, ctx.own_bytes = 0;
    const bool restart = ctx.pipeline_restart, focus = ctx.focus_request;
    draw(a ? *c.pinned.snapshot : live, a);
    if (a) ctx.pipeline_restart = restart, ctx.focus_request = focus;  // A's controls do not act on the live run
    own[side] = {ctx.own_span, ctx.own_bytes};
    ImGui::Unindent(6);
    ImGui::EndChild();
    ImGui::PopID();
  }
  scale.span = std::max(own[0].span, own[1].span);
  scale.bytes = std::max(own[0].bytes, own[1].bytes);
  ctx.compare_side = 0;
  ctx.shared_span = ctx.shared_bytes = ctx.own_span = ctx.own_bytes = 0;
}

void draw_timeline_compared(CompareState& c, const Snapshot& live, TimelineViewState& b, ViewContext& ctx) {
  TimelineViewState& a = c.timeline;
  const bool follow_a = a.follow, follow_b = b.follow;
  const double span_a = a.t1 - a.t0;
  draw_sides(c, live, ctx, "timeline", [&](const Snapshot& s, bool is_a) { draw_timeline_view(s, is_a ? a : b, ctx); });
  // One time scale: a zoom or pan on either side gives the other the same span (each keeps its own
  // start, its own iterations); a double-click on either sends both back to following.
  if ((!follow_a && a.follow) || (!follow_b && b.follow)) {
    a.follow = b.follow = true;
  } else if (!a.follow || !b.follow) {
    const bool a_moved = (follow_a && !a.follow) || a.t1 - a.t0 != span_a;
    TimelineViewState& from = a_moved ? a : b;
    TimelineViewState& to = a_moved ? b : a;
    to.follow = from.follow = false;
    to.t1 = to.t0 + (from.t1 - from.t0);
  }
}

void draw_memory_compared(CompareState& c, const Snapshot& live, MemoryViewState& b, ViewContext& ctx) {
  draw_sides(c, live, ctx, "memory", [&](const Snapshot& s, bool a) { draw_memory_view(s, a ? c.memory : b, ctx); });
}

void draw_buckets_compared(CompareState& c, const Snapshot& live, ViewContext& ctx, bool shards) {
  draw_sides(c, live, ctx, shards ? "shards" : "buckets", [&](const Snapshot& s, bool) {
    if (shards) draw_shard_view(s, ctx);
    else draw_bucket_view(s, ctx);
  });
}

void draw_pipeline_compared(CompareState& c, const Snapshot& live, PipelineViewState& b, ViewContext& ctx) {
  const int schedule_compare = ctx.pipeline_compare;
  ctx.pipeline_compare = -1;  // a second schedule under each side would make four charts
  draw_sides(c, live, ctx, "pipeline", [&](const Snapshot& s, bool a) { draw_pipeline_view(s, ctx, a ? *c.pipeline : b); });
  ctx.pipeline_compare = schedule_compare;
}

void draw_compare_table(CompareState& c, const Snapshot& live, bool& unpin) {
  const RunSummary& a = c.pinned.summary;
  const RunSummary& b = c.summary_b(live);
  const std::vector<SettingDifference> diff = setting_differences(c.pinned.snapshot->config, live.config);
  if (ImGui::Button("Unpin A")) unpin = true;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("End the comparison: the views show the live run alone again");
  ImGui::SameLine();
  if (diff.empty()) ImGui::TextDisabled("B has A's settings: change one in the Run panel (or a script's compare ...)");
  else ImGui::TextDisabled("%zu setting%s differ%s", diff.size(), diff.size() == 1 ? "" : "s", diff.size() == 1 ? "s" : "");
  // Columns share the window's width and their values wrap: the table never runs past a narrow window.
  const ImGuiTableFlags flags = ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp;
  ImGui::PushTextWrapPos(0.0f);
  if (!diff.empty() && ImGui::BeginTable("##settings", 3, flags)) {
    ImGui::TableSetupColumn("setting");
    ImGui::TableSetupColumn("A");
    ImGui::TableSetupColumn("B");
    ImGui::TableHeadersRow();
    for (const SettingDifference& d : diff) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(d.flag.c_str());
      ImGui::TableNextColumn();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(side_color(true)), "%s", d.a.empty() ? "(off)" : d.a.c_str());
      ImGui::TableNextColumn();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(side_color(false)), "%s", d.b.empty() ? "(off)" : d.b.c_str());
    }
    ImGui::EndTable();
  }
  ImGui::Spacing();
  auto iter = [](const RunSummary& r) { return r.valid ? "iteration " + std::to_string(r.iteration) : std::string("none yet"); };
  ImGui::TextDisabled("the last iteration each finished: A's %s, B's %s", iter(a).c_str(), iter(b).c_str());
  if (ImGui::BeginTable("##differences", 4, flags)) {
    ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthStretch, 1.5f);
    ImGui::TableSetupColumn("A", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    ImGui::TableSetupColumn("B", ImGuiTableColumnFlags_WidthStretch, 1.0f);
    ImGui::TableSetupColumn("B vs A", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("+100 pts").x);
    ImGui::TableHeadersRow();
    for (const DifferenceRow& r : difference_rows(a, b)) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.what.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.a.c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(r.b.c_str());
      ImGui::TableNextColumn();
      const ImVec4 col = r.better > 0 ? ImVec4(0.45f, 0.85f, 0.45f, 1) : r.better < 0 ? ImVec4(1.0f, 0.5f, 0.45f, 1) : ImVec4(0.7f, 0.7f, 0.72f, 1);
      ImGui::TextColored(col, "%s", r.change.c_str());
    }
    ImGui::EndTable();
  }
  ImGui::PopTextWrapPos();
  if (!b.valid) ImGui::TextDisabled("B has not finished an iteration yet: step or run it (I: one iteration).");
  else {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("Each run on the modeled clock of its own profile. The slowest link: the one its collectives keep busy "
                       "longest in the iteration (the topology view's links, summed over every step).");
    ImGui::PopStyleColor();
  }
}

}  // namespace dtlab::app
