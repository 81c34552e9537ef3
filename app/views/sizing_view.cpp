// The Sizing view: the Ultra-Scale Playbook's calculator made live. Controls for the model's shape,
// the global batch, dp x tp x pp, precision, ZeRO stage, recomputation, a hardware profile and an MFU
// on the left; on the right the memory per GPU as one bar by category against the GPU's memory, and
// every figure of plan_sizing (engine/parallel/sizing.h) with its formula, the same lines `dtlab-cli
// plan --global-batch` prints. "Run it scaled down" asks the app to restart the lab's run with the
// layout mirrored on the built-in MLP (sizing_mirror_flags).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/check.h"
#include "engine/parallel/sizing.h"

namespace dtlab::app {

namespace {

// A whole-number slider over powers of two (degrees, batch, sequence): the exponent moves, the
// value shown is 2^k. Returns true when the value changed.
bool pow2_slider(const char* label, int64_t& v, int lo_log2, int hi_log2) {
  int k = static_cast<int>(std::lround(std::log2(static_cast<double>(std::max<int64_t>(v, 1)))));
  char shown[32];
  std::snprintf(shown, sizeof shown, "%lld", static_cast<long long>(int64_t(1) << std::clamp(k, lo_log2, hi_log2)));
  if (!ImGui::SliderInt(label, &k, lo_log2, hi_log2, shown, ImGuiSliderFlags_AlwaysClamp)) return false;
  v = int64_t(1) << k;
  return true;
}

bool pow2_slider(const char* label, int& v, int lo_log2, int hi_log2) {
  int64_t w = v;
  if (!pow2_slider(label, w, lo_log2, hi_log2)) return false;
  v = static_cast<int>(w);
  return true;
}

struct Preset {
  const char* name;
  const char* spec;
};
// The lesson's layouts (lessons/25_sizing_a_run.md), one click each.
const Preset kPresets[] = {
    {"70B, TP 8 x DP 64", "params=70B layers=80 hidden=8192 heads=64 seq=4096 global_batch=512 micro_batch=1 dp=64 tp=8 pp=1 "
                          "precision=bf16 zero=1 recompute=0 sp=1 profile=dgx-h100x2 mfu=0.4 compute_s=0"},
    {"70B, pure DP (course)", "params=70B layers=80 hidden=8192 heads=64 seq=4096 global_batch=128 micro_batch=1 dp=128 tp=1 pp=1 "
                              "precision=fp16 zero=0 recompute=0 sp=0 profile=dgx-h100x2 mfu=0.4 compute_s=10"},
    {"7B fine-tune", "params=7B layers=32 hidden=4096 heads=32 seq=4096 global_batch=64 micro_batch=2 dp=8 tp=1 pp=1 "
                     "precision=bf16 zero=3 recompute=1 sp=0 profile=dgx-h100 mfu=0.4 compute_s=0"},
};

void draw_controls(SizingInput& in, ViewContext& ctx, const SizingViewState& state) {
  const float w = ImGui::GetContentRegionAvail().x;
  for (const Preset& p : kPresets) {
    const float bw = ImGui::CalcTextSize(p.name).x + 2 * ImGui::GetStyle().FramePadding.x;
    flow(bw);
    if (ImGui::Button(p.name)) in = parse_sizing_spec(p.spec);
  }
  ImGui::PushItemWidth(std::max(ImGui::GetFontSize() * 6, w - ImGui::CalcTextSize("global batch B").x - ImGui::GetStyle().ItemInnerSpacing.x));
  float billions = static_cast<float>(in.params / 1e9);
  if (ImGui::SliderFloat("parameters N", &billions, 0.1f, 1000.0f, "%.1fB", ImGuiSliderFlags_Logarithmic | ImGuiSliderFlags_AlwaysClamp))
    in.params = std::round(double(billions) * 10) * 1e8;
  ImGui::SliderInt("layers L", &in.layers, 1, 160, "%d", ImGuiSliderFlags_AlwaysClamp);
  int hidden_k = static_cast<int>(in.hidden / 128);
  char hidden_shown[32];
  std::snprintf(hidden_shown, sizeof hidden_shown, "%lld", static_cast<long long>(in.hidden));
  if (ImGui::SliderInt("hidden h", &hidden_k, 1, 160, hidden_shown, ImGuiSliderFlags_AlwaysClamp)) in.hidden = int64_t(hidden_k) * 128;
  ImGui::SliderInt("heads a", &in.heads, 1, 128, "%d", ImGuiSliderFlags_AlwaysClamp);
  pow2_slider("sequence s", in.seq, 7, 17);
  pow2_slider("global batch B", in.global_batch, 0, 14);
  pow2_slider("micro-batch b", in.micro_batch, 0, 6);
  pow2_slider("dp", in.dp, 0, 12);
  pow2_slider("tp", in.tp, 0, 4);
  pow2_slider("pp", in.pp, 0, 6);
  int precision = in.precision == PlanDType::Fp32 ? 0 : in.precision == PlanDType::Bf16 ? 1 : 2;
  if (ImGui::Combo("precision", &precision, "fp32\0bf16\0fp16\0"))
    in.precision = precision == 0 ? PlanDType::Fp32 : precision == 1 ? PlanDType::Bf16 : PlanDType::Fp16;
  ImGui::SliderInt("ZeRO stage", &in.zero, 0, 3, "%d", ImGuiSliderFlags_AlwaysClamp);
  const std::vector<std::string> names = profile_names();
  if (ImGui::BeginCombo("profile", in.profile.c_str())) {
    for (const std::string& n : names)
      if (n != "this" && n != "ideal" && ImGui::Selectable(n.c_str(), n == in.profile)) in.profile = n;
    ImGui::EndCombo();
  }
  float mfu = static_cast<float>(in.mfu * 100);
  if (ImGui::SliderFloat("MFU", &mfu, 5, 80, "%.0f%%", ImGuiSliderFlags_AlwaysClamp)) in.mfu = mfu / 100.0;
  float given = static_cast<float>(in.compute_seconds);
  if (ImGui::SliderFloat("compute s", &given, 0, 60, given > 0 ? "%.1f s given" : "from MFU", ImGuiSliderFlags_AlwaysClamp))
    in.compute_seconds = given < 0.05f ? 0 : given;
  ImGui::PopItemWidth();
  ImGui::Checkbox("recompute", &in.recompute);
  flow(ImGui::CalcTextSize("sequence parallel").x + ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x);
  ImGui::Checkbox("sequence parallel", &in.sequence_parallel);
  // One click: the same layout, scaled down, on the lab's own run.
  const std::vector<std::string> flags = sizing_mirror_flags(in);
  std::string joined;
  for (const std::string& f : flags) joined += (joined.empty() ? "" : " ") + f;
  if (ImGui::Button("Run it scaled down")) {
    ctx.sizing_restart = true;
    ctx.sizing_flags = flags;
  }
  ImGui::PushStyleColor(ImGuiCol_Text, kDim);
  ImGui::TextWrapped("restarts the lab's run on the built-in MLP: %s", joined.c_str());
  ImGui::PopStyleColor();
  if (!ctx.restart_error.empty() && state.ran) ImGui::TextWrapped("Could not run it: %s", ctx.restart_error.c_str());
}

// Memory per GPU as one stacked bar (parameters, gradients, optimizer states, activations) on a
// scale that always shows the GPU's memory as a line.
void draw_memory_bar(const SizingPlan& p, const SizingInput& in) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 o = ImGui::GetCursorScreenPos();
  const float w = ImGui::GetContentRegionAvail().x, h = ImGui::GetFrameHeight() * 1.3f;
  ImGui::InvisibleButton("##memory", ImVec2(w, h));
  const double scale = std::max(p.total, in.gpu_memory) * 1.05;
  const double parts[4] = {p.params, p.grads, p.optimizer, p.activations};
  const MemCategory cats[4] = {MemCategory::Parameters, MemCategory::Gradients, MemCategory::OptimizerState, MemCategory::Activations};
  const char* names[4] = {"parameters", "gradients", "optimizer", "activations"};
  float x = o.x;
  for (int i = 0; i < 4; i++) {
    const float x1 = x + static_cast<float>(parts[i] / scale) * w;
    dl->AddRectFilled(ImVec2(x, o.y), ImVec2(x1, o.y + h), memory_category_color(cats[i]));
    if (ImGui::IsItemHovered() && ImGui::GetIO().MousePos.x >= x && ImGui::GetIO().MousePos.x < x1)
      ImGui::SetTooltip("%s: %s", names[i], format_sizing_value(parts[i], SizingUnit::Bytes).c_str());
    x = x1;
  }
  const float gx = o.x + static_cast<float>(in.gpu_memory / scale) * w;
  dl->AddLine(ImVec2(gx, o.y - 2), ImVec2(gx, o.y + h + 2), p.fits ? kText : IM_COL32(255, 90, 90, 255), 2.0f);
  // The key, on one wrapping row.
  for (int i = 0; i < 4; i++) {
    const std::string t = std::string(names[i]) + " " + format_sizing_value(parts[i], SizingUnit::Bytes);
    const float sw = ImGui::GetTextLineHeight();
    flow(sw + ImGui::GetStyle().ItemInnerSpacing.x + ImGui::CalcTextSize(t.c_str()).x, i ? -1 : 0);
    if (i == 0) ImGui::NewLine(), ImGui::SameLine(0, 0);
    const ImVec2 c = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(c, ImVec2(c.x + sw, c.y + sw), memory_category_color(cats[i]));
    ImGui::Dummy(ImVec2(sw, sw));
    ImGui::SameLine(0, ImGui::GetStyle().ItemInnerSpacing.x);
    ImGui::TextUnformatted(t.c_str());
  }
  const std::string line = "= " + format_sizing_value(p.total, SizingUnit::Bytes) + " per GPU; the line is the GPU's " +
                           format_sizing_value(in.gpu_memory, SizingUnit::Bytes) + (p.fits ? "" : ": DOES NOT FIT");
  if (!p.fits) ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 110, 255));
  ImGui::TextWrapped("%s", line.c_str());
  if (!p.fits) ImGui::PopStyleColor();
}

