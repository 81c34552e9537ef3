// Data view: the dataset as a scatter of its first two features, each sample colored by the rank
// the DistributedSampler hands it to in the shown epoch (in a mesh: the data-parallel replica, whose
// ranks all read the same batches; or by its class), with the set_epoch switch
// that shows the classic bug (every epoch repeats epoch 0's split), and the loss and accuracy curves.
// The scatter renders with the 'points' GLSL program into a render target; the vertex buffer is
// refilled only when the assignment or the coloring changes. Without GL it draws with ImDrawList.
#include <GL/gl.h>
#include <GL/glext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "app/views/data_view.h"

namespace dtlab::app {

namespace {

constexpr ImU32 kScatterBg = IM_COL32(22, 24, 28, 255);
constexpr ImU32 kLossColor = IM_COL32(255, 138, 101, 255);
constexpr ImU32 kAccuracyColor = IM_COL32(96, 210, 160, 255);
constexpr ImU32 kDataGrid = IM_COL32(255, 255, 255, 30);

// Where the data sits in the panel: data coordinates to pixels (y up), aspect kept.
struct Fit {
  float cx = 0, cy = 0;  // data center
  float px = 1;          // pixels per data unit
  ImVec2 mid;            // panel center, screen pixels
  ImVec2 to_screen(float x, float y) const { return ImVec2(mid.x + (x - cx) * px, mid.y - (y - cy) * px); }
};

// How many owners (ranks, or replicas in a mesh) the split has.
int world_of(const Snapshot& s) {
  int world = std::max(1, s.data.owners.empty() ? s.config.world : static_cast<int>(s.data.owners.size()));
  for (int16_t o : s.data.owner) world = std::max(world, static_cast<int>(o) + 1);
  return world;
}

// "rank 3", or "replica 1 (ranks 4-7)": who trains on owner `o`'s samples.
std::string owner_text(const DataView& d, int o) {
  if (o < 0 || o >= static_cast<int>(d.owners.size())) return "rank " + std::to_string(o);
  const DataOwnerView& w = d.owners[static_cast<size_t>(o)];
  return w.ranks.empty() ? w.name : w.name + " (" + w.ranks + ")";
}

int group_of(const DataView& d, ColorBy by, size_t i) {
  if (by == ColorBy::Class) return i < d.label.size() ? d.label[i] : -1;
  return i < d.owner.size() ? d.owner[i] : -1;
}

ImU32 color_of_group(int group, ColorBy by, int world, int classes) {
  return by == ColorBy::Class ? rank_color(group, classes) : rank_color(group, world);
}

// Refills the CPU vertex array when the data, the split or the coloring changed; tracks how many
// samples changed owner between consecutive splits.
void refresh_points(const Snapshot& s, DataViewState& st) {
  const DataView& d = s.data;
  const int world = world_of(s);
  const bool same = st.key_n == d.n && st.key_epoch == d.epoch && st.key_set_epoch == d.set_epoch &&
                    st.key_color_by == st.color_by && st.key_world == world && st.key_classes == d.classes &&
                    st.key_xy == d.xy && st.key_owner == d.owner && st.key_label == d.label;
  if (same) return;

  if (st.key_owner != d.owner || st.key_n != d.n) {
    // A new split: compare it with the previous one of the same data set.
    if (!st.key_owner.empty() && st.key_owner.size() == d.owner.size() && st.key_xy == d.xy) {
      st.moved = 0;
      for (size_t i = 0; i < d.owner.size(); i++) st.moved += st.key_owner[i] != d.owner[i];
      st.prev_epoch = st.shown_epoch;
    } else {
      st.moved = -1;
      st.prev_epoch = -1;
    }
  } else if (st.key_epoch != d.epoch) {
    // The epoch advanced and the split did not change (set_epoch off): nothing moved.
    st.moved = 0;
    st.prev_epoch = st.shown_epoch;
  }
  st.shown_epoch = d.epoch;

  st.key_n = d.n;
  st.key_epoch = d.epoch;
  st.key_set_epoch = d.set_epoch;
  st.key_color_by = st.color_by;
  st.key_world = world;
  st.key_classes = d.classes;
  st.key_xy = d.xy;
  st.key_owner = d.owner;
  st.key_label = d.label;
  st.version++;

  const size_t n = std::min(static_cast<size_t>(std::max<int64_t>(d.n, 0)), d.xy.size() / 2);
  st.vertices.resize(n);
  st.min_x = st.min_y = 1e30f;
  st.max_x = st.max_y = -1e30f;
  for (size_t i = 0; i < n; i++) {
    const int g = group_of(d, st.color_by, i);
    PointVertex& v = st.vertices[i];
    v.x = d.xy[2 * i];
    v.y = d.xy[2 * i + 1];
    v.color = color_of_group(g, st.color_by, world, d.classes);
    v.group = static_cast<float>(g);
    st.min_x = std::min(st.min_x, v.x);
    st.max_x = std::max(st.max_x, v.x);
    st.min_y = std::min(st.min_y, v.y);
    st.max_y = std::max(st.max_y, v.y);
  }
  if (n == 0) st.min_x = st.min_y = 0, st.max_x = st.max_y = 1;
}

Fit fit_points(const DataViewState& st, ImVec2 pos, ImVec2 size, float pad_px) {
  Fit f;
  const float dx = std::max(st.max_x - st.min_x, 1e-6f), dy = std::max(st.max_y - st.min_y, 1e-6f);
  f.cx = 0.5f * (st.min_x + st.max_x);
  f.cy = 0.5f * (st.min_y + st.max_y);
  // A 6% margin around the data, plus room for a point's radius, same scale on both axes.
  const float w = std::max(size.x - 2 * pad_px, 1.0f), h = std::max(size.y - 2 * pad_px, 1.0f);
  f.px = std::min(w / (dx * 1.12f), h / (dy * 1.12f));
  f.mid = ImVec2(pos.x + size.x * 0.5f, pos.y + size.y * 0.5f);
  return f;
}

// Saves the GL state the scatter pass touches and puts it back, so ImGui's renderer and the other
// views find what they left.
struct GlStateGuard {
  GLint program = 0, vao = 0, array_buffer = 0;
  GLint blend_src_rgb = 0, blend_dst_rgb = 0, blend_src_a = 0, blend_dst_a = 0;
  GLboolean blend = GL_FALSE, scissor = GL_FALSE, depth = GL_FALSE, point_size = GL_FALSE;
  GLfloat clear[4] = {0, 0, 0, 0};
  GlStateGuard() {
    glGetIntegerv(GL_CURRENT_PROGRAM, &program);
    glGetIntegerv(GL_VERTEX_ARRAY_BINDING, &vao);
    glGetIntegerv(GL_ARRAY_BUFFER_BINDING, &array_buffer);
    glGetIntegerv(GL_BLEND_SRC_RGB, &blend_src_rgb);
    glGetIntegerv(GL_BLEND_DST_RGB, &blend_dst_rgb);
    glGetIntegerv(GL_BLEND_SRC_ALPHA, &blend_src_a);
    glGetIntegerv(GL_BLEND_DST_ALPHA, &blend_dst_a);
    glGetFloatv(GL_COLOR_CLEAR_VALUE, clear);
    blend = glIsEnabled(GL_BLEND);
    scissor = glIsEnabled(GL_SCISSOR_TEST);
    depth = glIsEnabled(GL_DEPTH_TEST);
    point_size = glIsEnabled(GL_PROGRAM_POINT_SIZE);
  }
  ~GlStateGuard() {
    glUseProgram(static_cast<GLuint>(program));
    glBindVertexArray(static_cast<GLuint>(vao));
    glBindBuffer(GL_ARRAY_BUFFER, static_cast<GLuint>(array_buffer));
    glBlendFuncSeparate(static_cast<GLenum>(blend_src_rgb), static_cast<GLenum>(blend_dst_rgb),
                        static_cast<GLenum>(blend_src_a), static_cast<GLenum>(blend_dst_a));
    glClearColor(clear[0], clear[1], clear[2], clear[3]);
    auto set = [](GLenum cap, GLboolean on) { on ? glEnable(cap) : glDisable(cap); };
    set(GL_BLEND, blend);
    set(GL_SCISSOR_TEST, scissor);
    set(GL_DEPTH_TEST, depth);
    set(GL_PROGRAM_POINT_SIZE, point_size);
  }
};

// Renders the scatter into the "data" render target with the 'points' program and returns its
// texture, or 0 when GL or the program is unavailable (the caller then draws with ImDrawList).
unsigned render_points_gl(DataViewState& st, ViewContext& ctx, ImVec2 size, const Fit& fit, float point_px) {
  if (!ctx.gl) return 0;
  ShaderProgram* prog = ctx.gl->program("points");
  if (!prog || !prog->id()) return 0;

  const float fb_scale = std::max(ImGui::GetIO().DisplayFramebufferScale.x, 1.0f);
  const int w = std::max(1, static_cast<int>(std::lround(size.x * fb_scale)));
  const int h = std::max(1, static_cast<int>(std::lround(size.y * fb_scale)));
  RenderTarget& target = ctx.gl->target("data");

  GlStateGuard guard;
  if (st.gl != ctx.gl || !st.vao) {
    // First use, or a new set of GL resources: (re)make the buffers.
    if (st.vao) glDeleteVertexArrays(1, &st.vao);
    if (st.vbo) glDeleteBuffers(1, &st.vbo);
    glGenVertexArrays(1, &st.vao);
    glGenBuffers(1, &st.vbo);
    glBindVertexArray(st.vao);
    glBindBuffer(GL_ARRAY_BUFFER, st.vbo);
    const GLsizei stride = sizeof(PointVertex);
    glEnableVertexAttribArray(0);
    glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, stride, reinterpret_cast<void*>(offsetof(PointVertex, x)));
    glEnableVertexAttribArray(1);
    glVertexAttribPointer(1, 4, GL_UNSIGNED_BYTE, GL_TRUE, stride, reinterpret_cast<void*>(offsetof(PointVertex, color)));
    glEnableVertexAttribArray(2);
    glVertexAttribPointer(2, 1, GL_FLOAT, GL_FALSE, stride, reinterpret_cast<void*>(offsetof(PointVertex, group)));
    st.gl = ctx.gl;
    st.uploaded_version = 0;
    st.drawn_version = 0;
  }
  if (st.uploaded_version != st.version) {
    glBindBuffer(GL_ARRAY_BUFFER, st.vbo);
    glBufferData(GL_ARRAY_BUFFER, static_cast<GLsizeiptr>(st.vertices.size() * sizeof(PointVertex)),
                 st.vertices.data(), GL_STATIC_DRAW);
    st.uploaded_version = st.version;
  }

