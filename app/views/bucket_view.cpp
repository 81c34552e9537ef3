// DDP's gradient buckets (rank 0's reducer): one row per bucket in launch order, each parameter a
// cell as wide as its gradient, filled the moment backward makes that gradient final. Bucket 0 holds
// the last layers, whose gradients backward produces first, so it fills and all-reduces first while
// the earlier layers still compute: that is how DDP hides communication behind backward.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

const char* state_meaning(BucketState s) {
  switch (s) {
    case BucketState::Empty: return "no gradient of this backward pass yet";
    case BucketState::Filling: return "some gradients are in, the rest are still being computed";
    case BucketState::Ready: return "every gradient is in; it launches once the buckets before it have";
    case BucketState::Launched: return "its all-reduce is issued, queued on the comm stream behind the buckets before it";
    case BucketState::AllReducing: return "its all-reduce is summing the gradients across ranks";
    case BucketState::Done: return "averaged across ranks: the optimizer may use it";
  }
  return "";
}

// A rounded pill with the state's name; returns its width.
float state_badge(ImDrawList* dl, ImVec2 p, BucketState st) {
  const char* name = bucket_state_name(st);
  const ImVec2 ts = ImGui::CalcTextSize(name);
  const float fs = ImGui::GetFontSize(), padx = 0.45f * fs;
  const ImU32 col = bucket_state_color(st);
  dl->AddRectFilled(p, ImVec2(p.x + ts.x + 2 * padx, p.y + ts.y + 0.2f * fs), col, 0.5f * fs);
  dl->AddText(ImVec2(p.x + padx, p.y + 0.1f * fs), ink_on(col), name);
  return ts.x + 2 * padx;
}

// Text clipped to a cell, left-aligned with a small inset.
void cell_text(ImDrawList* dl, ImVec2 a, ImVec2 b, ImVec2 at, ImU32 col, const char* text) {
  const ImVec4 clip(a.x + 2, a.y, b.x - 2, b.y);
  dl->AddText(ImGui::GetFont(), ImGui::GetFontSize(), at, col, text, nullptr, 0, &clip);
}

void draw_legend(float fs) {
  bool first = true;
  for (BucketState st : {BucketState::Empty, BucketState::Filling, BucketState::Ready, BucketState::Launched, BucketState::AllReducing,
                         BucketState::Done}) {
    const char* name = bucket_state_name(st);
    const float w = 1.15f * fs + ImGui::CalcTextSize(name).x;
    if (!first) flow(w, 0.9f * fs);
    first = false;
    const ImVec2 p = ImGui::GetCursorScreenPos();
    ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 0.15f * fs), ImVec2(p.x + 0.85f * fs, p.y + 0.95f * fs),
                                              bucket_state_color(st), 0.2f * fs);
    ImGui::Dummy(ImVec2(fs, fs));
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s: %s", name, state_meaning(st));
    ImGui::SameLine(0, 0.15f * fs);
    ImGui::TextUnformatted(name);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s: %s", name, state_meaning(st));
  }
  const char* key = "filled cell = gradient ready, #n = order it became ready";
  flow(ImGui::CalcTextSize(key).x, 1.5f * fs);
  ImGui::PushTextWrapPos(0.0f);  // narrower than the key itself (presentation at 1280x720): wrap it
  ImGui::TextDisabled("%s", key);
  ImGui::PopTextWrapPos();
}

void draw_no_buckets(const Snapshot& s) {
  ImGui::PushTextWrapPos(0.0f);  // every line wraps at the window's edge (a tile at 1280 x 720 cut them)
  if (s.config.strategy != Strategy::Ddp) {
    ImGui::TextUnformatted("Buckets exist with --strategy ddp.");
    ImGui::TextDisabled("This run uses --strategy %s: no gradient is all-reduced in buckets.", strategy_name(s.config.strategy));
    ImGui::TextDisabled("DDP packs gradients into buckets in reverse layer order and all-reduces each bucket as "
                        "soon as backward has filled it, overlapping communication with the rest of backward.");
  } else if (s.mesh.shape.tp > 1 && s.mesh.shape.dp == 1) {
    ImGui::TextUnformatted("One replica: every rank is in the one tensor-parallel group (--tp = --world).");
    ImGui::TextDisabled("No gradient is averaged across replicas, so DDP has no buckets; add ranks (--world 2 x --tp) for data parallelism.");
  } else {
    ImGui::TextDisabled("Waiting for DDP to assign its buckets...");
  }
  ImGui::PopTextWrapPos();
}