// Whether a line is worth a row: not the layout (the header says it), not the memory (the bar
// shows it), not a dimension or a cost this layout does not have (its formula says "no ...": "no
// pipeline", "no context parallelism", whose imbalance is 1, not 0).
bool shown(const SizingLine& l) {
  if (l.section == "Layout" || l.section == "Memory per GPU") return false;
  return l.formula.rfind("no ", 0) != 0;
}

// One table of `sections`: label, value and (with `formulas`) the formula; the overhead in red
// above 20%. Without the formula column each row's tooltip holds it.
void draw_table(const char* id, const SizingPlan& p, const std::vector<std::string>& sections, bool formulas) {
  if (!ImGui::BeginTable(id, formulas ? 3 : 2, ImGuiTableFlags_SizingStretchProp | ImGuiTableFlags_RowBg)) return;
  ImGui::TableSetupColumn("figure", ImGuiTableColumnFlags_WidthStretch, 1.2f);
  ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthFixed, ImGui::CalcTextSize("000.00 PFLOP").x);
  if (formulas) ImGui::TableSetupColumn("formula", ImGuiTableColumnFlags_WidthStretch, 1.8f);
  for (const std::string& section : sections) {
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(140, 200, 255, 255));
    ImGui::TextWrapped("%s", section.c_str());
    ImGui::PopStyleColor();
    for (const SizingLine& l : p.lines) {
      if (l.section != section || !shown(l)) continue;
      // Compact (no formula column): a dimension's bytes go into its time row's label, one row each.
      const bool dim_bytes = l.key.size() > 6 && l.key.compare(l.key.size() - 6, 6, ".bytes") == 0 && l.key != "grad.bytes";
      if (!formulas && dim_bytes) continue;
      std::string label = l.label, tip = l.formula;
      const size_t dot = l.key.find(".seconds");
      if (!formulas && dot == 2) {  // dp.seconds, tp.seconds, pp.seconds
        const SizingLine& bytes = sizing_line(p, l.key.substr(0, 2) + ".bytes");
        label = l.label.substr(0, 4) + format_sizing_value(bytes.value, SizingUnit::Bytes) + " on its link";
        tip = bytes.formula + "; " + l.formula;
      }
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextWrapped("%s", label.c_str());
      if (!formulas && ImGui::IsItemHovered()) ImGui::SetTooltip("%s", tip.c_str());
      ImGui::TableSetColumnIndex(1);
      const std::string v = format_sizing_value(l.value, l.unit);
      const bool warn = l.key == "overhead" && l.value > 0.2;
      if (warn) ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 110, 255));
      ImGui::SetCursorPosX(ImGui::GetCursorPosX() + ImGui::GetContentRegionAvail().x - ImGui::CalcTextSize(v.c_str()).x);
      ImGui::TextUnformatted(v.c_str());
      if (warn) ImGui::PopStyleColor();
      if (!formulas) continue;
      ImGui::TableSetColumnIndex(2);
      ImGui::PushStyleColor(ImGuiCol_Text, kDim);
      ImGui::TextWrapped("%s", l.formula.c_str());
      ImGui::PopStyleColor();
    }
  }
  ImGui::EndTable();
}

}  // namespace