  // The target keeps its picture between frames: draw only when something visible changed.
  const bool unchanged = st.drawn_version == st.version && st.drawn_w == w && st.drawn_h == h &&
                         st.drawn_highlight == st.highlight && st.drawn_point == point_px &&
                         target.width() == w && target.height() == h;
  if (!unchanged) {
    target.begin(w, h);
    glDisable(GL_SCISSOR_TEST);
    glDisable(GL_DEPTH_TEST);
    const ImVec4 bg = ImGui::ColorConvertU32ToFloat4(kScatterBg);
    glClearColor(bg.x, bg.y, bg.z, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    glEnable(GL_BLEND);
    // Color blends as usual; alpha accumulates to 1 so ImGui shows the texture opaque.
    glBlendFuncSeparate(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA, GL_ONE, GL_ONE_MINUS_SRC_ALPHA);
    glEnable(GL_PROGRAM_POINT_SIZE);
    glUseProgram(prog->id());
    glUniform2f(prog->uniform("u_center"), fit.cx, fit.cy);
    glUniform2f(prog->uniform("u_scale"), 2.0f * fit.px / size.x, 2.0f * fit.px / size.y);
    glUniform1f(prog->uniform("u_point_size"), point_px * fb_scale);
    glUniform1f(prog->uniform("u_highlight"), static_cast<float>(st.highlight));
    glBindVertexArray(st.vao);
    const GLsizei count = static_cast<GLsizei>(st.vertices.size());
    if (st.highlight < 0) {
      glUniform1i(prog->uniform("u_pass"), 0);
      glDrawArrays(GL_POINTS, 0, count);
    } else {
      // Dimmed samples first, so the highlighted group sits on top.
      glUniform1i(prog->uniform("u_pass"), 1);
      glDrawArrays(GL_POINTS, 0, count);
      glUniform1i(prog->uniform("u_pass"), 2);
      glDrawArrays(GL_POINTS, 0, count);
    }
    target.end();
    st.drawn_version = st.version;
    st.drawn_w = w;
    st.drawn_h = h;
    st.drawn_highlight = st.highlight;
    st.drawn_point = point_px;
  }
  return target.texture();
}

// The same picture with ImDrawList, for when GL or the shader is unavailable.
void draw_points_fallback(const DataViewState& st, ImDrawList* dl, const Fit& fit, float point_px) {
  const float r = point_px * 0.5f;
  const int segments = r < 4 ? 8 : 12;
  for (int pass = 0; pass < 2; pass++) {
    for (const PointVertex& v : st.vertices) {
      const bool dim = st.highlight >= 0 && static_cast<int>(v.group) != st.highlight;
      if (st.highlight >= 0 && dim != (pass == 0)) continue;
      if (st.highlight < 0 && pass == 1) continue;
      ImVec4 c = ImGui::ColorConvertU32ToFloat4(v.color);
      if (dim) c = ImVec4(c.x * 0.55f, c.y * 0.55f, c.z * 0.55f, c.w * 0.6f);
      dl->AddCircleFilled(fit.to_screen(v.x, v.y), dim ? r * 0.75f : r, ImGui::ColorConvertFloat4ToU32(c), segments);
    }
  }
}

// The scatter panel: the points, a frame, axis names, and a tooltip for the sample under the mouse.
void draw_scatter(const Snapshot& s, ViewContext& ctx, DataViewState& st, ImVec2 size) {
  const float font = ImGui::GetFontSize();
  const ImVec2 pos = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("##data_scatter", size);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* dl = ImGui::GetWindowDrawList();

  // Point size: about half the spacing the samples would have spread evenly, within readable bounds.
  const float n = static_cast<float>(std::max<size_t>(st.vertices.size(), 1));
  const float point_px = std::round(std::clamp(0.5f * std::sqrt(size.x * size.y / n), std::max(4.0f, font * 0.3f), font * 0.8f));
  const Fit fit = fit_points(st, pos, size, point_px);

  const unsigned tex = render_points_gl(st, ctx, size, fit, point_px);
  if (tex) {
    dl->AddImage(reinterpret_cast<ImTextureID>(static_cast<intptr_t>(tex)), pos, ImVec2(pos.x + size.x, pos.y + size.y),
                 ImVec2(0, 1), ImVec2(1, 0));
  } else {
    dl->AddRectFilled(pos, ImVec2(pos.x + size.x, pos.y + size.y), kScatterBg);
    dl->PushClipRect(pos, ImVec2(pos.x + size.x, pos.y + size.y), true);
    draw_points_fallback(st, dl, fit, point_px);
    dl->PopClipRect();
  }
  dl->AddRect(pos, ImVec2(pos.x + size.x, pos.y + size.y), ImGui::GetColorU32(ImGuiCol_Border));
  const ImU32 dim_text = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  // The axes' names on a plate of their own, so the points under them (a small tile) do not garble them.
  const char* axes = ImGui::CalcTextSize("x: feature 0   y: feature 1").x + font <= size.x ? "x: feature 0   y: feature 1" : "x: f0  y: f1";
  const ImVec2 at(pos.x + font * 0.4f, pos.y + size.y - font * 1.4f), tsz = ImGui::CalcTextSize(axes);
  dl->AddRectFilled(ImVec2(at.x - font * 0.2f, at.y - font * 0.1f), ImVec2(at.x + tsz.x + font * 0.2f, at.y + tsz.y + font * 0.1f),
                    ImGui::GetColorU32(ImGuiCol_WindowBg, 0.8f), font * 0.2f);
  dl->AddText(at, dim_text, axes);
  if (!tex) dl->AddText(ImVec2(pos.x + font * 0.4f, pos.y + font * 0.3f), dim_text, "(drawn without the points shader)");

  if (!hovered || st.vertices.empty()) return;
  // The nearest sample within a few pixels.
  const ImVec2 m = ImGui::GetIO().MousePos;
  const float reach = std::max(point_px, font * 0.6f);
  float best = reach * reach;
  int found = -1;
  for (size_t i = 0; i < st.vertices.size(); i++) {
    const ImVec2 p = fit.to_screen(st.vertices[i].x, st.vertices[i].y);
    const float d2 = (p.x - m.x) * (p.x - m.x) + (p.y - m.y) * (p.y - m.y);
    if (d2 < best) best = d2, found = static_cast<int>(i);
  }
  if (found < 0) return;
  const size_t i = static_cast<size_t>(found);
  const ImVec2 p = fit.to_screen(st.vertices[i].x, st.vertices[i].y);
  dl->AddCircle(p, point_px * 0.5f + 3, ImGui::GetColorU32(ImGuiCol_Text), 16, 2.0f);
  const DataView& d = s.data;
  ImGui::BeginTooltip();
  ImGui::Text("sample %d  (%.3f, %.3f)", found, st.vertices[i].x, st.vertices[i].y);
  if (i < d.label.size()) ImGui::Text("class %d", d.label[i]);
  const int owner = i < d.owner.size() ? d.owner[i] : -1;
  if (owner >= 0) {
    ImGui::PushStyleColor(ImGuiCol_Text, rank_color(owner, world_of(s)));
    ImGui::Text("%s trains on it in epoch %lld", owner_text(d, owner).c_str(), static_cast<long long>(d.epoch));
    ImGui::PopStyleColor();
  } else {
    ImGui::TextDisabled("no rank trains on it this epoch (dropped by drop_last)");
  }
  ImGui::EndTooltip();
}

// The legend: one swatch per rank, replica (a mesh) or class with its sample count; hovering one
// highlights it. A replica's entry names its ranks: "replica 1: ranks 4-7, 1500 samples".
void draw_legend(const Snapshot& s, DataViewState& st) {
  const DataView& d = s.data;
  const int world = world_of(s);
  const int groups = st.color_by == ColorBy::Class ? std::max(d.classes, 1) : world;
  std::vector<int64_t> counts(static_cast<size_t>(groups), 0);
  int64_t none = 0;
  for (size_t i = 0; i < static_cast<size_t>(std::max<int64_t>(d.n, 0)); i++) {
    const int g = group_of(d, st.color_by, i);
    if (g >= 0 && g < groups) counts[static_cast<size_t>(g)]++;
    else none++;
  }
  const float font = ImGui::GetFontSize();
  const bool by_class = st.color_by == ColorBy::Class, by_replica = !by_class && d.by_replica;
  const char* noun = by_class ? "class" : by_replica ? "replica" : "rank";
  // "rank 3: 375" per entry when that fits in two lines, else "ranks" once and "3: 375" entries.
  auto entry = [&](int g, bool compact) {
    const std::string count = std::to_string(counts[static_cast<size_t>(g)]);
    if (compact) return std::to_string(g) + ": " + count;
    if (by_replica && g < static_cast<int>(d.owners.size()))
      return d.owners[static_cast<size_t>(g)].name + ": " + d.owners[static_cast<size_t>(g)].ranks + ", " + count + " samples";
    return std::string(noun) + " " + std::to_string(g) + ": " + count;
  };
  float full_w = 0;
  for (int g = 0; g < groups; g++) full_w += font * 2.1f + ImGui::CalcTextSize(entry(g, false).c_str()).x;
  const bool compact = full_w > 2 * ImGui::GetContentRegionAvail().x;
  if (compact) {
    ImGui::TextUnformatted(by_class ? "classes" : by_replica ? "replicas" : "ranks");
    ImGui::SameLine(0, font * 0.6f);
  }
  int highlight = -1;
  for (int g = 0; g < groups; g++) {
    const std::string text_s = entry(g, compact);
    const char* text = text_s.c_str();
    const long long count = static_cast<long long>(counts[static_cast<size_t>(g)]);
    const float w = font * 1.1f + ImGui::CalcTextSize(text).x;
    if (g > 0) {
      flow(w, compact ? font * 0.6f : font);
    }
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float line = ImGui::GetTextLineHeight();
    ImGui::PushID(g);
    ImGui::InvisibleButton("##legend", ImVec2(w, line));
    ImGui::PopID();
    const bool over = ImGui::IsItemHovered();
    if (over) {
      highlight = g;
      if (by_class) ImGui::SetTooltip("class %d: %lld samples", g, count);
      else if (by_replica) ImGui::SetTooltip("%s: %lld samples this epoch; its ranks all read the same batches", owner_text(d, g).c_str(), count);
      else ImGui::SetTooltip("rank %d: %lld samples this epoch", g, count);
    }
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImU32 c = color_of_group(g, st.color_by, world, d.classes);
    dl->AddCircleFilled(ImVec2(p.x + font * 0.4f, p.y + line * 0.5f), font * 0.38f, c, 16);
    dl->AddText(ImVec2(p.x + font * 1.1f, p.y), over ? ImGui::GetColorU32(ImGuiCol_Text) : c, text);
  }
  if (none > 0) {
    ImGui::SameLine(0, font);
    ImGui::TextDisabled("unused: %lld", static_cast<long long>(none));
  }
  st.highlight = highlight;
}

// A curve's plot: its frame [a, b] and where a step and a value fall in it.
struct CurvePlot {
  ImVec2 a, b;
  bool log = false;        // the value axis is log10(value)
  float lo = 0, hi = 1;    // the value axis (log10 when log)
  int64_t s0 = 0, s1 = 1;  // the step axis
  bool one_step = false;   // one step so far: in the middle, not on the frame
  float t(float v) const { return log ? std::log10(std::max(v, 1e-6f)) : v; }
  float x_of(int64_t step) const {
    if (one_step) return 0.5f * (a.x + b.x);
    return a.x + (b.x - a.x) * static_cast<float>(step - s0) / static_cast<float>(s1 - s0);
  }
  float y_of(float tv) const { return b.y - (b.y - a.y) * (tv - lo) / (hi - lo); }
};

// The title line: the latest value, and the log-scale switch when the curve has one.
// `right`: the panel's right edge, which the switch wraps before.
void curve_title(const char* id, const char* title, const std::vector<StepPoint>& h, float (*value)(const StepPoint&),
                 bool* log_switch, bool percent, ImU32 color, float right) {
  char buf[96];
  if (h.empty()) std::snprintf(buf, sizeof buf, "%s", title);
  else {
    char v[32];
    const double last = value(h.back());
    if (percent) std::snprintf(v, sizeof v, "%.1f%%", 100.0 * last);
    else std::snprintf(v, sizeof v, "%.4g", last);
    std::snprintf(buf, sizeof buf, "%s %s  (step %lld)", title, v, static_cast<long long>(h.back().step));
  }
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(color), "%s", buf);
  if (log_switch) {
    const float switch_w = ImGui::GetFontSize() + ImGui::GetStyle().ItemInnerSpacing.x + ImGui::CalcTextSize("log scale").x;
    if (ImGui::GetItemRectMax().x + ImGui::GetFontSize() + switch_w <= right) ImGui::SameLine(0, ImGui::GetFontSize());
    ImGui::PushID(id);
    ImGui::PushStyleVar(ImGuiStyleVar_FramePadding, ImVec2(ImGui::GetStyle().FramePadding.x, 0));
    ImGui::Checkbox("log scale", log_switch);
    ImGui::PopStyleVar();
    ImGui::PopID();
  }
}

// The axes of a non-empty history: accuracy keeps 0..1 (with a little air); loss fits its range.
CurvePlot fit_curve(ImVec2 a, ImVec2 b, const std::vector<StepPoint>& h, float (*value)(const StepPoint&), bool log, bool percent) {
  CurvePlot p;
  p.a = a, p.b = b, p.log = log;
  p.lo = -0.04f, p.hi = 1.04f;
  if (!percent) {
    p.lo = 1e30f, p.hi = -1e30f;
    for (const StepPoint& q : h) p.lo = std::min(p.lo, p.t(value(q))), p.hi = std::max(p.hi, p.t(value(q)));
    if (p.hi - p.lo < 1e-6f) p.lo -= 0.5f, p.hi += 0.5f;
    const float pad = (p.hi - p.lo) * 0.06f;
    p.lo -= pad, p.hi += pad;
  }
  p.s0 = h.front().step, p.s1 = std::max(h.back().step, p.s0 + 1);
  p.one_step = h.size() == 1;
  return p;
}

// Grid at round values: decades on a log axis spanning one or more, 1-2-5 steps otherwise; then
// the steps the plot spans under it.
void draw_curve_grid(ImDrawList* dl, const CurvePlot& p, const std::vector<StepPoint>& h, bool percent) {
  const float font = ImGui::GetFontSize();
  const ImU32 dim = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const ImVec2 a = p.a, b = p.b;
  const bool log = p.log;
  const float lo = p.lo, hi = p.hi;
  const bool room_for_labels = b.y - a.y >= 2.5f * ImGui::GetTextLineHeight();
  // decimals: those of the tick step (0.005 -> 3), so neighbouring ticks never print alike
  // ("1.11" twice from %.3g); -1: three significant digits (decades: 0.01, 0.1, 1).
  auto label_at = [&](float tv, int decimals = -1) {
    const float y = p.y_of(tv);
    dl->AddLine(ImVec2(a.x, y), ImVec2(b.x, y), kDataGrid);
    if (!room_for_labels) return;
    char l[32];
    const double shown = log ? std::pow(10.0, static_cast<double>(tv)) : static_cast<double>(tv);
    if (percent) std::snprintf(l, sizeof l, "%.0f%%", 100.0 * shown);
    else if (decimals >= 0) std::snprintf(l, sizeof l, "%.*f", decimals, std::fabs(shown) < 1e-9 ? 0.0 : shown);
    else std::snprintf(l, sizeof l, "%.3g", std::fabs(shown) < 1e-9 ? 0.0 : shown);
    const ImVec2 ts = ImGui::CalcTextSize(l);
    dl->AddText(ImVec2(a.x - ts.x - font * 0.25f, y - ts.y * 0.5f), dim, l);
  };
  if (log && hi - lo >= 0.8f) {
    for (float d = std::ceil(lo); d <= hi; d += 1.0f) label_at(d);
  } else if (percent) {
    for (float v : {0.0f, 0.5f, 1.0f}) label_at(v);
  } else {
    // In log mode below a decade the ticks are round loss values, placed on the log axis.
    const double vlo = log ? std::pow(10.0, static_cast<double>(lo)) : lo, vhi = log ? std::pow(10.0, static_cast<double>(hi)) : hi;
    const double raw = (vhi - vlo) / 3.0, p10 = std::pow(10.0, std::floor(std::log10(raw)));
    const double m = raw / p10, step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p10;
    const int decimals = std::clamp(-static_cast<int>(std::floor(std::log10(step) + 1e-9)), 0, 9);
    for (double k = std::ceil(vlo / step); k * step <= vhi; k += 1) {  // counted in steps: no drift
      const double v = k * step;
      if (!log || v > 0) label_at(log ? std::log10(static_cast<float>(v)) : static_cast<float>(v), decimals);
    }
  }
  char sx[32];
  std::snprintf(sx, sizeof sx, "step %lld", static_cast<long long>(p.s0));
  dl->AddText(ImVec2(a.x, b.y + font * 0.1f), dim, sx);
  if (h.size() > 1) {
    std::snprintf(sx, sizeof sx, "%lld", static_cast<long long>(h.back().step));
    dl->AddText(ImVec2(b.x - ImGui::CalcTextSize(sx).x, b.y + font * 0.1f), dim, sx);
  }
}

// The curve, averaged per pixel column when there are more steps than pixels.
void draw_curve_line(ImDrawList* dl, const CurvePlot& p, const std::vector<StepPoint>& h, float (*value)(const StepPoint&), ImU32 color) {
  const float font = ImGui::GetFontSize();
  const size_t columns = std::max<size_t>(static_cast<size_t>(p.b.x - p.a.x), 2);
  const size_t stride = (h.size() + columns - 1) / columns;
  std::vector<ImVec2> line;
  line.reserve(h.size() / std::max<size_t>(stride, 1) + 1);
  for (size_t i = 0; i < h.size(); i += std::max<size_t>(stride, 1)) {
    const size_t e = std::min(h.size(), i + std::max<size_t>(stride, 1));
    double sum = 0;
    for (size_t j = i; j < e; j++) sum += p.t(value(h[j]));
    line.push_back(ImVec2(p.x_of(h[(i + e - 1) / 2].step), p.y_of(static_cast<float>(sum / static_cast<double>(e - i)))));
  }
  dl->PushClipRect(p.a, p.b, true);
  if (line.size() == 1) dl->AddCircleFilled(line[0], font * 0.2f, color);
  else dl->AddPolyline(line.data(), static_cast<int>(line.size()), color, ImDrawFlags_None, std::max(2.0f, font * 0.12f));
  dl->AddCircleFilled(line.back(), font * 0.22f, color);
  dl->PopClipRect();
}

// fp16 (--precision fp16): the loss scale the last step carried and how many steps were skipped,
// after the loss curve's title.
void loss_scale_readout(const std::vector<StepPoint>& h, int64_t skipped) {
  if (h.empty()) return;
  ImGui::SameLine(0, ImGui::GetFontSize());
  ImGui::TextDisabled("loss scale %.0f (fp16)", static_cast<double>(h.back().loss_scale));
  if (skipped > 0) {
    ImGui::SameLine();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(skipped_step_color()), "%lld skipped", static_cast<long long>(skipped));
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("fp16's GradScaler multiplies the loss by this scale so small gradients survive 16 bits.\n"
                      "A step whose gradients hold an inf or NaN on any rank is skipped (red dots) and the scale halves.");
}

// Skipped steps (fp16): a red dot on the curve at each.
void draw_skipped_steps(ImDrawList* dl, const CurvePlot& p, const std::vector<StepPoint>& h, float (*value)(const StepPoint&)) {
  const float font = ImGui::GetFontSize(), pad = font * 0.4f;  // a dot at the plot's edge stays whole
  dl->PushClipRect(ImVec2(p.a.x - pad, p.a.y - pad), ImVec2(p.b.x + pad, p.b.y + pad), true);
  for (const StepPoint& q : h) {
    if (!q.skipped) continue;
    const float v = p.t(value(q));
    const float y = std::isfinite(v) ? p.y_of(v) : p.a.y + font * 0.3f;  // a non-finite loss: at the top
    dl->AddCircleFilled(ImVec2(p.x_of(q.step), y), font * 0.32f, skipped_step_color());
    dl->AddCircle(ImVec2(p.x_of(q.step), y), font * 0.32f, IM_COL32(255, 255, 255, 200), 12, 1.5f);
  }
  dl->PopClipRect();
}

// The step under the mouse: a line across the plot, a ring on the curve, and its numbers.
void draw_curve_cursor(ImDrawList* dl, const CurvePlot& p, const std::vector<StepPoint>& h, float (*value)(const StepPoint&)) {
  const float font = ImGui::GetFontSize();
  const float mx = ImGui::GetIO().MousePos.x;
  const double f = std::clamp((mx - p.a.x) / (p.b.x - p.a.x), 0.0f, 1.0f);
  const int64_t want = p.s0 + static_cast<int64_t>(std::llround(f * static_cast<double>(p.s1 - p.s0)));
  const auto it = std::lower_bound(h.begin(), h.end(), want, [](const StepPoint& q, int64_t st) { return q.step < st; });
  const StepPoint& q = it == h.end() ? h.back() : *it;
  const float x = p.x_of(q.step);
  dl->AddLine(ImVec2(x, p.a.y), ImVec2(x, p.b.y), IM_COL32(255, 255, 255, 90));
  dl->AddCircle(ImVec2(x, p.y_of(p.t(value(q)))), font * 0.3f, ImGui::GetColorU32(ImGuiCol_Text), 12, 2.0f);
  ImGui::BeginTooltip();
  ImGui::Text("step %lld", static_cast<long long>(q.step));
  ImGui::Text("loss %.4f   accuracy %.1f%%", static_cast<double>(q.loss), 100.0 * q.accuracy);
  if (q.samples_per_sec > 0) ImGui::TextDisabled("%.0f samples/s", q.samples_per_sec);
  if (q.loss_scale > 0) ImGui::TextDisabled("loss scale %.0f", static_cast<double>(q.loss_scale));
  if (q.skipped) ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(skipped_step_color()), "skipped: inf/NaN in the gradients");
  ImGui::EndTooltip();
}