// ---- header: which assignment, why this order, the state legend
// `presentation`: fewer words (presentation mode, a side of an A/B comparison); `key`: the colors' key.
void draw_header(const Snapshot& s, float fs, bool presentation, bool key) {
  int64_t total = 0;
  int params = 0, ready = 0;
  for (const BucketView& b : s.buckets) {
    total += b.bytes;
    for (const BucketParam& p : b.params) params++, ready += p.ready ? 1 : 0;
  }
  ImGui::PushTextWrapPos(0.0f);  // narrow panels wrap rather than cut the explanation off
  // Presentation: fewer words, so the buckets themselves keep the room (the teacher says the rest).
  if (presentation)
    ImGui::TextWrapped(s.bucket_generation == 0 && !s.config.find_unused_parameters && !s.config.sized_first_iteration
                           ? "Iteration 0: one bucket of every gradient (torch's first iteration)"
                           : "Generation %d: in the order gradients became ready", s.bucket_generation);
  else if (s.bucket_generation == 0 && !s.config.find_unused_parameters && !s.config.sized_first_iteration)
    ImGui::TextWrapped("The first iteration (iteration 0): ONE bucket of every gradient, as torch's DDP builds with "
                       "find_unused_parameters=False (the model's order need not be the order gradients arrive in); "
                       "sized buckets are rebuilt after it");
  else if (s.bucket_generation == 0 && s.config.find_unused_parameters)
    ImGui::TextWrapped("Generation 0: sized buckets from the start, parameters in reverse order of model.parameters() "
                       "(find_unused_parameters=True: never rebuilt)");
  else if (s.bucket_generation == 0)
    ImGui::TextWrapped("Generation 0: sized buckets in the first iteration, a lab option (torch uses one bucket there), "
                       "parameters in reverse order of model.parameters()");
  else
    ImGui::TextWrapped("Generation %d: rebuilt after the first iteration (iteration 0), in the order gradients became ready", s.bucket_generation);
  if (s.buckets.size() > 1 && !presentation)
    ImGui::TextColored(ImVec4(1.0f, 0.86f, 0.45f, 1.0f), "bucket 0 holds the last layers: their gradients are ready first");
  if (!presentation) ImGui::TextDisabled("%d %s, %s in all (cap %s, first bucket %s)  \xC2\xB7  rank 0, iteration %d: %d of %d gradients ready",
                      static_cast<int>(s.buckets.size()), s.buckets.size() == 1 ? "bucket" : "buckets", human_bytes(total).c_str(), human_bytes(s.config.bucket_cap_bytes).c_str(),
                      human_bytes(s.config.first_bucket_bytes).c_str(), s.iteration, ready, params);
  const CommHookSpec& hook = s.config.comm_hook;
  if (hook.kind != CommHook::None) {
    // torch's register_comm_hook: what the collectives really moved, against what the buckets hold.
    int64_t wire = 0, held = 0;
    for (const BucketView& b : s.buckets)
      if (b.wire_bytes > 0) wire += b.wire_bytes, held += b.bytes;
    char share[32];
    std::snprintf(share, sizeof share, "%g%%", 100.0 * hook.topk_ratio);
    const std::string how =
        hook.kind == CommHook::PowerSgd
            ? "from iteration " + std::to_string(hook.powersgd_start) + " each gradient matrix (n x m) goes as rank-" +
                  std::to_string(hook.powersgd_rank) +
                  " factors: the thin tensors all-reduced whole, then P = M Q, then Q = M^T P (three all-reduces), " +
                  (hook.error_feedback ? "the rest kept as error feedback" : "the rest lost (no error feedback)")
        : hook.kind == CommHook::TopK && hook.error_feedback
            ? std::string("each rank adds its remembered error to a bucket, keeps the ") + share +
                  " of its entries largest in magnitude and all-gathers them with their int64 indices; the rest is its new error"
        : hook.kind == CommHook::TopK
            ? std::string("each rank keeps the ") + share +
                  " of a bucket's entries largest in magnitude and all-gathers them with their int64 indices; the rest is lost "
                  "(no error feedback)"
            : std::string("each bucket cast to ") + (hook.kind == CommHook::Fp16 ? "float16" : "bfloat16") +
                  " and divided by the world size, all-reduced, cast back";
    if (wire > 0)
      ImGui::TextWrapped("comm hook %s: %s: %s sent for %s of gradients (%.2gx smaller)", comm_hook_torch_name(hook), how.c_str(),
                         human_bytes(wire).c_str(), human_bytes(held).c_str(), static_cast<double>(held) / static_cast<double>(wire));
    else
      ImGui::TextWrapped("comm hook %s: %s", comm_hook_torch_name(hook), how.c_str());
  }
  ImGui::PopTextWrapPos();
  if (key) draw_legend(fs);
  ImGui::Separator();
}

