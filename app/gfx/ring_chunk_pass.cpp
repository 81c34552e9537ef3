#include "app/gfx/ring_chunk_pass.h"

#include <GL/gl.h>
#include <GL/glext.h>

#include <algorithm>
#include <cmath>

#include "app/views/vec2.h"

namespace dtlab::app {

void premultiplied_blend(const ImDrawList*, const ImDrawCmd*) {
  glBlendFuncSeparate(GL_ONE, GL_ONE_MINUS_SRC_ALPHA, GL_ONE, GL_ONE_MINUS_SRC_ALPHA);
}

unsigned ChunkPass::render(GlResources& gl, const ShaderProgram& prog, float fb_scale, const std::vector<Sprite>& sprites, float time,
                           std::vector<Placed>& placed) {
  placed.clear();
  if (sprites.empty() || prog.id() == 0) return 0;
  float ext = 0;
  for (const Sprite& s : sprites) ext = std::max(ext, extent(s.half));
  const float cell = 2.0f * ext * fb_scale;
  const int stride = static_cast<int>(std::ceil(cell)) + 2;
  const int n = static_cast<int>(sprites.size());
  const int cols = static_cast<int>(std::ceil(std::sqrt(static_cast<float>(n))));
  const int rows = (n + cols - 1) / cols;
  const int w = cols * stride, h = rows * stride;
  verts_.clear();
  for (int i = 0; i < n; i++) {
    const Sprite& s = sprites[static_cast<size_t>(i)];
    const ImVec2 origin(static_cast<float>((i % cols) * stride + 1), static_cast<float>((i / cols) * stride + 1));
    placed.push_back({s.pos - ImVec2(ext, ext), s.pos + ImVec2(ext, ext),
                      ImVec2(origin.x / static_cast<float>(w), 1.0f - origin.y / static_cast<float>(h)),
                      ImVec2((origin.x + cell) / static_cast<float>(w), 1.0f - (origin.y + cell) / static_cast<float>(h))});
    // A quad along the direction of travel: the glow's reach around the chunk, the streak behind.
    const float half = s.half * fb_scale, reach = half * 3.0f, radius = half * 0.38f;
    const float tail = std::min(s.tail, s.half * 4.0f) * fb_scale;
    const ImVec2 c = origin + ImVec2(cell * 0.5f, cell * 0.5f), perp(-s.dir.y, s.dir.x);
    const float ahead = reach, behind = std::max(reach, tail);
    const ImVec2 q[4] = {s.dir * ahead + perp * reach, s.dir * ahead - perp * reach, s.dir * -behind - perp * reach,
                         s.dir * -behind + perp * reach};
    for (int i : {0, 1, 2, 0, 2, 3}) {
      const ImVec2 l = q[i];
      const float v[kFloats] = {c.x + l.x, c.y + l.y, l.x, l.y, half, radius, s.color.x, s.color.y, s.color.z, s.color.w,
                                s.dir.x, s.dir.y, tail};
      verts_.insert(verts_.end(), v, v + kFloats);
    }
  }

  GLint last_program = 0, last_vao = 0, last_buffer = 0;
  GLint blend_src_rgb = 0, blend_dst_rgb = 0, blend_src_a = 0, blend_dst_a = 0, eq_rgb = 0, eq_a = 0;
  GLfloat clear[4] = {0, 0, 0, 0};
  glGetIntegerv(GL_CURRENT_PROGRAM, &last_program);
  glGetIntegerv(GL_VERTEX_ARRAY_BINDING, &last_vao);
  glGetIntegerv(GL_ARRAY_BUFFER_BINDING, &last_buffer);
  glGetIntegerv(GL_BLEND_SRC_RGB, &blend_src_rgb);
  glGetIntegerv(GL_BLEND_DST_RGB, &blend_dst_rgb);
  glGetIntegerv(GL_BLEND_SRC_ALPHA, &blend_src_a);
  glGetIntegerv(GL_BLEND_DST_ALPHA, &blend_dst_a);
  glGetIntegerv(GL_BLEND_EQUATION_RGB, &eq_rgb);
  glGetIntegerv(GL_BLEND_EQUATION_ALPHA, &eq_a);
  glGetFloatv(GL_COLOR_CLEAR_VALUE, clear);
  const GLboolean blend = glIsEnabled(GL_BLEND), scissor = glIsEnabled(GL_SCISSOR_TEST);
  const GLboolean depth = glIsEnabled(GL_DEPTH_TEST), cull = glIsEnabled(GL_CULL_FACE);

  if (!vao_) {
    glGenVertexArrays(1, &vao_);
    glGenBuffers(1, &vbo_);
    glBindVertexArray(vao_);
    glBindBuffer(GL_ARRAY_BUFFER, vbo_);
    const GLsizei stride = kFloats * sizeof(float);
    const int sizes[5] = {2, 2, 2, 4, 3};
    size_t offset = 0;
    for (GLuint i = 0; i < 5; i++) {
      glEnableVertexAttribArray(i);
      glVertexAttribPointer(i, sizes[i], GL_FLOAT, GL_FALSE, stride, reinterpret_cast<const void*>(offset * sizeof(float)));
      offset += static_cast<size_t>(sizes[i]);
    }
  }
  RenderTarget& target = gl.target("ring");
  target.begin(w, h);
  glDisable(GL_SCISSOR_TEST);
  glDisable(GL_DEPTH_TEST);
  glDisable(GL_CULL_FACE);
  glClearColor(0, 0, 0, 0);
  glClear(GL_COLOR_BUFFER_BIT);
  if (!verts_.empty()) {
    glEnable(GL_BLEND);
    glBlendEquation(GL_FUNC_ADD);
    glBlendFunc(GL_ONE, GL_ONE_MINUS_SRC_ALPHA);  // the shader writes premultiplied color
    glUseProgram(prog.id());
    if (prog.id() != uniforms_for_) {
      uniforms_for_ = prog.id();
      u_target_ = prog.uniform("u_target");
      u_time_ = prog.uniform("u_time");
    }
    glUniform2f(u_target_, static_cast<float>(w), static_cast<float>(h));
    glUniform1f(u_time_, time);
    glBindVertexArray(vao_);
    glBindBuffer(GL_ARRAY_BUFFER, vbo_);
    glBufferData(GL_ARRAY_BUFFER, static_cast<GLsizeiptr>(verts_.size() * sizeof(float)), verts_.data(), GL_STREAM_DRAW);
    glDrawArrays(GL_TRIANGLES, 0, static_cast<GLsizei>(verts_.size() / kFloats));
  }
  target.end();

  glUseProgram(static_cast<GLuint>(last_program));
  glBindVertexArray(static_cast<GLuint>(last_vao));
  glBindBuffer(GL_ARRAY_BUFFER, static_cast<GLuint>(last_buffer));
  glBlendEquationSeparate(static_cast<GLenum>(eq_rgb), static_cast<GLenum>(eq_a));
  glBlendFuncSeparate(static_cast<GLenum>(blend_src_rgb), static_cast<GLenum>(blend_dst_rgb),
                      static_cast<GLenum>(blend_src_a), static_cast<GLenum>(blend_dst_a));
  glClearColor(clear[0], clear[1], clear[2], clear[3]);
  if (blend) glEnable(GL_BLEND); else glDisable(GL_BLEND);
  if (scissor) glEnable(GL_SCISSOR_TEST); else glDisable(GL_SCISSOR_TEST);
  if (depth) glEnable(GL_DEPTH_TEST); else glDisable(GL_DEPTH_TEST);
  if (cull) glEnable(GL_CULL_FACE); else glDisable(GL_CULL_FACE);
  return target.texture();
}

}  // namespace dtlab::app