// One curve of the training history in [pos, pos + size]: title with the latest value, grid, axes
// with their range, and a cursor with the value under the mouse. `log` plots log10(value).
void draw_curve(const char* id, const char* title, const std::vector<StepPoint>& h, float (*value)(const StepPoint&),
                bool* log_switch, bool percent, ImU32 color, ImVec2 size, int64_t fp16_skipped = -1) {
  const float font = ImGui::GetFontSize();
  const bool log = log_switch && *log_switch;
  const ImVec2 top = ImGui::GetCursorScreenPos();
  curve_title(id, title, h, value, log_switch, percent, color, top.x + size.x);
  if (fp16_skipped >= 0) loss_scale_readout(h, fp16_skipped);  // fp16: the steps skipped so far
  const ImVec2 pos = ImGui::GetCursorScreenPos();
  const ImVec2 plot(size.x, std::max(size.y - (pos.y - top.y), 1.0f));
  ImGui::InvisibleButton(id, plot);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* dl = ImGui::GetWindowDrawList();

  const float axis_w = ImGui::CalcTextSize("0.000").x + font * 0.5f;
  const ImVec2 a(pos.x + axis_w, pos.y + font * 0.3f);
  const ImVec2 b(pos.x + plot.x - font * 0.5f, pos.y + plot.y - ImGui::GetTextLineHeight() - font * 0.2f);
  if (b.x - a.x < font * 3 || b.y - a.y < font) return;
  dl->AddRectFilled(a, b, IM_COL32(255, 255, 255, 8));
  dl->AddRect(a, b, kDataGrid);
  if (h.empty()) {
    dl->AddText(ImVec2(a.x + font * 0.5f, a.y + font * 0.3f), ImGui::GetColorU32(ImGuiCol_TextDisabled), "no steps yet");
    return;
  }
  const CurvePlot p = fit_curve(a, b, h, value, log, percent);
  draw_curve_grid(dl, p, h, percent);
  draw_curve_line(dl, p, h, value, color);
  if (fp16_skipped > 0) draw_skipped_steps(dl, p, h, value);
  if (hovered) draw_curve_cursor(dl, p, h, value);
}