// Lines a row's header column takes: name, sizes, launch, and one per collective of a hook that issues several.
float header_lines(const BucketView& b) { return 3.0f + static_cast<float>(b.parts.size()); }

// The header's line for collective k of a bucket's several: "  #23 P · 1.0 KiB".
std::string part_line(const BucketView& b, CommHook hook, size_t k) {
  const BucketCollective& c = b.parts[k];
  return "  #" + std::to_string(c.seq) + " " + bucket_part_name(hook, static_cast<int>(k), static_cast<int>(b.parts.size())) +
         " \xC2\xB7 " + (c.bytes >= 0 ? human_bytes(c.bytes) : std::string("not issued"));
}

// ---- rows: header column, then the cells (wrapping when many small ones do not fit)
struct RowLayout {
  float fs = 16, head_w = 0, avail_w = 0, cells_w = 0, cell_h = 0, gap = 3.0f;
  float min_w = 0;    // the narrowest cell: room for a parameter's name
  double scale = 0;   // cell pixels per gradient byte
};

RowLayout row_layout(const Snapshot& s, float fs) {
  RowLayout lay;
  lay.fs = fs;
  lay.head_w = std::max(13.0f * fs, ImGui::CalcTextSize("launch #0 \xC2\xB7 all-reduce #000").x + fs);
  for (const BucketView& b : s.buckets)  // a hook's collectives, each on its line
    for (size_t k = 0; k < b.parts.size(); k++)
      lay.head_w = std::max(lay.head_w, ImGui::CalcTextSize(part_line(b, s.config.comm_hook.kind, k).c_str()).x + 1.6f * fs);
  lay.avail_w = ImGui::GetContentRegionAvail().x;
  lay.cells_w = std::max(lay.avail_w - lay.head_w - 0.5f * fs, 6.0f * fs);
  lay.cell_h = 2.35f * fs;
  // Cells are as wide as their bytes, but never too narrow for a parameter's name.
  float name_w = 0;
  int64_t largest = 1;
  for (const BucketView& b : s.buckets) {
    largest = std::max(largest, b.bytes);
    for (const BucketParam& p : b.params) name_w = std::max(name_w, ImGui::CalcTextSize(p.name.c_str()).x);
  }
  lay.min_w = std::clamp(name_w + 0.7f * fs, 3.0f * fs, 7.0f * fs);
  auto widest_row = [&](double px_per_byte) {
    float widest = 0;
    for (const BucketView& b : s.buckets) {
      float w = 0;
      for (const BucketParam& p : b.params) w += std::max(lay.min_w, static_cast<float>(static_cast<double>(p.bytes) * px_per_byte)) + lay.gap;
      widest = std::max(widest, w - lay.gap);
    }
    return widest;
  };
  // The largest px per byte at which every bucket fits on one line (rows wrap only when the minimum
  // widths alone overflow).
  lay.scale = static_cast<double>(lay.cells_w) / static_cast<double>(largest);
  if (widest_row(lay.scale) > lay.cells_w && widest_row(0) <= lay.cells_w) {
    double lo = 0, hi = lay.scale;
    for (int i = 0; i < 40; i++) {
      const double mid = 0.5 * (lo + hi);
      (widest_row(mid) <= lay.cells_w ? lo : hi) = mid;
    }
    lay.scale = lo;
  }
  return lay;
}

// What the mouse is over, for the tooltip drawn after every row.
struct Hovered {
  const BucketParam* param = nullptr;
  const BucketView* param_bucket = nullptr;
  const BucketView* bucket = nullptr;  // its header column
};