void draw_sizing_view(const Snapshot&, ViewContext& ctx, SizingViewState& state) {
  SizingInput& in = state.input;
  const float avail = ImGui::GetContentRegionAvail().x;
  // Normal: the controls (a form: it may scroll) beside the figures with their formulas. Presentation:
  // the controls folded away under "Settings" and the figures in three tables across the window in
  // large type, each row's formula in its tooltip (normal mode shows them all).
  const bool wide = !ctx.presentation && avail > ImGui::GetFontSize() * 70;
  if (wide) {
    ImGui::BeginChild("##sizing_controls", ImVec2(std::round(avail * 0.36f), 0), false);
    draw_controls(in, ctx, state);
    ImGui::EndChild();
    ImGui::SameLine();
  } else if (ImGui::CollapsingHeader("Settings (sliders, presets)")) {
    ImGui::BeginChild("##sizing_controls", ImVec2(0, ImGui::GetFrameHeightWithSpacing() * 8), false);
    draw_controls(in, ctx, state);
    ImGui::EndChild();
  }
  ImGui::BeginChild("##sizing_figures", ImVec2(0, 0), false);
  SizingPlan p;
  std::string error;
  try {
    p = plan_sizing(in);
  } catch (const Error& e) {
    error = e.what();
  }
  if (!error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 110, 255));
    ImGui::TextWrapped("No such run: %s.", error.c_str());
    ImGui::PopStyleColor();
    ImGui::EndChild();
    return;
  }
  ImGui::TextWrapped("%s parameters: dp %d x tp %d x pp %d = %d GPUs on %s, %s, ZeRO-%d%s; B = %lld sequences of %lld tokens, "
                     "m = %lld micro-batches of %lld per replica", param_count_str(in.params).c_str(), in.dp, in.tp, in.pp, p.world,
                     in.profile.c_str(), plan_dtype_name(in.precision), in.zero, in.recompute ? ", recompute" : "",
                     static_cast<long long>(in.global_batch), static_cast<long long>(in.seq), static_cast<long long>(p.micro_batches),
                     static_cast<long long>(in.micro_batch));
  draw_memory_bar(p, in);
  ImGui::Spacing();
  // The formulas in their column wherever they fit whole: always beside the controls; in
  // presentation when the window is wide and tall enough for one row per line (a projector at
  // 1920x1080), else three tables across with the formulas in tooltips.
  int rows = 3;
  for (const SizingLine& l : p.lines) rows += shown(l);  // with the formula column: one row per line
  const float row_h = ImGui::GetTextLineHeight() + 2 * ImGui::GetStyle().CellPadding.y;
  const bool one_table = wide || (ImGui::GetContentRegionAvail().x > ImGui::GetFontSize() * 50 &&
                                  ImGui::GetContentRegionAvail().y > rows * row_h * 1.15f);
  if (one_table) {
    draw_table("##sizing", p, {"Compute per step", "Communication per GPU per step", "Balance"}, true);
  } else {
    const float col = (ImGui::GetContentRegionAvail().x - 2 * ImGui::GetStyle().ItemSpacing.x) / 3;
    const char* sections[3] = {"Compute per step", "Communication per GPU per step", "Balance"};
    for (int i = 0; i < 3; i++) {
      if (i) ImGui::SameLine();
      ImGui::BeginGroup();
      ImGui::PushID(i);
      ImGui::BeginChild("##sizing_col", ImVec2(col, 0), false);
      draw_table("##sizing", p, {sections[i]}, false);
      ImGui::EndChild();
      ImGui::PopID();
      ImGui::EndGroup();
    }
    ImGui::EndChild();
    return;
  }
  ImGui::EndChild();
}

}  // namespace dtlab::app
