// Memory view: what each rank holds right now, as one stacked bar per rank (parameters, gradients,
// optimizer state, activations, communication buffers, other), with the peak of the current
// iteration marked. Every bar shares one scale (the largest peak over ranks), so sharding strategies
// that cut a rank's footprint read as shorter bars at a glance. Below them, "strategies compared":
// the memory planner's per-rank bytes for the running model under NO_SHARD, ZeRO-1, SHARD_GRAD_OP
// and FULL_SHARD, beside the same at 7.5B parameters (the ZeRO paper's figure).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <iterator>
#include <string>

#include "app/views/memory_view.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/memory_plan.h"

namespace dtlab::app {

namespace {

constexpr ImU32 kTrackColor = IM_COL32(255, 255, 255, 18);
constexpr ImU32 kPeakFill = IM_COL32(255, 255, 255, 30);
constexpr ImU32 kPeakLine = IM_COL32(255, 255, 255, 235);
constexpr ImU32 kMemoryGrid = IM_COL32(255, 255, 255, 28);
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

// One legend entry: a color swatch and its text, wrapping to the next line at the window's edge.
void legend_entry(ImU32 color, const char* text, bool first, bool dim = false) {
  const float font = ImGui::GetFontSize();
  const float w = font * 1.2f + ImGui::CalcTextSize(text).x;
  if (!first) flow(w, font * 1.2f);
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float sw = font * 0.8f, dy = (ImGui::GetTextLineHeight() - sw) * 0.5f;
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + dy), ImVec2(p.x + sw, p.y + dy + sw), color, font * 0.15f);
  ImGui::Dummy(ImVec2(font * 1.2f, ImGui::GetTextLineHeight()));
  ImGui::SameLine(0, 0);
  if (dim) ImGui::TextDisabled("%s", text);
  else ImGui::TextUnformatted(text);
}

// The legend: one swatch per category with the bytes `shown` rank holds in it, wrapping to the
// window width.
// `compact` (presentation, a side of an A/B comparison, a short tile): the categories held, by name
// only (a bar's tooltip has the bytes), and no peak key (the numbers beside the bars say it).
void draw_legend(const MemoryStats& st, int shown, bool hovered, bool presentation, bool compact) {
  const float font = ImGui::GetFontSize();
  if (!compact)
    ImGui::Text("rank %d%s: %s now", shown, hovered ? "" : " (hover a bar for another rank)", human_bytes(st.total_current).c_str());
  bool first = true;
  for (int i = 0; i < kNumMemCategories; i++) {
    const MemCategory c = category_at(i);
    char text[96];
    if (compact) std::snprintf(text, sizeof text, "%s", category_label(c).c_str());
    else std::snprintf(text, sizeof text, "%s %s", category_label(c).c_str(), human_bytes(st.current_of(c)).c_str());
    if ((presentation || compact) && st.current_of(c) == 0 && st.peak_of(c) == 0) continue;  // fewer words: what is held
    legend_entry(memory_category_color(c), text, first, st.current_of(c) == 0);
    first = false;
  }
  if (compact) return;
  // The peak marker's key.
  flow(font * 1.0f + ImGui::CalcTextSize("peak this iteration: 000.0 MiB").x, font * 1.2f);
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImGui::GetWindowDrawList()->AddLine(ImVec2(p.x + font * 0.4f, p.y), ImVec2(p.x + font * 0.4f, p.y + ImGui::GetTextLineHeight()),
                                      kPeakLine, std::max(2.0f, font * 0.12f));
  ImGui::Dummy(ImVec2(font * 1.0f, ImGui::GetTextLineHeight()));
  ImGui::SameLine(0, 0);
  ImGui::Text("peak this iteration: %s", human_bytes(st.total_peak).c_str());
}

// Where the live bars go: [rank label | bar ......... | current / peak] per row, then the byte axis.
struct BarLayout {
  ImVec2 origin;
  float bar_h = 0, gap = 0;
  float bar_x0 = 0, bar_x1 = 0, px_per_byte = 0, rows_bottom = 0;
  bool compact = false;  // the peak alone beside each bar (the bar itself is what the rank holds now)
  bool numbers = true;   // false: no room beside the bars (a narrow panel); their tooltips say it
  float x_of(double bytes) const { return bar_x0 + static_cast<float>(bytes) * px_per_byte; }
};

// Grid and axis labels, drawn first so bars draw over the grid lines.
void draw_byte_grid(ImDrawList* dl, const BarLayout& lay, int64_t scale_bytes) {
  const float font = ImGui::GetFontSize();
  const double step = nice_byte_step(static_cast<double>(scale_bytes), std::max(2, static_cast<int>((lay.bar_x1 - lay.bar_x0) / (font * 7))));
  float free_from = -FLT_MAX;  // a label that would touch the one before it is left out (a narrow bar)
  for (double b = 0; b <= static_cast<double>(scale_bytes) * 1.0001; b += step) {
    const float x = std::floor(lay.x_of(b)) + 0.5f;
    dl->AddLine(ImVec2(x, lay.origin.y), ImVec2(x, lay.rows_bottom + font * 0.25f), kMemoryGrid, 1.0f);
    const std::string t = human_bytes(static_cast<int64_t>(b));
    const float tw = ImGui::CalcTextSize(t.c_str()).x;
    const float tx = std::clamp(x - tw * 0.5f, lay.origin.x, std::max(lay.origin.x, lay.bar_x1 - tw));
    if (tx < free_from) continue;
    dl->AddText(ImVec2(tx, lay.rows_bottom + font * 0.3f), ImGui::GetColorU32(ImGuiCol_TextDisabled), t.c_str());
    free_from = tx + tw + font * 0.6f;
  }
}

// A rank's bar under the mouse: its peak, the category hovered (or -1), or the whole rank.
void rank_bar_tooltip(const RankMemory& rm, int r, bool on_peak, int hovered_cat) {
  const MemoryStats& st = rm.stats;
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
    if (rm.device_total > 0)
      ImGui::TextDisabled("its GPU: %s used of %s (the driver's figure: every context and process on the device)",
                          human_bytes(rm.device_used).c_str(), human_bytes(rm.device_total).c_str());
  }
  ImGui::EndTooltip();
}