struct Cell {
  ImVec2 a, b;  // relative to the row's first cell
};

// Header column: name, state, sizes, launch and all-reduce (each of a hook's collectives on a line of
// its own, with what it carries and the bytes each rank puts in).
void draw_row_header(ImDrawList* dl, const BucketView& b, CommHook hook, const RowLayout& lay, ImVec2 p0, float row_h) {
  const float fs = lay.fs;
  dl->AddRectFilled(ImVec2(p0.x, p0.y), ImVec2(p0.x + 0.25f * fs, p0.y + row_h - 0.6f * fs), bucket_state_color(b.state));
  char text[128];
  std::snprintf(text, sizeof text, "bucket %d", b.index);
  const float tx = p0.x + 0.6f * fs;
  dl->AddText(ImVec2(tx, p0.y + 0.2f * fs), ImGui::GetColorU32(ImGuiCol_Text), text);
  state_badge(dl, ImVec2(tx + ImGui::CalcTextSize("bucket 00 ").x + 0.3f * fs, p0.y + 0.1f * fs), b.state);
  int ready_params = 0;
  for (const BucketParam& p : b.params) ready_params += p.ready ? 1 : 0;
  std::snprintf(text, sizeof text, "%s \xC2\xB7 %d of %d ready", human_bytes(b.bytes).c_str(), ready_params,
                static_cast<int>(b.params.size()));
  dl->AddText(ImVec2(tx, p0.y + 1.3f * fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), text);
  const char* op = b.gathered ? "all-gather" : "all-reduce";
  if (b.launch_order >= 0 && !b.parts.empty())
    std::snprintf(text, sizeof text, "launch #%d \xC2\xB7 %d %ss:", b.launch_order, static_cast<int>(b.parts.size()), op);
  else if (b.launch_order >= 0)
    std::snprintf(text, sizeof text, "launch #%d \xC2\xB7 %s #%llu", b.launch_order, op, static_cast<unsigned long long>(b.seq));
  else
    std::snprintf(text, sizeof text, "not launched yet");
  dl->AddText(ImVec2(tx, p0.y + 2.35f * fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), text);
  for (size_t k = 0; k < b.parts.size(); k++) {
    const ImU32 col = b.parts[k].done ? bucket_state_color(BucketState::Done) : ImGui::GetColorU32(ImGuiCol_TextDisabled);
    dl->AddText(ImVec2(tx, p0.y + (2.35f + 1.05f * static_cast<float>(k + 1)) * fs), col, part_line(b, hook, k).c_str());
  }
}

// Cells: empty ones are outlines, ready ones take the bucket's state color.
void draw_cells(ImDrawList* dl, const BucketView& b, const std::vector<Cell>& cells, ImVec2 c0, float fs, bool window_hovered,
                Hovered& hovered) {
  const ImU32 state_col = bucket_state_color(b.state);
  char text[128];
  for (size_t i = 0; i < b.params.size(); i++) {
    const BucketParam& p = b.params[i];
    const ImVec2 a(c0.x + cells[i].a.x, c0.y + cells[i].a.y), e(c0.x + cells[i].b.x, c0.y + cells[i].b.y);
    const ImU32 fill = p.ready ? state_col : ImGui::GetColorU32(ImGuiCol_FrameBg);
    dl->AddRectFilled(a, e, fill, 0.15f * fs);
    dl->AddRect(a, e, p.ready ? with_alpha(IM_COL32(0, 0, 0, 255), 0.45f) : IM_COL32(120, 124, 134, 200), 0.15f * fs, 0,
                p.ready ? 1.0f : 1.5f);
    const ImU32 ink = p.ready ? ink_on(fill) : ImGui::GetColorU32(ImGuiCol_Text, 0.8f);
    cell_text(dl, a, e, ImVec2(a.x + 0.3f * fs, a.y + 0.15f * fs), ink, p.name.c_str());
    // Second line: ready order and size, or what of it fits.
    if (p.ready) std::snprintf(text, sizeof text, "#%d \xC2\xB7 %s", p.ready_order, human_bytes(p.bytes).c_str());
    else std::snprintf(text, sizeof text, "%s", human_bytes(p.bytes).c_str());
    if (ImGui::CalcTextSize(text).x > e.x - a.x - 0.6f * fs) {
      if (p.ready) std::snprintf(text, sizeof text, "#%d", p.ready_order);
      else text[0] = 0;
    }
    cell_text(dl, a, e, ImVec2(a.x + 0.3f * fs, a.y + 1.15f * fs), with_alpha(ink, 0.8f), text);
    if (window_hovered && ImGui::IsMouseHoveringRect(a, e)) hovered.param = &p, hovered.param_bucket = &b;
  }
}

