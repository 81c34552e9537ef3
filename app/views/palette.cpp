// The colors every view shares, so rank 2 is the same orange in the ring, the timeline and the data
// scatter, and a state or a memory category reads the same wherever it appears. All are chosen to
// stay readable on ImGui's dark background and on a projector.
#include <algorithm>
#include <cmath>
#include <cfloat>
#include <cstdio>
#include <cstring>
#include <string>

#include "app/views/views.h"

#include <imgui_internal.h>  // flow: the window's wrap position

namespace dtlab::app {

namespace {

// Tableau 10 hues, lifted for a dark background, then six further hues that stay apart from
// the first ten; ranks 0..7 (the usual worlds) get the most distinct ones.
constexpr ImU32 kRankColors[16] = {
    IM_COL32(78, 154, 232, 255),   // blue
    IM_COL32(242, 142, 43, 255),   // orange
    IM_COL32(98, 190, 90, 255),    // green
    IM_COL32(229, 87, 89, 255),    // red
    IM_COL32(178, 132, 224, 255),  // purple
    IM_COL32(237, 201, 72, 255),   // yellow
    IM_COL32(79, 193, 192, 255),   // teal
    IM_COL32(255, 157, 167, 255),  // pink
    IM_COL32(192, 138, 91, 255),   // brown
    IM_COL32(170, 210, 60, 255),   // lime
    IM_COL32(150, 210, 248, 255),  // sky
    IM_COL32(226, 104, 208, 255),  // magenta
    IM_COL32(140, 140, 255, 255),  // indigo
    IM_COL32(255, 190, 130, 255),  // apricot
    IM_COL32(150, 230, 180, 255),  // mint
    IM_COL32(185, 180, 110, 255),  // olive
};

ImU32 lerp_color(ImU32 a, ImU32 b, float t) {
  t = std::clamp(t, 0.0f, 1.0f);
  auto ch = [&](int shift) {
    const float x = static_cast<float>((a >> shift) & 0xFF), y = static_cast<float>((b >> shift) & 0xFF);
    return static_cast<ImU32>(x + (y - x) * t + 0.5f) << shift;
  };
  return ch(IM_COL32_R_SHIFT) | ch(IM_COL32_G_SHIFT) | ch(IM_COL32_B_SHIFT) | ch(IM_COL32_A_SHIFT);
}

}  // namespace

ImU32 with_alpha(ImU32 c, float alpha) {
  const float a = std::clamp(alpha, 0.0f, 1.0f) * static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF);
  return (c & ~IM_COL32_A_MASK) | (static_cast<ImU32>(a + 0.5f) << IM_COL32_A_SHIFT);
}

ImU32 ink_on(ImU32 fill) {
  const ImVec4 c = ImGui::ColorConvertU32ToFloat4(fill);
  return 0.299f * c.x + 0.587f * c.y + 0.114f * c.z > 0.5f ? IM_COL32(16, 18, 22, 255) : IM_COL32(236, 236, 240, 255);
}

ImU32 darker(ImU32 c, float k) {
  const ImVec4 v = ImGui::ColorConvertU32ToFloat4(c);
  return ImGui::ColorConvertFloat4ToU32(ImVec4(v.x * k, v.y * k, v.z * k, v.w));
}

ImU32 work_color(Work w) {
  switch (w) {
    case Work::Forward: return IM_COL32(96, 148, 232, 255);            // blue
    case Work::Backward: return IM_COL32(238, 128, 64, 255);           // orange
    case Work::Loss: return IM_COL32(226, 196, 72, 255);               // yellow
    case Work::Optimizer: return IM_COL32(112, 196, 104, 255);         // green
    case Work::Communication: return IM_COL32(64, 190, 192, 255);      // teal
    case Work::CommUnderCompute: return IM_COL32(255, 236, 110, 255);  // light yellow: hidden, as it should be
  }
  return IM_COL32(128, 128, 128, 255);
}

ImU32 rank_color(int rank, int world, float alpha) {
  if (rank < 0) return with_alpha(IM_COL32(128, 128, 128, 255), alpha);
  (void)world;  // colors do not depend on the world size: rank 1 stays orange when the world grows
  if (rank < 16) return with_alpha(kRankColors[rank % 16], alpha);
  // Beyond the table: golden-ratio hue steps keep neighbours apart at any world size.
  const float hue = std::fmod(0.58f + 0.618034f * static_cast<float>(rank), 1.0f);
  float r, g, b;
  ImGui::ColorConvertHSVtoRGB(hue, 0.55f, 0.95f, r, g, b);
  return ImGui::ColorConvertFloat4ToU32(ImVec4(r, g, b, std::clamp(alpha, 0.0f, 1.0f)));
}