// Rank r's row: its label, its bar, its numbers, and its tooltip when hovered. True when the mouse
// is on the row.
bool draw_rank_bar(ImDrawList* dl, const Snapshot& s, int r, const BarLayout& lay, bool canvas_hovered) {
  const float font = ImGui::GetFontSize();
  const int world = static_cast<int>(s.memory.size());
  const ImVec2 mouse = ImGui::GetIO().MousePos, origin = lay.origin;
  const float bar_h = lay.bar_h, gap = lay.gap, bar_x0 = lay.bar_x0, bar_x1 = lay.bar_x1;
  const RankMemory& rm = s.memory[static_cast<size_t>(r)];
  const MemoryStats& st = rm.stats;
  const float y0 = origin.y + static_cast<float>(r) * (bar_h + gap), y1 = y0 + bar_h;
  const bool row_hovered = canvas_hovered && mouse.y >= y0 - gap * 0.5f && mouse.y < y1 + gap * 0.5f;

  char label[16];
  std::snprintf(label, sizeof label, "rank %d", r);
  const float text_y = y0 + (bar_h - ImGui::GetTextLineHeight()) * 0.5f;
  dl->AddRectFilled(ImVec2(origin.x, y0 + bar_h * 0.2f), ImVec2(origin.x + font * 0.25f, y1 - bar_h * 0.2f), rank_color(r, world));
  dl->AddText(ImVec2(origin.x + font * 0.45f, text_y),
              row_hovered ? ImGui::GetColorU32(ImGuiCol_Text) : rank_color(r, world), label);

  // The track, the span up to this iteration's peak, then the categories stacked in enum order.
  const float x_peak = lay.x_of(static_cast<double>(st.total_peak));
  const float rounding = std::min(bar_h * 0.2f, font * 0.2f);
  dl->AddRectFilled(ImVec2(bar_x0, y0), ImVec2(bar_x1, y1), kTrackColor, rounding);
  if (st.total_peak > st.total_current) dl->AddRectFilled(ImVec2(bar_x0, y0), ImVec2(x_peak, y1), kPeakFill, rounding);
  double at = 0;
  int hovered_cat = -1;
  for (int i = 0; i < kNumMemCategories; i++) {
    const int64_t b = st.current[static_cast<size_t>(i)];
    if (b <= 0) continue;
    const float xa = lay.x_of(at), xb = std::max(lay.x_of(at + static_cast<double>(b)), xa + 1.0f);
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

  char numbers[160];
  if (lay.compact) std::snprintf(numbers, sizeof numbers, "peak %s", human_bytes(st.total_peak).c_str());
  else std::snprintf(numbers, sizeof numbers, "%s  peak %s", human_bytes(st.total_current).c_str(), human_bytes(st.total_peak).c_str());
  if (rm.device_total > 0 && !lay.compact) {  // the GPU's own figure beside what this rank's tracker counts
    const size_t len = std::strlen(numbers);
    std::snprintf(numbers + len, sizeof numbers - len, "  GPU %s / %s", human_bytes(rm.device_used).c_str(),
                  human_bytes(rm.device_total).c_str());
  }
  if (lay.numbers) dl->AddText(ImVec2(bar_x1 + font * 0.6f, text_y), ImGui::GetColorU32(ImGuiCol_Text), numbers);

  if (row_hovered) rank_bar_tooltip(rm, r, std::fabs(mouse.x - x_peak) <= std::max(4.0f, font * 0.3f), hovered_cat);
  return row_hovered;
}

// The grey "other" bar of a 16-bit run (--precision or --amp) is real memory too: name it, so nobody reads it as a leak.
void draw_scratch_note(const Snapshot& s, int r) {
  const RunConfigView& rc = s.config;
  const MemoryStats& st = s.memory[static_cast<size_t>(r)].stats;
  const int64_t scratch = st.current_of(MemCategory::Other);
  if (scratch > 0 && is_mixed(rc.amp) && !rc.gpt.empty()) {  // the GPT under autocast (GptCore::set_amp)
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("other %s: autocast's 16-bit copies of an op's weights and float32 inputs (x.to(dtype); torch caches "
                        "the weights' casts too), held in float32 memory and freed after each pass. Without it rank %d holds %s.",
                        human_bytes(scratch).c_str(), r, human_bytes(st.total_current - scratch).c_str());
    ImGui::PopTextWrapPos();
  } else if (scratch > 0) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("other %s: the float32 scratch a 16-bit op runs in (its widened operands and result, sized "
                        "by the largest %s; 16-bit GEMM kernels keep these in registers, which this engine does not use "
                        "yet). Without it "
                        "rank %d holds %s: the figure to set beside an fp32 run's.",
                        human_bytes(scratch).c_str(), rc.gpt.empty() ? "layer" : "op (the logits, the attention scores)", r,
                        human_bytes(st.total_current - scratch).c_str());
    ImGui::PopTextWrapPos();
  }
}