// While the all-reduce runs, stripes slide over the bucket's cells.
void draw_allreduce_stripes(ImDrawList* dl, const std::vector<Cell>& cells, ImVec2 c0, float fs, double time) {
  for (const Cell& cell : cells) {
    const ImVec2 a(c0.x + cell.a.x, c0.y + cell.a.y), e(c0.x + cell.b.x, c0.y + cell.b.y);
    dl->PushClipRect(a, e, true);
    const float spacing = 1.2f * fs, h = e.y - a.y;
    const float shift = std::fmod(static_cast<float>(time) * 2.0f * fs, spacing);
    for (float sx = a.x - h - spacing + shift; sx < e.x; sx += spacing)
      dl->AddLine(ImVec2(sx, e.y), ImVec2(sx + h, a.y), IM_COL32(255, 255, 255, 45), 0.3f * fs);
    dl->PopClipRect();
  }
}

void draw_bucket_row(ImDrawList* dl, const BucketView& b, CommHook hook, const RowLayout& lay, double time, bool window_hovered,
                     Hovered& hovered) {
  const float fs = lay.fs;
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  // Lay the cells out first, so the row knows its height.
  std::vector<Cell> cells;
  cells.reserve(b.params.size());
  float x = 0, y = 0;
  for (const BucketParam& p : b.params) {
    const float w = std::min(lay.cells_w, std::max(lay.min_w, static_cast<float>(static_cast<double>(p.bytes) * lay.scale)));
    if (x > 0 && x + w > lay.cells_w) x = 0, y += lay.cell_h + lay.gap;
    cells.push_back({ImVec2(x, y), ImVec2(x + w, y + lay.cell_h)});
    x += w + lay.gap;
  }
  const float bar_h = 0.4f * fs;
  const float cells_h = y + lay.cell_h + 0.3f * fs + bar_h;
  const float row_h = std::max(cells_h, (1.05f * header_lines(b) + 0.25f) * fs) + 0.6f * fs;
  const ImVec2 c0(p0.x + lay.head_w, p0.y + 0.3f * fs);

  draw_row_header(dl, b, hook, lay, p0, row_h);
  if (window_hovered && ImGui::IsMouseHoveringRect(p0, ImVec2(p0.x + lay.head_w, p0.y + row_h))) hovered.bucket = &b;
  draw_cells(dl, b, cells, c0, fs, window_hovered, hovered);
  if (b.state == BucketState::AllReducing) draw_allreduce_stripes(dl, cells, c0, fs, time);
  // Progress: ready bytes of the bucket's bytes, under the cells.
  int64_t ready_bytes = 0;
  for (const BucketParam& p : b.params)
    if (p.ready) ready_bytes += p.bytes;
  const ImU32 state_col = bucket_state_color(b.state);
  const float row_w = std::min(lay.cells_w, static_cast<float>(static_cast<double>(b.bytes) * lay.scale));
  const float bar_w = std::max(row_w, cells.empty() ? 0.0f : cells.back().b.x);
  const float by = c0.y + y + lay.cell_h + 0.3f * fs;
  const double frac = b.bytes > 0 ? static_cast<double>(ready_bytes) / static_cast<double>(b.bytes) : 0.0;
  dl->AddRectFilled(ImVec2(c0.x, by), ImVec2(c0.x + bar_w, by + bar_h), ImGui::GetColorU32(ImGuiCol_FrameBg), 0.2f * fs);
  dl->AddRectFilled(ImVec2(c0.x, by), ImVec2(c0.x + bar_w * static_cast<float>(std::min(frac, 1.0)), by + bar_h), state_col,
                    0.2f * fs);
  ImGui::Dummy(ImVec2(lay.avail_w, row_h));
  dl->AddLine(ImVec2(p0.x, p0.y + row_h - 0.3f * fs), ImVec2(p0.x + lay.avail_w, p0.y + row_h - 0.3f * fs),
              IM_COL32(255, 255, 255, 22));
}