ImU32 bucket_state_color(BucketState s) {
  switch (s) {
    case BucketState::Empty: return IM_COL32(92, 96, 104, 255);         // grey: nothing yet
    case BucketState::Filling: return IM_COL32(240, 160, 48, 255);      // amber: some gradients in
    case BucketState::Ready: return IM_COL32(190, 214, 60, 255);        // yellow-green: all in, waiting
    case BucketState::Launched: return IM_COL32(150, 120, 230, 255);    // violet: issued, queued
    case BucketState::AllReducing: return IM_COL32(64, 146, 230, 255);  // blue: on the wire
    case BucketState::Done: return IM_COL32(60, 190, 110, 255);         // green: averaged
  }
  return IM_COL32(128, 128, 128, 255);
}

ImU32 memory_category_color(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return IM_COL32(91, 143, 249, 255);      // blue
    case MemCategory::Gradients: return IM_COL32(246, 144, 61, 255);       // orange
    case MemCategory::OptimizerState: return IM_COL32(160, 118, 222, 255); // purple
    case MemCategory::Activations: return IM_COL32(90, 216, 166, 255);     // mint
    case MemCategory::CommBuffers: return IM_COL32(246, 201, 22, 255);     // yellow
    case MemCategory::Other: return IM_COL32(138, 143, 152, 255);          // grey
    case MemCategory::GatheredParameters: return IM_COL32(120, 200, 250, 255);  // light blue: unsharded params
    case MemCategory::MasterWeights: return IM_COL32(40, 80, 190, 255);          // deep blue: fp32 copy of the params
  }
  return IM_COL32(128, 128, 128, 255);
}

ImU32 skipped_step_color() { return IM_COL32(232, 40, 40, 255); }

ImU32 pipeline_action_color(ActionType t, int mb, int microbatches) {
  float hue = 0.60f;  // F: blue
  if (t == ActionType::Backward) hue = 0.075f;            // orange
  else if (t == ActionType::BackwardInput) hue = 0.985f;  // red
  else if (t == ActionType::BackwardWeight) hue = 0.36f;  // green
  const float k = microbatches > 1 ? static_cast<float>(mb) / static_cast<float>(microbatches - 1) : 0.0f;
  float r, g, b;
  ImGui::ColorConvertHSVtoRGB(hue, 0.38f + 0.37f * k, 0.98f - 0.30f * k, r, g, b);
  return ImGui::ColorConvertFloat4ToU32(ImVec4(r, g, b, 1.0f));
}

void centered_text(ImDrawList* dl, ImVec2 center, ImU32 col, const std::string& s) {
  const ImVec2 sz = ImGui::CalcTextSize(s.c_str());
  dl->AddText(ImVec2(center.x - sz.x * 0.5f, center.y - sz.y * 0.5f), col, s.c_str());
}

void draw_hatch(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float spacing) {
  const ImDrawListFlags flags = dl->Flags;
  dl->Flags &= ~ImDrawListFlags_AntiAliasedLines;
  dl->PushClipRect(a, b, true);
  const float h = b.y - a.y;
  for (float x = a.x - h; x < b.x; x += spacing) dl->AddLine(ImVec2(x, b.y), ImVec2(x + h, a.y), col, 1.0f);
  dl->PopClipRect();
  dl->Flags = flags;
}

std::string time_text(double s) {
  const double a = std::fabs(s);
  double v = s;
  const char* unit = "s";
  if (a < 1e-6) v = s * 1e9, unit = "ns";
  else if (a < 1e-3) v = s * 1e6, unit = "\xC2\xB5s";
  else if (a < 1) v = s * 1e3, unit = "ms";
  const double av = std::fabs(v);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*f %s", av >= 100 || a == 0 ? 0 : av >= 10 ? 1 : 2, v, unit);
  return buf;
}

ImU32 algorithm_color(Algorithm a) {
  switch (a) {
    case Algorithm::Ring: return IM_COL32(90, 170, 255, 255);
    case Algorithm::Tree: return IM_COL32(120, 210, 120, 255);
    case Algorithm::Naive: return IM_COL32(160, 160, 170, 255);
    case Algorithm::DoubleTree: return IM_COL32(255, 170, 70, 255);
    case Algorithm::Hierarchical: return IM_COL32(200, 130, 255, 255);
    case Algorithm::InNetwork: return IM_COL32(250, 100, 110, 255);
    default: return IM_COL32_WHITE;
  }
}