// Mixed precision: what rank `r` holds per parameter, from its live bytes over Ψ, as the ZeRO paper
// counts it (2 + 2 + 4 + 8 = 16 for AdamW; docs/course_sources.md §6d). Not under LoRA, where the
// frozen base has no gradients or state and one Ψ does not divide them all. A pipeline rank holds
// only its stages: its Ψ is the parameters it holds (its 16-bit parameters' bytes / 2).
void draw_bytes_per_param(const Snapshot& s, int r) {
  const RunConfigView& rc = s.config;
  if (is_mixed(rc.amp) && rc.num_params > 0 && rc.frozen_params == 0) {  // autocast: the other layout, side by side
    const MemoryStats& st = s.memory[static_cast<size_t>(r)].stats;
    const double psi = static_cast<double>(rc.num_params);
    const double p = static_cast<double>(st.current_of(MemCategory::Parameters)) / psi;
    const double g = static_cast<double>(st.current_of(MemCategory::Gradients)) / psi;
    const double o = static_cast<double>(st.current_of(MemCategory::OptimizerState)) / psi;
    // (The GPT keeps its 16-bit tensors in float32 memory holding 16-bit values: GptCore::set_amp.)
    ImGui::Text("bytes per parameter (autocast %s, rank %d): parameters %.3g + gradients %.3g + optimizer state %.3g = %.3g; %s",
                precision_name(rc.amp), r, p, g, o, p + g + o,
                rc.gpt.empty() ? "activations in 16 bits" : "the matmuls' 16-bit outputs held in float32 memory (torch holds 2 bytes each)");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("torch.autocast keeps parameters, gradients and AdamW's m and v in float32 (4 + 4 + 8) and casts\n"
                        "each Linear's operands to 16 bits: the activations are what halves. --precision %s is the other\n"
                        "layout (Megatron's, FSDP MixedPrecision's): 2 + 2 + 4 (fp32 master) + 8 = 16 bytes, 16-bit\n"
                        "gradients, and DDP all-reduces half the bytes.",
                        precision_name(rc.amp));
    ImGui::TextDisabled("against --precision %s's layout: parameters 2 + gradients 2 + master weights 4 + optimizer state 8 = 16; "
                        "DDP here all-reduces float32 gradients (a comm hook halves them)",
                        precision_name(rc.amp));
    draw_scratch_note(s, r);
    return;
  }
  if (!is_mixed(rc.precision) || rc.num_params <= 0 || rc.frozen_params > 0) return;
  const MemoryStats& st = s.memory[static_cast<size_t>(r)].stats;
  const bool stages = rc.strategy == Strategy::Pipeline;
  const double psi = stages ? static_cast<double>(st.current_of(MemCategory::Parameters)) / 2.0 : static_cast<double>(rc.num_params);
  if (psi <= 0) return;
  auto per = [&](MemCategory c) { return static_cast<double>(st.current_of(c)) / psi; };
  const double p = per(MemCategory::Parameters), g = per(MemCategory::Gradients);
  const double m = per(MemCategory::MasterWeights), o = per(MemCategory::OptimizerState);
  ImGui::Text("bytes per parameter (%s, rank %d): parameters %.3g + gradients %.3g + master weights %.3g + optimizer state %.3g = %.3g",
              precision_name(rc.precision), r, p, g, m, o, p + g + m + o);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Each category's bytes now over the %s parameters %s.\n16-bit parameters and gradients, an fp32 master "
                      "copy the optimizer updates,\nand AdamW's fp32 m and v: the ZeRO paper's 2 + 2 + K with K = 12.",
                      param_count_str(psi).c_str(), stages ? "this rank's stages hold" : "of the model");
  draw_scratch_note(s, r);
}

// The live bars: what each rank holds now. `reserve_h` is kept free below them (the comparison).
// `legend`: the colors' key above the bars (an A/B comparison keys them once, on A's side, when it fits).
void draw_live_bars(const Snapshot& s, MemoryViewState& view, float reserve_h, ViewContext& ctx, bool compact, bool legend) {
  const bool presentation = ctx.presentation;
  const int world = static_cast<int>(s.memory.size());
  int64_t scale_bytes = 0, sum_current = 0, sum_peak = 0;
  for (const RankMemory& m : s.memory) {
    scale_bytes = std::max({scale_bytes, m.stats.total_peak, m.stats.total_current});
    sum_current += m.stats.total_current;
    sum_peak += m.stats.total_peak;
  }
  ctx.own_bytes = static_cast<double>(scale_bytes);  // A/B: both sides on the larger one's scale
  if (ctx.shared_bytes > static_cast<double>(scale_bytes)) scale_bytes = static_cast<int64_t>(ctx.shared_bytes);
  if (world == 0 || scale_bytes <= 0) {
    ImGui::TextDisabled("No memory recorded yet: step the run to see what each rank allocates.");
    return;
  }
  // The rank the legend details: the one under the mouse last frame, else the focused rank, else rank 0.
  if (view.hovered_rank >= world) view.hovered_rank = -1;
  const int focus = s.stepper.focus_rank >= 0 && s.stepper.focus_rank < world ? s.stepper.focus_rank : 0;
  const int shown = view.hovered_rank >= 0 ? view.hovered_rank : focus;  // the focused rank (rank 0 without one)

  if (!compact) {
    if (s.iteration >= 0) ImGui::Text("Iteration %d", s.iteration);
    else ImGui::TextUnformatted("Before the first iteration");
  }
  if (!presentation && !compact) {
    const char* note = "(peaks restart every iteration; all bars share one scale)";
    ImGui::PushTextWrapPos(0.0f);
    flow(std::min(ImGui::CalcTextSize(note).x, ImGui::GetFontSize() * 10));
    ImGui::TextDisabled("%s", note);
    ImGui::PopTextWrapPos();
  }
  if (legend) draw_legend(s.memory[static_cast<size_t>(shown)].stats, shown, view.hovered_rank >= 0, presentation, compact);
  if (!compact) {
    draw_bytes_per_param(s, shown);
    ImGui::Spacing();
  }

  // ---- layout: [rank label | bar ......... | current / peak] per row, then the byte axis ----
  const float font = ImGui::GetFontSize();
  const ImGuiStyle& style = ImGui::GetStyle();
  const float label_w = ImGui::CalcTextSize("rank 00").x + font * 0.6f;
  float numbers_w = ImGui::CalcTextSize(compact ? "peak 000.0 MiB" : "000.0 MiB  peak 000.0 MiB").x + font * 0.8f;
  const float axis_h = ImGui::GetTextLineHeight() + font * 0.6f;
  const float footer_h = compact ? 0 : ImGui::GetTextLineHeightWithSpacing();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  BarLayout lay;
  lay.compact = compact;
  if (avail.x < label_w + numbers_w + font * (compact ? 4 : 8)) {  // the bars first; the numbers in their tooltips
    lay.numbers = false;
    numbers_w = font * 0.5f;
  }
  lay.gap = std::max(3.0f, font * (compact ? 0.25f : 0.35f));
  const float fit_h = (avail.y - reserve_h - axis_h - footer_h - style.ItemSpacing.y) / static_cast<float>(world) - lay.gap;
  lay.bar_h = std::clamp(fit_h, font * (compact ? 0.5f : 0.9f), font * 2.2f);
  const float width = std::max(avail.x, label_w + numbers_w + font * (compact ? 4 : 8));
  lay.origin = ImGui::GetCursorScreenPos();
  const ImVec2 size(width, static_cast<float>(world) * (lay.bar_h + lay.gap) + axis_h);
  ImGui::InvisibleButton("##memory_bars", size);
  const bool canvas_hovered = ImGui::IsItemHovered();

  ImDrawList* dl = ImGui::GetWindowDrawList();
  lay.bar_x0 = lay.origin.x + label_w;
  lay.bar_x1 = lay.origin.x + width - numbers_w;
  lay.px_per_byte = (lay.bar_x1 - lay.bar_x0) / static_cast<float>(scale_bytes);
  lay.rows_bottom = lay.origin.y + static_cast<float>(world) * (lay.bar_h + lay.gap);
  draw_byte_grid(dl, lay, scale_bytes);
  int new_hovered = -1;
  for (int r = 0; r < world; r++)
    if (draw_rank_bar(dl, s, r, lay, canvas_hovered)) new_hovered = r;
  view.hovered_rank = new_hovered;

  if (world > 1 && !compact)
    ImGui::Text("All %d ranks: %s now, peaks sum to %s", world, human_bytes(sum_current).c_str(), human_bytes(sum_peak).c_str());
}