void param_tooltip(const BucketParam& p, const BucketView& b) {
  ImGui::BeginTooltip();
  ImGui::Text("%s", p.name.c_str());
  ImGui::TextDisabled("bucket %d, parameter %d of the model", b.index, p.index);
  ImGui::Text("gradient %s", human_bytes(p.bytes).c_str());
  if (p.ready)
    ImGui::Text("ready #%d in this backward pass (0 = first)", p.ready_order);
  else
    ImGui::TextDisabled("not ready yet in this backward pass");
  ImGui::EndTooltip();
}

void bucket_tooltip(const BucketView& b, CommHook hook) {
  ImGui::BeginTooltip();
  ImGui::Text("bucket %d \xC2\xB7 generation %d \xC2\xB7 %s", b.index, b.generation, human_bytes(b.bytes).c_str());
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(bucket_state_color(b.state)), "%s", bucket_state_name(b.state));
  ImGui::SameLine();
  ImGui::TextDisabled("%s", state_meaning(b.state));
  if (b.launch_order >= 0 && !b.parts.empty()) {
    ImGui::Text("launched #%d as %d %s, each waited for in turn:", b.launch_order, static_cast<int>(b.parts.size()),
                b.gathered ? "all-gathers" : "all-reduces");
    for (size_t k = 0; k < b.parts.size(); k++)
      ImGui::BulletText("#%llu: %s, %s per rank%s", static_cast<unsigned long long>(b.parts[k].seq),
                        bucket_part_name(hook, static_cast<int>(k), static_cast<int>(b.parts.size())),
                        b.parts[k].bytes >= 0 ? human_bytes(b.parts[k].bytes).c_str() : "not issued yet", b.parts[k].done ? " (done)" : "");
  } else if (b.launch_order >= 0) {
    ImGui::Text("launched #%d as %s #%llu", b.launch_order, b.gathered ? "all-gathers (values, indices) from" : "all-reduce",
                static_cast<unsigned long long>(b.seq));
  }
  if (b.wire_bytes > 0 && b.wire_bytes != b.bytes)
    ImGui::Text("the comm hook sent %s of it (%.2gx smaller)", human_bytes(b.wire_bytes).c_str(),
                static_cast<double>(b.bytes) / static_cast<double>(b.wire_bytes));
  if (b.state == BucketState::Done && b.allreduce_end > b.allreduce_begin) {
    char t0[32], dt[32];
    std::snprintf(t0, sizeof t0, "%.3f ms", b.allreduce_begin * 1e3);
    std::snprintf(dt, sizeof dt, "%.3f ms", (b.allreduce_end - b.allreduce_begin) * 1e3);
    ImGui::Text("all-reduce took %s (modeled), from %s", dt, t0);
  }
  ImGui::TextDisabled("Buckets launch strictly in order, so every rank issues the same all-reduces.");
  ImGui::EndTooltip();
}

}  // namespace

void draw_bucket_view(const Snapshot& s, ViewContext& ctx) {
  const float fs = ImGui::GetFontSize();
  if (s.buckets.empty()) {
    draw_no_buckets(s);
    return;
  }
  // Fewer words in presentation, on a side of an A/B comparison, and in a short tile (the rows below
  // need a few lines of their own).
  const bool short_tile = ImGui::GetContentRegionAvail().y < 12 * ImGui::GetTextLineHeightWithSpacing();
  draw_header(s, fs, ctx.presentation || ctx.compare_side != 0 || short_tile, ctx.compare_side != 2);
  ImGui::BeginChild("##bucket_rows", ImVec2(0, 0), false);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const RowLayout lay = row_layout(s, fs);
  const bool window_hovered = ImGui::IsWindowHovered();
  Hovered hovered;
  const CommHook hook = s.config.comm_hook.kind;
  for (const BucketView& b : s.buckets) draw_bucket_row(dl, b, hook, lay, ctx.time, window_hovered, hovered);
  if (hovered.param) param_tooltip(*hovered.param, *hovered.param_bucket);
  else if (hovered.bucket) bucket_tooltip(*hovered.bucket, hook);
  ImGui::EndChild();
}

}  // namespace dtlab::app