ImU32 link_load_color(RingPhase p, int load) {
  if (load >= 2) return IM_COL32(235, 70, 60, 255);
  switch (p) {
    case RingPhase::AllGather:
    case RingPhase::Broadcast: return IM_COL32(90, 200, 235, 255);
    default: return IM_COL32(255, 170, 70, 255);
  }
}

ImU32 contribution_color(int held, int world) {
  constexpr ImU32 kEmpty = IM_COL32(58, 61, 66, 255);
  constexpr ImU32 kFinal = IM_COL32(64, 200, 120, 255);
  constexpr ImU32 kFew = IM_COL32(150, 84, 40, 255);    // only its own data: dim sienna
  constexpr ImU32 kMost = IM_COL32(255, 206, 70, 255);  // one short of the sum: bright gold
  if (held <= 0) return kEmpty;
  if (held >= world) return kFinal;
  const float t = world > 2 ? static_cast<float>(held - 1) / static_cast<float>(world - 2) : 0.0f;
  return lerp_color(kFew, kMost, t);
}

ImU32 roofline_kind_color(RooflineKind k) {
  switch (k) {
    case RooflineKind::Gemm: return work_color(Work::Forward);
    case RooflineKind::Elementwise: return IM_COL32(120, 210, 120, 255);
    case RooflineKind::Optimizer: return IM_COL32(226, 128, 226, 255);  // apart from the element-wise green
    case RooflineKind::Collective: return work_color(Work::Communication);
  }
  return IM_COL32_WHITE;
}

ImU32 roof_fraction_color(double f) {
  // Dark red (far under the roof) through amber to bright green (at it): readable on the dark theme
  // and, at its ends, by the red-green colour-blind as dark against light.
  const float t = static_cast<float>(std::clamp(f, 0.0, 1.0));
  const ImVec4 lo(0.55f, 0.10f, 0.12f, 1), mid(0.95f, 0.62f, 0.15f, 1), hi(0.55f, 0.95f, 0.45f, 1);
  const float u = t < 0.5f ? t * 2 : (t - 0.5f) * 2;
  const ImVec4 a = t < 0.5f ? lo : mid, b = t < 0.5f ? mid : hi;
  return ImGui::ColorConvertFloat4ToU32(ImVec4(a.x + (b.x - a.x) * u, a.y + (b.y - a.y) * u, a.z + (b.z - a.z) * u, 1));
}

ImU32 side_color(bool a) { return a ? IM_COL32(120, 200, 255, 255) : IM_COL32(255, 196, 90, 255); }

void flow(float w, float spacing) {
  if (spacing < 0) spacing = ImGui::GetStyle().ItemSpacing.x;
  float right = ImGui::GetWindowPos().x + ImGui::GetContentRegionMax().x;  // a table cell's edge inside a table
  // Short of a wrap position when one is set (text would wrap there, a glyph a line).
  const ImGuiWindow* win = ImGui::GetCurrentWindow();
  if (win->DC.TextWrapPos > 0) right = std::min(right, win->Pos.x - win->Scroll.x + win->DC.TextWrapPos);
  if (ImGui::GetItemRectMax().x + spacing + w <= right) ImGui::SameLine(0, spacing);
}

std::string fit_text(const std::string& text, float width, float font_size, const char* dots_text) {
  ImFont* font = ImGui::GetFont();
  auto measure = [&](const char* b, const char* e) {
    return font_size > 0 ? font->CalcTextSizeA(font_size, FLT_MAX, 0, b, e).x : ImGui::CalcTextSize(b, e).x;
  };
  if (measure(text.c_str(), text.c_str() + text.size()) <= width) return text;
  const float dots = measure(dots_text, dots_text + std::strlen(dots_text));
  size_t lo = 0, hi = text.size();  // the longest prefix that fits beside the dots
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    if (measure(text.c_str(), text.c_str() + mid) + dots <= width) lo = mid;
    else hi = mid - 1;
  }
  while (lo > 0 && (static_cast<unsigned char>(text[lo]) & 0xC0) == 0x80) lo--;
  return text.substr(0, lo) + dots_text;
}

}  // namespace dtlab::app