// ---- Strategies compared: the memory planner's per-rank bytes under each sharding ----

constexpr int kNumCompared = static_cast<int>(std::tuple_size_v<decltype(MemoryPlanSet::plans)>);
constexpr Sharding kCompared[kNumCompared] = {Sharding::NoShard, Sharding::Zero1, Sharding::ShardGradOp,
                                              Sharding::FullShard};
constexpr ImU32 kRunningBand = IM_COL32(255, 255, 255, 26);

// Short row labels (sharding_name's ZeRO-1 carries a long note).
const char* compared_label(Sharding sh) {
  switch (sh) {
    case Sharding::NoShard: return "NO_SHARD";
    case Sharding::Zero1: return "ZeRO-1";
    case Sharding::ShardGradOp: return "SHARD_GRAD_OP";
    case Sharding::FullShard: return "FULL_SHARD";
    default: return sharding_name(sh);
  }
}

MemoryPlanSet plan_all(MemoryPlanInput in) {
  MemoryPlanSet out;
  try {
    for (int i = 0; i < kNumCompared; i++) {
      in.sharding = kCompared[i];
      out.plans[static_cast<size_t>(i)] = plan_memory(in);
    }
    out.ok = true;
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

// "120 GB", "31.4 GB", "1.9 GB": decimal gigabytes, as the ZeRO paper prints them.
std::string paper_gb(double bytes) {
  const double gb = bytes / 1e9;
  char buf[32];
  std::snprintf(buf, sizeof buf, gb >= 100 ? "%.0f GB" : "%.1f GB", gb);
  return buf;
}

std::string plan_bytes(double bytes, bool paper_units) {
  return paper_units ? paper_gb(bytes) : human_bytes(static_cast<int64_t>(std::llround(bytes)));
}

struct PlanPart {
  MemCategory category;
  const char* name;
  double MemoryPlan::*bytes;
};
constexpr PlanPart kPlanParts[] = {
    {MemCategory::Parameters, "parameters", &MemoryPlan::parameters},
    {MemCategory::Gradients, "gradients", &MemoryPlan::gradients},
    {MemCategory::OptimizerState, "optimizer state", &MemoryPlan::optimizer_state},
    {MemCategory::GatheredParameters, "gathered (a unit unsharded)", &MemoryPlan::gathered},
};

void draw_plan_legend() {
  for (size_t i = 0; i < std::size(kPlanParts); i++)
    legend_entry(memory_category_color(kPlanParts[i].category), kPlanParts[i].name, i == 0);
}

// One panel `width` wide: a title, a subtitle, a row per strategy [marker + name | stacked bar and
// its total], then a footnote. Bars share the panel's own scale (its largest total); `running` is
// the row to highlight.
// Height of a panel's title and (wrapped) subtitle, so panels side by side start their rows level.
float plan_header_height(const std::string& title, const std::string& subtitle, float width) {
  const ImGuiStyle& style = ImGui::GetStyle();
  return ImGui::CalcTextSize(title.c_str(), nullptr, false, width).y +
         ImGui::CalcTextSize(subtitle.c_str(), nullptr, false, width).y + 2 * style.ItemSpacing.y;
}

void draw_plan_panel(const char* id, const std::string& title, const std::string& subtitle, const std::string& footnote,
                     const MemoryPlanSet& set, int running, bool paper_units, float width, float header_h) {
  const float font = ImGui::GetFontSize();
  ImGui::BeginGroup();
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + width);
  const float top = ImGui::GetCursorPosY();
  ImGui::TextUnformatted(title.c_str());
  ImGui::TextDisabled("%s", subtitle.c_str());
  const float used = ImGui::GetCursorPosY() - top;
  if (used < header_h) ImGui::Dummy(ImVec2(1, header_h - used - ImGui::GetStyle().ItemSpacing.y));
  if (!set.ok) {
    ImGui::TextWrapped("The planner cannot size this: %s", set.error.c_str());
    ImGui::PopTextWrapPos();
    ImGui::EndGroup();
    return;
  }
  std::array<std::string, kNumCompared> totals;
  float total_w = 0;
  double scale = 0;
  for (int i = 0; i < kNumCompared; i++) {
    const MemoryPlan& p = set.plans[static_cast<size_t>(i)];
    totals[static_cast<size_t>(i)] = plan_bytes(p.total, paper_units);
    total_w = std::max(total_w, ImGui::CalcTextSize(totals[static_cast<size_t>(i)].c_str()).x);
    scale = std::max(scale, p.total);
  }
  total_w += font * 0.8f;
  const float label_w = ImGui::CalcTextSize("SHARD_GRAD_OP").x + font * 1.5f;
  const float row_h = font * 1.3f, gap = std::max(3.0f, font * 0.45f);
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(id, ImVec2(width, static_cast<float>(kNumCompared) * (row_h + gap)));
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float bar_x0 = origin.x + label_w;
  const float bar_x1 = std::max(origin.x + width - total_w, bar_x0 + font * 2);
  const double px_per_byte = scale > 0 ? (bar_x1 - bar_x0) / scale : 0;
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text), dim = ImGui::GetColorU32(ImGuiCol_Text, 0.72f);
  const float rounding = font * 0.15f;
  for (int i = 0; i < kNumCompared; i++) {
    const MemoryPlan& p = set.plans[static_cast<size_t>(i)];
    const bool is_running = i == running;
    const float y0 = origin.y + static_cast<float>(i) * (row_h + gap) + gap * 0.5f, y1 = y0 + row_h;
    const bool row_hovered = hovered && mouse.y >= y0 - gap * 0.5f && mouse.y < y1 + gap * 0.5f;
    const float text_y = y0 + (row_h - ImGui::GetTextLineHeight()) * 0.5f;
    if (is_running) {
      dl->AddRectFilled(ImVec2(origin.x, y0 - gap * 0.45f), ImVec2(origin.x + width, y1 + gap * 0.45f), kRunningBand, rounding);
      const float cy = 0.5f * (y0 + y1), r = font * 0.3f;
      dl->AddTriangleFilled(ImVec2(origin.x + font * 0.2f, cy - r), ImVec2(origin.x + font * 0.2f, cy + r),
                            ImVec2(origin.x + font * 0.2f + r * 1.6f, cy), text);
    }
    dl->AddText(ImVec2(origin.x + font * 0.95f, text_y), is_running ? text : dim, compared_label(kCompared[i]));
    dl->AddRectFilled(ImVec2(bar_x0, y0), ImVec2(bar_x1, y1), kTrackColor, rounding);
    double at = 0;
    for (const PlanPart& part : kPlanParts) {
      const double b = p.*part.bytes;
      if (b <= 0) continue;
      const float xa = bar_x0 + static_cast<float>(at * px_per_byte);
      const float xb = std::max(bar_x0 + static_cast<float>((at + b) * px_per_byte), xa + 1.0f);
      dl->AddRectFilled(ImVec2(xa, y0), ImVec2(xb, y1), memory_category_color(part.category));
      if (xb - xa > 3) dl->AddLine(ImVec2(xb - 0.5f, y0), ImVec2(xb - 0.5f, y1), IM_COL32(0, 0, 0, 110), 1.0f);
      at += b;
    }
    const float x_end = std::max(bar_x0 + static_cast<float>(at * px_per_byte), bar_x0 + 1.0f);
    if (is_running)
      dl->AddRect(ImVec2(bar_x0 - 1.5f, y0 - 1.5f), ImVec2(x_end + 1.5f, y1 + 1.5f), text, rounding, 0,
                  std::max(1.5f, font * 0.1f));
    dl->AddText(ImVec2(x_end + font * 0.45f, text_y), is_running ? text : dim, totals[static_cast<size_t>(i)].c_str());
    if (row_hovered) dl->AddRect(ImVec2(bar_x0 - 1, y0 - 1), ImVec2(bar_x1 + 1, y1 + 1), ImGui::GetColorU32(ImGuiCol_Text, 0.5f), rounding);
    if (!row_hovered) continue;
    ImGui::BeginTooltip();
    ImGui::Text("%s (ZeRO stage %d)%s", sharding_name(kCompared[i]), zero_stage(kCompared[i]),
                is_running ? ": this run" : "");
    const float value_x = ImGui::CalcTextSize("gathered (a unit unsharded)").x + font;
    for (const PlanPart& part : kPlanParts) {
      if (p.*part.bytes <= 0 && part.category == MemCategory::GatheredParameters) continue;
      ImGui::TextUnformatted(part.name);
      ImGui::SameLine(value_x);
      ImGui::TextUnformatted(plan_bytes(p.*part.bytes, paper_units).c_str());
    }
    ImGui::TextUnformatted("total per rank");
    ImGui::SameLine(value_x);
    ImGui::Text("%s%s%s", totals[static_cast<size_t>(i)].c_str(), paper_units ? " = " : "",
                paper_units ? human_bytes(static_cast<int64_t>(std::llround(p.total))).c_str() : "");
    ImGui::TextDisabled("memory %s; sends %s per step (%s)", p.formula.c_str(), plan_bytes(p.comm_bytes, paper_units).c_str(),
                        p.comm_formula.c_str());
    ImGui::EndTooltip();
  }
  if (!footnote.empty()) ImGui::TextDisabled("%s", footnote.c_str());
  ImGui::PopTextWrapPos();
  ImGui::EndGroup();
}