float loss_of(const StepPoint& p) { return p.loss; }
float accuracy_of(const StepPoint& p) { return static_cast<float>(p.accuracy); }

// Loss over accuracy, stacked in [size], with the log-scale switch for the loss.
void draw_history(const Snapshot& s, DataViewState& st, ImVec2 size) {
  ImGui::BeginGroup();
  const float each = (size.y - ImGui::GetStyle().ItemSpacing.y) * 0.5f;
  draw_curve("##loss", "loss", s.history, loss_of, &st.log_loss, false, kLossColor, ImVec2(size.x, each),
             s.config.precision == Precision::FP16 ? s.steps_skipped : -1);
  draw_curve("##accuracy", "accuracy", s.history, accuracy_of, nullptr, true, kAccuracyColor, ImVec2(size.x, each));
  ImGui::EndGroup();
}

// One head's causal attention over the batch's first sample, as a T x T grid: row t is query
// position t, its cells the probabilities it gives positions 0..t (brighter: more); hovering names the
// two characters.
void draw_attention(AttentionBox& a) {
  ImGui::Separator();
  ImGui::TextWrapped("Attention of one head (pause first)");
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("One head's causal attention pattern on the batch's first sample.");
  if (a.layers > 0) {
    // Two sliders on a line, each up to 8 characters wide: narrower where the panel is (a tiled layout).
    const ImGuiStyle& style = ImGui::GetStyle();
    const float labels = ImGui::CalcTextSize("block").x + ImGui::CalcTextSize("head").x + 3 * style.ItemInnerSpacing.x + style.ItemSpacing.x;
    const float w = std::clamp((ImGui::GetContentRegionAvail().x - labels) / 2, 3.0f * ImGui::GetFontSize(), 8.0f * ImGui::GetFontSize());
    ImGui::SetNextItemWidth(w);
    ImGui::SliderInt("block", &a.layer, 0, a.layers - 1);
    ImGui::SameLine();
    ImGui::SetNextItemWidth(w);
    ImGui::SliderInt("head", &a.head, 0, a.heads - 1);
  }
  const int64_t T = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(a.probs.size()))));
  if (T == 0 || T * T != static_cast<int64_t>(a.probs.size())) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("%s", a.why_none.empty() ? "No forward to show yet, or the run is moving." : a.why_none.c_str());
    ImGui::PopTextWrapPos();
    return;
  }
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("after step %lld: row = query position, column = the position it reads (the mask leaves the upper right empty)",
                      static_cast<long long>(a.at_step));
  ImGui::PopTextWrapPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  // Fill what is left of the window, but no cell smaller than half a character: at a projector the
  // view scrolls rather than shrink the grid to a smudge.
  const float cell = std::max(0.5f * ImGui::GetFontSize(), std::min((avail.x - 4) / static_cast<float>(T), (avail.y - 4) / static_cast<float>(T)));
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (int64_t r = 0; r < T; r++)
    for (int64_t c = 0; c <= r; c++) {
      const float v = std::clamp(a.probs[static_cast<size_t>(r * T + c)], 0.0f, 1.0f);
      const float g = std::sqrt(v);  // small weights stay visible
      const ImU32 col = IM_COL32(static_cast<int>(40 + 215 * g), static_cast<int>(60 + 170 * g), static_cast<int>(90 + 60 * g), 255);
      const ImVec2 c0(p.x + cell * static_cast<float>(c), p.y + cell * static_cast<float>(r));
      dl->AddRectFilled(c0, ImVec2(c0.x + cell - (cell > 4 ? 1 : 0), c0.y + cell - (cell > 4 ? 1 : 0)), col);
    }
  ImGui::Dummy(ImVec2(cell * static_cast<float>(T), cell * static_cast<float>(T)));
  if (ImGui::IsItemHovered()) {
    const ImVec2 m = ImGui::GetMousePos();
    const int64_t r = static_cast<int64_t>((m.y - p.y) / cell), c = static_cast<int64_t>((m.x - p.x) / cell);
    if (r >= 0 && r < T && c >= 0 && c <= r && static_cast<int64_t>(a.text.size()) == T) {
      auto shown = [](char ch) { return ch == '\n' ? std::string("\\n") : std::string(1, ch); };
      ImGui::SetTooltip("position %lld ('%s') reads position %lld ('%s') with weight %.3f", static_cast<long long>(r),
                        shown(a.text[static_cast<size_t>(r)]).c_str(), static_cast<long long>(c), shown(a.text[static_cast<size_t>(c)]).c_str(),
                        static_cast<double>(a.probs[static_cast<size_t>(r * T + c)]));
    }
  }
}

