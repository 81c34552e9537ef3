// Memory view: what each rank holds right now, as one stacked bar per rank (parameters, gradients,
// optimizer state, activations, communication buffers, other), with the peak of the current
// iteration marked. Every bar shares one scale (the largest peak over ranks), so sharding strategies
// that cut a rank's footprint read as shorter bars at a glance.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

constexpr ImU32 kTrackColor = IM_COL32(255, 255, 255, 18);
constexpr ImU32 kPeakFill = IM_COL32(255, 255, 255, 30);
constexpr ImU32 kPeakLine = IM_COL32(255, 255, 255, 235);
constexpr ImU32 kGridColor = IM_COL32(255, 255, 255, 28);
constexpr ImU32 kSegmentText = IM_COL32(16, 18, 22, 235);  // dark text on the light category colors

MemCategory category_at(int i) { return static_cast<MemCategory>(i); }

std::string category_label(MemCategory c) { return std::string(mem_category_name(c)); }

// A round step for the byte axis: 1, 2 or 5 times a power of ten of the unit (B, KiB, MiB, GiB)
// that the largest value is shown in, so the tick labels read "2.0 MiB", "4.0 MiB", ...
double nice_byte_step(double max_bytes, int target_ticks) {
  double unit = 1;
  while (max_bytes / unit >= 1024 && unit < 1024.0 * 1024 * 1024) unit *= 1024;
  const double raw = std::max(max_bytes / unit / std::max(target_ticks, 1), 1e-9);
  const double pow10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / pow10;
  const double nice = m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10;
  return std::max(nice * pow10 * unit, 1.0);
}

// The legend: one swatch per category with the bytes `shown` rank holds in it, wrapping to the
// window width.
void draw_legend(const MemoryStats& st, int shown, bool hovered) {
  const float font = ImGui::GetFontSize();
  ImGui::Text("rank %d%s: %s now", shown, hovered ? "" : " (hover a bar for another rank)",
              human_bytes(st.total_current).c_str());
  const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
  for (int i = 0; i < kNumMemCategories; i++) {
    const MemCategory c = category_at(i);
    char text[96];
    std::snprintf(text, sizeof text, "%s %s", category_label(c).c_str(), human_bytes(st.current_of(c)).c_str());
    const float w = font * 1.2f + ImGui::CalcTextSize(text).x;
    if (i > 0) {
      ImGui::SameLine(0, font * 1.2f);
      if (ImGui::GetCursorScreenPos().x + w > right) ImGui::NewLine();
    }
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float sw = font * 0.8f, dy = (ImGui::GetTextLineHeight() - sw) * 0.5f;
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + dy), ImVec2(p.x + sw, p.y + dy + sw),
                                              memory_category_color(c), font * 0.15f);
    ImGui::Dummy(ImVec2(font * 1.2f, ImGui::GetTextLineHeight()));
    ImGui::SameLine(0, 0);
    if (st.current_of(c) == 0) ImGui::TextDisabled("%s", text);
    else ImGui::TextUnformatted(text);
  }
  // The peak marker's key.
  ImGui::SameLine(0, font * 1.2f);
  if (ImGui::GetCursorScreenPos().x + font * 12 > right) ImGui::NewLine();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImGui::GetWindowDrawList()->AddLine(ImVec2(p.x + font * 0.4f, p.y), ImVec2(p.x + font * 0.4f, p.y + ImGui::GetTextLineHeight()),
                                      kPeakLine, std::max(2.0f, font * 0.12f));
  ImGui::Dummy(ImVec2(font * 1.0f, ImGui::GetTextLineHeight()));
  ImGui::SameLine(0, 0);
  ImGui::Text("peak this iteration: %s", human_bytes(st.total_peak).c_str());
}

}  // namespace