// "this run" beside "planner": each planned category's peak this iteration on `rank`, against the
// planner's bytes for the running strategy (the same MemoryPlan the panel below draws), so a
// learner sees the formulas hold, or by how much padding or timing moves the live figure.
void draw_run_vs_planner(const Snapshot& s, const MemoryPlan& plan, int rank, bool fsdp, bool mixed) {
  if (rank < 0 || rank >= static_cast<int>(s.memory.size())) return;
  ImGui::Spacing();
  ImGui::Separator();
  const MemoryStats& st = s.memory[static_cast<size_t>(rank)].stats;
  const float font = ImGui::GetFontSize();
  // Like with like: the planner's bytes are an iteration's peaks, so the run's are compared whole
  // only at an iteration's boundary; mid-iteration they are peaks so far (FSDP showed -771 KiB of
  // optimizer state before the first step had allocated it).
  const bool whole = s.finished || (s.held.valid && s.held.kind == GateKind::Iteration);
  ImGui::Text("This run against the planner, rank %d", rank);
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);  // one line of it was 1267 pixels under presentation's type
  ImGui::TextDisabled(whole ? "(peak this iteration per category; hover a bar for another rank)"
                            : "(peaks so far: iteration %d is under way; hover a bar for another rank)", s.iteration);
  ImGui::PopTextWrapPos();
  const ImGuiTableFlags flags = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_RowBg;
  if (!ImGui::BeginTable("##run_vs_plan", 4, flags)) return;
  // Number columns as wide as their widest figure, not 7 em each: presentation's type made the
  // table 1200 pixels wide in a 578-pixel tile.
  const float num_w = ImGui::CalcTextSize("000.0 KiB").x + font * 0.5f;
  for (const char* head : {"", "this run", "planner", "difference"})
    ImGui::TableSetupColumn(head, 0, head[0] ? std::max(num_w, ImGui::CalcTextSize(head).x) : 0);
  ImGui::TableHeadersRow();
  auto row = [whole](const char* name, ImU32 color, int64_t measured, double planned) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    if (color) legend_entry(color, name, true);
    else ImGui::TextUnformatted(name);
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(human_bytes(measured).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(plan_bytes(planned, false).c_str());
    ImGui::TableNextColumn();
    const int64_t diff = measured - static_cast<int64_t>(std::llround(planned));
    if (diff == 0) ImGui::TextDisabled("equal");
    else if (!whole && diff < 0) ImGui::TextDisabled("not yet");  // the rest comes later in the iteration
    else ImGui::Text("%s%s", diff > 0 ? "+" : "-", human_bytes(diff > 0 ? diff : -diff).c_str());
  };
  int64_t measured_sum = 0;
  int rows = 0;
  for (const PlanPart& part : kPlanParts) {
    const double planned = plan.*part.bytes;
    int64_t measured = st.peak_of(part.category);
    const char* name = part.name;
    // Mixed precision: the planner counts the fp32 master copy inside the optimizer's K = 12 (the
    // ZeRO paper's accounting); the tracker keeps it apart, so this row adds the two.
    if (mixed && part.category == MemCategory::OptimizerState) {
      measured += st.peak_of(MemCategory::MasterWeights);
      name = "optimizer + master weights";
    }
    if (planned <= 0 && measured <= 0) continue;  // e.g. nothing gathered outside FSDP
    row(name, memory_category_color(part.category), measured, planned);
    measured_sum += measured;
    rows++;
  }
  if (rows > 1) row("sum of the rows", 0, measured_sum, plan.total);
  ImGui::EndTable();
  if (!whole) ImGui::TextDisabled("Step to the iteration's end (I) to compare whole iterations.");
  if (mixed)
    ImGui::TextDisabled("Mixed precision: the planner's optimizer state is K = 12 bytes per parameter, the fp32 master copy (4) "
                        "included; the run's row adds its master weights to its optimizer state to compare like with like.");
  if (!fsdp) return;
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("FSDP: the tracker counts a unit's unsharded gradient under gradients, the planner under gathered, "
                        "which it sizes as the largest unit in flight (twice with BACKWARD_PRE); each peak is at its own instant.");
  ImGui::PopTextWrapPos();
}