// Token data (a GPT's text): windows of text have no points to plot; the view shows the text's
// figures and the Generate box (what the model writes now, GenerateBox).
void draw_text_data(const DataView& d, DataViewState& st) {
  ImGui::TextWrapped("%s: %lld windows of text, a vocabulary of %d characters; the loss is over every position.",
                     d.name.c_str(), static_cast<long long>(d.n), d.classes);
  ImGui::Separator();
  ImGui::TextWrapped("Generate text (pause first)");
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("What the model writes now, from the prompt: nanoGPT's sample.py on the live weights.");
  ImGui::SetNextItemWidth(std::max(8.0f * ImGui::GetFontSize(), ImGui::GetContentRegionAvail().x - 7.0f * ImGui::GetFontSize()));
  ImGui::InputText("##prompt", st.generate.prompt, sizeof st.generate.prompt);
  ImGui::SameLine();
  if (ImGui::Button("Generate")) st.generate.request = true;
  if (!st.generate.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.72f, 0.3f, 1.0f));
    ImGui::TextWrapped("%s", st.generate.error.c_str());
    ImGui::PopStyleColor();
  } else if (st.generate.at_step >= 0) {
    ImGui::TextDisabled("after step %lld, temperature 0.8, top-k 200:", static_cast<long long>(st.generate.at_step));
    ImGui::TextWrapped("%s%s", st.generate.asked.c_str(), st.generate.output.c_str());
  }
  draw_attention(st.attention);
}

}  // namespace