void draw_memory_view(const Snapshot& s, ViewContext& /*ctx*/) {
  // The rank the legend details: the one under the mouse last frame, else rank 0.
  static int hovered_rank = -1;

  const int world = static_cast<int>(s.memory.size());
  int64_t scale_bytes = 0, sum_current = 0, sum_peak = 0;
  for (const RankMemory& m : s.memory) {
    scale_bytes = std::max({scale_bytes, m.stats.total_peak, m.stats.total_current});
    sum_current += m.stats.total_current;
    sum_peak += m.stats.total_peak;
  }
  if (world == 0 || scale_bytes <= 0) {
    ImGui::TextDisabled("No memory recorded yet: step the run to see what each rank allocates.");
    return;
  }
  if (hovered_rank >= world) hovered_rank = -1;
  const int shown = hovered_rank >= 0 ? hovered_rank : 0;

  if (s.iteration >= 0) ImGui::Text("Iteration %d", s.iteration);
  else ImGui::TextUnformatted("Before the first iteration");
  ImGui::SameLine();
  ImGui::TextDisabled("(peaks restart every iteration; all bars share one scale)");
  draw_legend(s.memory[static_cast<size_t>(shown)].stats, shown, hovered_rank >= 0);
  ImGui::Spacing();

  // ---- layout: [rank label | bar ......... | current / peak] per row, then the byte axis ----
  const float font = ImGui::GetFontSize();
  const ImGuiStyle& style = ImGui::GetStyle();
  const float label_w = ImGui::CalcTextSize("rank 00").x + font * 0.6f;
  const float numbers_w = ImGui::CalcTextSize("000.0 MiB  peak 000.0 MiB").x + font * 0.8f;
  const float axis_h = ImGui::GetTextLineHeight() + font * 0.6f;
  const float footer_h = ImGui::GetTextLineHeightWithSpacing();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = std::max(3.0f, font * 0.35f);
  const float fit_h = (avail.y - axis_h - footer_h - style.ItemSpacing.y) / static_cast<float>(world) - gap;
  const float bar_h = std::clamp(fit_h, font * 0.9f, font * 2.2f);
  const float width = std::max(avail.x, label_w + numbers_w + font * 8);
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const ImVec2 size(width, static_cast<float>(world) * (bar_h + gap) + axis_h);
  ImGui::InvisibleButton("##memory_bars", size);
  const bool canvas_hovered = ImGui::IsItemHovered();
  const ImVec2 mouse = ImGui::GetIO().MousePos;

  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float bar_x0 = origin.x + label_w;
  const float bar_x1 = origin.x + width - numbers_w;
  const float px_per_byte = (bar_x1 - bar_x0) / static_cast<float>(scale_bytes);
  const float rows_bottom = origin.y + static_cast<float>(world) * (bar_h + gap);
  auto x_of = [&](double bytes) { return bar_x0 + static_cast<float>(bytes) * px_per_byte; };

  // Grid and axis labels first, so bars draw over the grid lines.
  const double step = nice_byte_step(static_cast<double>(scale_bytes), std::max(2, static_cast<int>((bar_x1 - bar_x0) / (font * 7))));
  for (double b = 0; b <= static_cast<double>(scale_bytes) * 1.0001; b += step) {
    const float x = std::floor(x_of(b)) + 0.5f;
    dl->AddLine(ImVec2(x, origin.y), ImVec2(x, rows_bottom + font * 0.25f), kGridColor, 1.0f);
    const std::string t = human_bytes(static_cast<int64_t>(b));
    const float tw = ImGui::CalcTextSize(t.c_str()).x;
    const float tx = std::clamp(x - tw * 0.5f, origin.x, bar_x1 - tw);
    dl->AddText(ImVec2(tx, rows_bottom + font * 0.3f), ImGui::GetColorU32(ImGuiCol_TextDisabled), t.c_str());
  }

  int new_hovered = -1;
  for (int r = 0; r < world; r++) {
    const MemoryStats& st = s.memory[static_cast<size_t>(r)].stats;
    const float y0 = origin.y + static_cast<float>(r) * (bar_h + gap), y1 = y0 + bar_h;
    const bool row_hovered = canvas_hovered && mouse.y >= y0 - gap * 0.5f && mouse.y < y1 + gap * 0.5f;
    if (row_hovered) new_hovered = r;

    char label[16];
    std::snprintf(label, sizeof label, "rank %d", r);
    const float text_y = y0 + (bar_h - ImGui::GetTextLineHeight()) * 0.5f;
    dl->AddRectFilled(ImVec2(origin.x, y0 + bar_h * 0.2f), ImVec2(origin.x + font * 0.25f, y1 - bar_h * 0.2f), rank_color(r, world));
    dl->AddText(ImVec2(origin.x + font * 0.45f, text_y),
                row_hovered ? ImGui::GetColorU32(ImGuiCol_Text) : rank_color(r, world), label);

    // The track, the span up to this iteration's peak, then the categories stacked in enum order.
    const float x_peak = x_of(static_cast<double>(st.total_peak));
    const float rounding = std::min(bar_h * 0.2f, font * 0.2f);
    dl->AddRectFilled(ImVec2(bar_x0, y0), ImVec2(bar_x1, y1), kTrackColor, rounding);
    if (st.total_peak > st.total_current) dl->AddRectFilled(ImVec2(bar_x0, y0), ImVec2(x_peak, y1), kPeakFill, rounding);
    double at = 0;
    int hovered_cat = -1;
    for (int i = 0; i < kNumMemCategories; i++) {
      const int64_t b = st.current[static_cast<size_t>(i)];
      if (b <= 0) continue;
      const float xa = x_of(at), xb = std::max(x_of(at + static_cast<double>(b)), xa + 1.0f);
      dl->AddRectFilled(ImVec2(xa, y0), ImVec2(xb, y1), memory_category_color(category_at(i)));
      if (xb - xa > 3) dl->AddLine(ImVec2(xb - 0.5f, y0), ImVec2(xb - 0.5f, y1), IM_COL32(0, 0, 0, 110), 1.0f);
      // The bytes inside the segment when they fit, so the bars read without hovering.
      const std::string t = human_bytes(b);
      const ImVec2 ts = ImGui::CalcTextSize(t.c_str());
      if (xb - xa >= ts.x + font * 0.6f && bar_h >= ts.y)
        dl->AddText(ImVec2(0.5f * (xa + xb - ts.x), text_y), kSegmentText, t.c_str());
      if (row_hovered && mouse.x >= xa && mouse.x < xb) hovered_cat = i;
      at += static_cast<double>(b);
    }
    const float peak_w = std::max(2.0f, font * 0.14f);
    dl->AddLine(ImVec2(x_peak, y0 - gap * 0.45f), ImVec2(x_peak, y1 + gap * 0.45f), kPeakLine, peak_w);
    if (row_hovered) dl->AddRect(ImVec2(bar_x0 - 1, y0 - 1), ImVec2(bar_x1 + 1, y1 + 1), ImGui::GetColorU32(ImGuiCol_Text, 0.5f), rounding);

    char numbers[80];
    std::snprintf(numbers, sizeof numbers, "%s  peak %s", human_bytes(st.total_current).c_str(),
                  human_bytes(st.total_peak).c_str());
    dl->AddText(ImVec2(bar_x1 + font * 0.6f, text_y), ImGui::GetColorU32(ImGuiCol_Text), numbers);

    if (!row_hovered) continue;
    const bool on_peak = std::fabs(mouse.x - x_peak) <= std::max(4.0f, font * 0.3f);
    ImGui::BeginTooltip();
    if (on_peak) {
      ImGui::Text("rank %d: peak this iteration %s", r, human_bytes(st.total_peak).c_str());
      ImGui::TextDisabled("the most it held at one instant (not the sum of each category's peak)");
    } else if (hovered_cat >= 0) {
      const MemCategory c = category_at(hovered_cat);
      const double share = 100.0 * static_cast<double>(st.current_of(c)) / static_cast<double>(std::max<int64_t>(st.total_current, 1));
      ImGui::Text("rank %d: %s", r, category_label(c).c_str());
      ImGui::Text("now  %s (%.0f%% of %s)", human_bytes(st.current_of(c)).c_str(), share, human_bytes(st.total_current).c_str());
      ImGui::Text("peak %s this iteration", human_bytes(st.peak_of(c)).c_str());
    } else {
      ImGui::Text("rank %d: %s now, peak %s this iteration", r, human_bytes(st.total_current).c_str(),
                  human_bytes(st.total_peak).c_str());
      ImGui::TextDisabled("%lld allocations, %lld frees", static_cast<long long>(st.allocations), static_cast<long long>(st.frees));
    }
    ImGui::EndTooltip();
  }
  hovered_rank = new_hovered;

  if (world > 1)
    ImGui::Text("All %d ranks: %s now, peaks sum to %s", world, human_bytes(sum_current).c_str(), human_bytes(sum_peak).c_str());
}

}  // namespace dtlab::app