// Below the live bars: the planner's per-rank bytes for the running model and world under each
// strategy, beside the same strategies for a 7.5B model on 64 ranks (the ZeRO paper's Figure 1:
// 120 / 31.4 / 16.6 / 1.9 GB), so "your toy model" and "a 7B model" read side by side.
void draw_strategies_compared(const Snapshot& s, MemoryViewState& view) {
  const RunConfigView& rc = s.config;
  if (rc.num_params <= 0) return;
  const float font = ImGui::GetFontSize();
  // The run: ddp is NO_SHARD, single is NO_SHARD on one rank (nothing to shard).
  const bool single = rc.strategy == Strategy::Single;
  MemoryPlanInput in;
  // Under LoRA the planner's Ψ is the frozen base and Ψ_L the adapters (FSDP units: not modelled).
  const bool lora = rc.frozen_params > 0;
  in.params = static_cast<double>(lora ? rc.frozen_params : rc.num_params);
  in.lora_params = lora ? static_cast<double>(rc.num_params) : 0.0;
  in.world = single ? 1 : std::max(rc.world, 1);
  const bool mixed = is_mixed(rc.precision);
  in.dtype = !mixed ? PlanDType::Fp32 : rc.precision == Precision::BF16 ? PlanDType::Bf16 : PlanDType::Fp16;
  in.optimizer = rc.optimizer_kind;
  in.sgd_momentum = rc.sgd_momentum;
  in.largest_unit_params = lora ? 0.0 : static_cast<double>(std::min(rc.largest_unit_params, rc.num_params));
  in.units_in_flight = rc.units_in_flight == 2 ? 2 : 1;
  // Planned once per configuration, not per frame.
  const MemoryPlanInput& was = view.plans_for;
  if (!view.have_plans || was.params != in.params || was.world != in.world || was.optimizer != in.optimizer ||
      was.sgd_momentum != in.sgd_momentum || was.largest_unit_params != in.largest_unit_params ||
      was.units_in_flight != in.units_in_flight || was.lora_params != in.lora_params || was.dtype != in.dtype) {
    view.plans = plan_all(in);
    view.plans_for = in;
    view.have_plans = true;
  }
  static const MemoryPlanSet paper = [] {
    MemoryPlanInput p;
    p.params = 7.5e9;
    p.world = 64;
    p.dtype = PlanDType::Mixed;
    p.optimizer = OptimizerKind::AdamW;
    return plan_all(p);
  }();
  int running = 0;
  for (int i = 0; i < kNumCompared; i++)
    if (kCompared[i] == rc.sharding) running = i;
  // HYBRID_SHARD is not among the four rows; FSDP under LoRA keeps the frozen base whole on every rank
  // (only the adapters are units), which the planner's sharded Ψ + Ψ_L does not model.
  if (view.plans.ok && rc.sharding != Sharding::Hybrid && !(lora && rc.strategy == Strategy::Fsdp))
    draw_run_vs_planner(s, view.plans.plans[static_cast<size_t>(running)],
                        view.hovered_rank >= 0 ? view.hovered_rank : std::max(s.stepper.focus_rank, 0), rc.strategy == Strategy::Fsdp, mixed);
  ImGui::Spacing();
  ImGui::Separator();
  ImGui::TextUnformatted("Strategies compared");
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);  // wraps at the window's edge in a narrow window
  ImGui::TextDisabled("(per-rank bytes by the ZeRO paper's formulas; activations not counted; hover a bar)");
  ImGui::PopTextWrapPos();
  draw_plan_legend();
  ImGui::Spacing();

  const char* opt = rc.optimizer_kind == OptimizerKind::AdamW ? "AdamW" : rc.sgd_momentum ? "SGD with momentum" : "SGD";
  std::string title = "your model: " + param_count_str(in.params) + " parameters" +
                      (lora ? " frozen + " + param_count_str(in.lora_params) + " LoRA" : "") + ", " +
                      std::to_string(in.world) + (in.world == 1 ? " rank" : " ranks");
  std::string subtitle = (is_mixed(rc.amp) ? std::string("fp32 under autocast ") + precision_name(rc.amp)
                                            : std::string(mixed ? precision_name(rc.precision) : "fp32")) +
                         (mixed ? " mixed precision, " : ", ") + opt + "; this run: ";
  if (single) subtitle += "single, one rank: nothing to shard, every strategy holds it all";
  else if (rc.strategy == Strategy::Ddp) subtitle += "ddp = NO_SHARD (every rank a full replica)";
  else if (rc.strategy == Strategy::Dp) subtitle += "dp: rank 0 as NO_SHARD; the others hold a replica only inside an iteration";
  else subtitle += sharding_name(rc.sharding);
  std::string footnote;
  if (in.world > 1 && in.largest_unit_params > 0)
    footnote = "gathered: the largest unit (" + param_count_str(in.largest_unit_params) + " parameters, " +
               (rc.wrap_layers ? "one Linear" : "the whole model") + ") unsharded" +
               (in.units_in_flight == 2 ? ", twice with BACKWARD_PRE" : "") +
               (rc.strategy == Strategy::Fsdp ? "" : " (FSDP's defaults)");

  const float avail = ImGui::GetContentRegionAvail().x;
  const float spacing = font * 1.5f;
  const bool side_by_side = avail >= font * 46;
  const float w = side_by_side ? (avail - spacing) * 0.5f : avail;
  const std::string title7 = "the same at 7.5B parameters, 64 ranks, mixed precision";
  const std::string subtitle7 = "fp16 weights and gradients, fp32 Adam (K = 12): the ZeRO paper's Figure 1";
  const float header_h = side_by_side ? std::max(plan_header_height(title, subtitle, w), plan_header_height(title7, subtitle7, w)) : 0;
  draw_plan_panel("##plan_run", title, subtitle, footnote, view.plans, running, false, w, header_h);
  if (side_by_side) ImGui::SameLine(0, spacing);
  else ImGui::Spacing();
  draw_plan_panel("##plan_7b", title7, subtitle7, "GB = 1e9 bytes, as in the paper; units in flight not counted", paper,
                  running, true, w, header_h);
}