void draw_data_view(const Snapshot& s, DataViewState& st, ViewContext& ctx) {
  const DataView& d = s.data;
  const float font = ImGui::GetFontSize();

  // ---- controls ----
  // The long label where it fits (a narrow tile of "all views" at 1280 x 720 cut it).
  const bool room = ImGui::GetContentRegionAvail().x >= ImGui::CalcTextSize("set_epoch(epoch) each epoch").x + ImGui::GetFrameHeight() * 1.5f;
  ImGui::Checkbox(room ? "set_epoch(epoch) each epoch###set_epoch" : "set_epoch(epoch)###set_epoch", &ctx.data_set_epoch);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("sampler.set_epoch(epoch) reseeds the DistributedSampler's shuffle every epoch.\n"
                      "Without it every epoch repeats epoch 0's split and order.");
  if (d.valid && d.n > 0 && d.xy.empty()) return draw_text_data(d, st);
  // "color by (o) rank (o) class" on the same line when it fits, else on the next (a 1600x900 tile
  // cut it off at the right).
  flow(ImGui::CalcTextSize("color by  replica  class").x + 3 * ImGui::GetFrameHeight(), font * 1.5f);
  ImGui::TextUnformatted("color by");
  ImGui::SameLine();
  int by = static_cast<int>(st.color_by);
  ImGui::RadioButton(d.by_replica ? "replica###by_rank" : "rank###by_rank", &by, static_cast<int>(ColorBy::Rank));
  ImGui::SameLine();
  ImGui::RadioButton("class", &by, static_cast<int>(ColorBy::Class));
  st.color_by = static_cast<ColorBy>(by);

  if (!d.valid || d.n <= 0 || d.xy.size() < 2) {
    ImGui::TextDisabled("No data set loaded yet.");
    return;
  }
  refresh_points(s, st);

  // ---- what the split is ----
  const ImVec4 kWarn(1.0f, 0.72f, 0.3f, 1.0f);
  ImGui::Text("Epoch %lld", static_cast<long long>(d.epoch));
  // The data set's short name (its parameters in the tooltip), beside the epoch where it fits.
  const std::string short_name = d.name.substr(0, d.name.find(':'));
  char about[160];
  std::snprintf(about, sizeof about, "%s: %lld samples, %d classes", short_name.c_str(), static_cast<long long>(d.n), d.classes);
  flow(ImGui::CalcTextSize(about).x, font);
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("%s", about);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", d.name.c_str());
  if (!d.set_epoch) ImGui::TextColored(kWarn, "set_epoch off: every epoch reuses epoch 0's split");
  if (st.moved >= 0 && st.prev_epoch >= 0 && st.prev_epoch != d.epoch) {
    const char* owner = d.by_replica ? "replica" : "rank";
    if (st.moved == 0)
      ImGui::TextColored(kWarn, "Since epoch %lld no sample changed %s: each %s sees the same data again.",
                         static_cast<long long>(st.prev_epoch), owner, owner);
    else
      ImGui::Text("Since epoch %lld, %lld of %lld samples (%.0f%%) changed %s.", static_cast<long long>(st.prev_epoch),
                  static_cast<long long>(st.moved), static_cast<long long>(d.n),
                  100.0 * static_cast<double>(st.moved) / static_cast<double>(d.n), owner);
  }
  ImGui::PopTextWrapPos();
  draw_legend(s, st);
  ImGui::Spacing();

  // ---- scatter beside the curves when the panel is wide, above them when tall, alone when small ----
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 spacing = ImGui::GetStyle().ItemSpacing;
  const float min_scatter = font * 8;
  // The data is about as wide as tall: the scatter gets a little more than a square.
  const float plots_w = std::clamp(avail.x - avail.y * 1.2f, font * 14, font * 36);
  const float plots_h = std::clamp(avail.y * 0.38f, font * 9, font * 20);
  if (avail.x >= avail.y * 1.3f && avail.x - plots_w - spacing.x >= min_scatter) {
    const ImVec2 scatter(avail.x - plots_w - spacing.x, std::max(avail.y, min_scatter));
    draw_scatter(s, ctx, st, scatter);
    ImGui::SameLine();
    draw_history(s, st, ImVec2(plots_w, scatter.y));
  } else if (avail.y - plots_h - spacing.y >= min_scatter) {
    const ImVec2 scatter(std::max(avail.x, min_scatter), avail.y - plots_h - spacing.y);
    draw_scatter(s, ctx, st, scatter);
    draw_history(s, st, ImVec2(scatter.x, plots_h));
  } else {
    const float line = ImGui::GetTextLineHeightWithSpacing();
    // Small: the scatter takes what is left above one line of figures (never less than four lines).
    draw_scatter(s, ctx, st, ImVec2(std::max(avail.x, min_scatter), std::max(avail.y - line - spacing.y, font * 4)));
    if (s.history.empty()) {
      ImGui::TextDisabled("no steps yet");
    } else {
      const StepPoint& p = s.history.back();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kLossColor), "loss %.4g", static_cast<double>(p.loss));
      // One line: what does not fit on it is left out (the curves need a larger panel anyway).
      char acc[48], step[96];
      std::snprintf(acc, sizeof acc, "accuracy %.1f%%", 100.0 * p.accuracy);
      std::snprintf(step, sizeof step, "step %lld (enlarge the panel for the curves)", static_cast<long long>(p.step));
      const float right = ImGui::GetWindowPos().x + ImGui::GetContentRegionMax().x, sp = ImGui::GetStyle().ItemSpacing.x;
      for (const auto& [text, col] : {std::pair<const char*, ImU32>{acc, kAccuracyColor}, {step, ImGui::GetColorU32(ImGuiCol_TextDisabled)}}) {
        if (ImGui::GetItemRectMax().x + sp + ImGui::CalcTextSize(text).x > right) break;
        ImGui::SameLine();
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(col), "%s", text);
      }
    }
  }
}

}  // namespace dtlab::app