// Pipelines: each stage's activation memory (replica 0), beside the micro-batches it holds in flight,
// so GPipe's m against 1F1B's p - r reads as bytes. (The ZeRO comparison does not apply: a stage's
// rank holds only its own parameters.)
void draw_pipeline_stages(const Snapshot& s) {
  const PipelineView& pv = s.pipeline;
  const float font = ImGui::GetFontSize();
  ImGui::Spacing();
  ImGui::Separator();
  ImGui::TextUnformatted("Activations per stage");
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("(%s; peak this iteration; micro-batches in flight: measured, formula)", pv.plan.name.c_str());
  ImGui::PopTextWrapPos();
  // One line per row of the pipeline chart: replica 0's pipeline ranks (with --tp, the TP group's
  // first rank stands for the group).
  const int rows = std::min(pv.p, static_cast<int>(pv.rows.size()));
  auto shown = [&](int r) { return pv.rows[static_cast<size_t>(r)].rank; };
  int64_t scale = 1;
  float label_w = ImGui::CalcTextSize("stage 0 (rank 0)  ").x;
  for (int r = 0; r < rows && shown(r) < static_cast<int>(s.memory.size()); r++) {
    scale = std::max(scale, s.memory[static_cast<size_t>(shown(r))].stats.peak_of(MemCategory::Activations));
    label_w = std::max(label_w, ImGui::CalcTextSize((pv.rows[static_cast<size_t>(r)].label + "  ").c_str()).x);
  }
  const float text_w = ImGui::CalcTextSize("000.0 KiB  in flight 16 (16)").x + font;
  for (int r = 0; r < rows && shown(r) < static_cast<int>(s.memory.size()); r++) {
    const int64_t act = s.memory[static_cast<size_t>(shown(r))].stats.peak_of(MemCategory::Activations);
    const ImVec2 p = ImGui::GetCursorScreenPos();
    char text[64];
    std::snprintf(text, sizeof text, "%s  in flight %d (%d)", human_bytes(act).c_str(), pv.row(r).peak_inflight,
                  pv.formula_peak[static_cast<size_t>(r)]);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddText(p, rank_color(shown(r), s.config.world), pv.rows[static_cast<size_t>(r)].label.c_str());
    const float bar_w = std::max(font * 3, ImGui::GetContentRegionAvail().x - label_w - text_w);
    const float w = bar_w * static_cast<float>(act) / static_cast<float>(scale);
    dl->AddRectFilled(ImVec2(p.x + label_w, p.y + 0.15f * font), ImVec2(p.x + label_w + bar_w, p.y + 0.95f * font), kTrackColor);
    dl->AddRectFilled(ImVec2(p.x + label_w, p.y + 0.15f * font), ImVec2(p.x + label_w + w, p.y + 0.95f * font),
                      memory_category_color(MemCategory::Activations));
    dl->AddText(ImVec2(p.x + label_w + bar_w + 0.5f * font, p.y), ImGui::GetColorU32(ImGuiCol_Text), text);
    ImGui::Dummy(ImVec2(label_w + bar_w + text_w, ImGui::GetTextLineHeightWithSpacing()));
  }
}

// A GPT: what one block keeps for its backward, term by term, as Korthikanti et al. count it for
// Megatron's layer and as this engine keeps it, and the whole forward's bytes against the tracker.
void draw_gpt_blocks(const Snapshot& s) {
  const RunConfigView& c = s.config;
  const GptSpec& g = c.gpt;
  // Sequences per forward: the rank's batch, or a pipeline's micro-batch (each in flight keeps its own).
  const bool pipe = s.pipeline.valid && s.pipeline.m > 0;
  const int64_t B = pipe ? c.batch / s.pipeline.m : c.batch;
  // A tensor-parallel shard keeps its heads' and MLP columns' share (and under sequence parallelism its
  // positions' share of the LayerNorm regions).
  const TensorParallelSpec tp{std::max(1, s.mesh.shape.tp), 0, s.mesh.sequence_parallel};
  const bool sp = tp.degree > 1 && tp.sequence_parallel;
  const bool half = is_mixed(c.precision);  // --precision: 16-bit activations, LayerNorm's statistics float32
  const int64_t E = half ? 2 : 4;
  ImGui::Spacing();
  ImGui::Separator();
  ImGui::TextUnformatted("Activations per block");
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("(Korthikanti et al. 2022, Table 2: s = %lld positions, b = %lld sequences%s, h = %lld, a = %lld heads%s)",
                      static_cast<long long>(g.ctx), static_cast<long long>(B), pipe ? " (a micro-batch)" : "",
                      static_cast<long long>(g.embd), static_cast<long long>(g.heads),
                      tp.degree > 1 ? (", one rank of t = " + std::to_string(tp.degree) + (sp ? ", sequence parallel" : "")).c_str() : "");
  ImGui::PopTextWrapPos();
  const ImGuiTableFlags flags = ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_RowBg;
  if (ImGui::BeginTable("##gpt_block", 3, flags)) {
    const float num_w = ImGui::CalcTextSize("000.0 KiB").x + ImGui::GetFontSize() * 0.5f;
    // The names take what the numbers leave, wrapped (presentation at 1280 x 720 cut the last column).
    ImGui::TableSetupColumn("tensor kept for backward", ImGuiTableColumnFlags_WidthStretch);
    ImGui::TableSetupColumn("Megatron, 16-bit", 0, std::max(num_w, ImGui::CalcTextSize("Megatron, 16-bit").x));
    const char* ours = half ? (c.precision == Precision::BF16 ? "this engine, bf16" : "this engine, fp16") : "this engine, fp32";
    ImGui::TableSetupColumn(ours, 0, std::max(num_w, ImGui::CalcTextSize(ours).x));
    ImGui::TableHeadersRow();
    double korthikanti = 0;
    int64_t engine = 0;
    for (const GptActivationTerm& t : gpt_block_activation_terms(g, B, tp, E)) {
      korthikanti += t.korthikanti;
      engine += t.engine;
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::PushTextWrapPos(0.0f);
      ImGui::TextUnformatted(t.tensor.c_str());
      ImGui::PopTextWrapPos();
      if (!t.why.empty() && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", t.why.c_str());
      ImGui::TableNextColumn();
      if (t.korthikanti > 0) ImGui::TextUnformatted(plan_bytes(t.korthikanti, false).c_str());
      else ImGui::TextDisabled("-");
      ImGui::TableNextColumn();
      if (t.engine > 0) ImGui::TextUnformatted(human_bytes(t.engine).c_str());
      else ImGui::TextDisabled("none");
    }
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(tp.degree == 1 ? "a block: s·b·h·(34 + 5·a·s/h)"
                           : sp           ? "a block: s·b·h/t·(34 + 5·a·s/h)"
                                          : "a block: s·b·h·(10 + 24/t + 5·a·s/(h·t))");
    ImGui::PopTextWrapPos();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(plan_bytes(korthikanti, false).c_str());
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(human_bytes(engine).c_str());
    ImGui::EndTable();
  }
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled(half ? "Hover a row the two count differently for why. Both keep 16-bit tensors; this engine's LayerNorm "
                             "statistics stay float32."
                           : "Hover a row the two count differently for why. Where both keep a tensor, float32 is twice the 16 bits.");
  if (sp)
    ImGui::TextDisabled("Sequence parallel: each LayerNorm output is kept as this rank's %lld positions and all-gathered again "
                        "for c_attn's and c_fc's weight gradients, as Megatron does, rather than kept whole.",
                        static_cast<long long>(g.ctx / tp.degree));
  // The whole forward against the tracker, where one rank runs the whole model on its batch.
  if (c.strategy != Strategy::Pipeline && !s.memory.empty()) {
    LoraSpec lora;
    lora.rank = c.lora_rank;
    const int64_t model = gpt_activation_bytes(g, B, c.activation_checkpointing, tp, E) + gpt_lora_activation_bytes(g, lora, B, tp, E);
    const int64_t loss = 2 * B * g.ctx * g.vocab * static_cast<int64_t>(sizeof(float));
    const int64_t measured = s.memory[0].stats.peak_of(MemCategory::Activations);
    ImGui::Text("Whole forward%s: %lld blocks, the embeddings' sum, ln_f, the logits%s and the backward's scratch = %s; with the "
                "loss's 2 x positions x vocab floats, %s. Rank 0's activations peak: %s%s.",
                c.activation_checkpointing ? " (checkpointed: each block's output, one set of the rest)" : "",
                static_cast<long long>(g.layers), c.lora_rank > 0 ? ", LoRA's x A^T and adapter output" : "", human_bytes(model).c_str(), human_bytes(model + loss).c_str(),
                human_bytes(measured).c_str(), measured == model + loss ? " (equal)" : "");
  }
  ImGui::PopTextWrapPos();
}

}  // namespace

void draw_memory_view(const Snapshot& s, MemoryViewState& view, ViewContext& ctx) {
  draw_focus_line(s);
  // The bars are the picture and are shown whole; below them, when the window has room, the
  // planner's strategies (or a pipeline's stages) in a region of their own that scrolls. A short
  // tile keys the colors in one line and points to the view alone for the rest.
  const float line = ImGui::GetTextLineHeightWithSpacing(), font = ImGui::GetFontSize();
  const float avail = ImGui::GetContentRegionAvail().y;
  const int world = std::max(static_cast<int>(s.memory.size()), 1);
  const float bars = static_cast<float>(world) * font * 1.3f + 2 * line;  // rows at their least, the axis, the total
  // Compact in a short tile, and in a narrow one, where a bar with both figures beside it would not fit.
  const float full_row_w = ImGui::CalcTextSize("rank 00  000.0 MiB  peak 000.0 MiB").x + font * 9;
  const bool compact = ctx.compare_side != 0 || ctx.presentation || avail < bars + 8 * line ||
                       ImGui::GetContentRegionAvail().x < full_row_w;
  const float left = avail - bars - (compact ? 2 : 6) * line;
  const bool details = ctx.compare_side == 0 && left >= 5 * line;
  const float details_h = details ? std::clamp(view.compare_h + ImGui::GetStyle().ItemSpacing.y, 5 * line, left) : 0;
  const bool legend = ctx.compare_side == 0 || (ctx.compare_side == 1 && avail >= bars + 3 * line);
  draw_live_bars(s, view, details ? details_h : ctx.compare_side == 0 ? line : 0, ctx, compact, legend);
  if (ctx.compare_side != 0) return;  // one side of an A/B comparison: the bars alone
  if (!details) {
    if (ctx.presentation) return;  // fewer words: the teacher knows key 4
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("%s: key 4", s.pipeline.valid ? "Activations per stage" : "Strategies compared");
    ImGui::PopTextWrapPos();
    return;
  }
  ImGui::BeginChild("##list_memory_details", ImVec2(0, 0), false);
  const float y0 = ImGui::GetCursorPosY();
  if (s.pipeline.valid) draw_pipeline_stages(s);
  if (!s.config.gpt.empty()) draw_gpt_blocks(s);
  if (!s.pipeline.valid) draw_strategies_compared(s, view);
  view.compare_h = ImGui::GetCursorPosY() - y0;
  ImGui::EndChild();
}

}  // namespace dtlab::app
