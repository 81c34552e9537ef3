// The ring view's GL pass: the chunks moving along the ring's edges, drawn as glowing sprites by
// the ring_chunks GLSL program into a render target that the view shows with ImGui images.
#pragma once
#include <imgui.h>

#include <vector>

#include "app/gl.h"

namespace dtlab::app {

struct Sprite {
  ImVec2 pos;    // screen pixels, center
  float half;    // half side, pixels
  ImVec4 color;  // straight RGBA
  ImVec2 dir;    // unit direction of travel
  float tail;    // streak length behind it, pixels
};

// Where one sprite's square lies on screen and in the target.
struct Placed {
  ImVec2 screen0, screen1, uv0, uv1;
};

// Sets the blend for the pass's premultiplied texture; an ImDrawList callback before its images.
void premultiplied_blend(const ImDrawList*, const ImDrawCmd*);

// The ring_chunks pass: quads built on the CPU, drawn into the view's render target. Each sprite
// gets its own cell of the target (an atlas), so the target holds only the chunks' surroundings,
// not the whole ring, and the image ImGui blends is a few small squares. It saves and restores the
// GL state it touches, since it runs while ImGui builds the frame. Its buffers live as long as the
// GL context (the app), so they are never deleted.
class ChunkPass {
 public:
  // Half side of a sprite's square: the glow reaches 3 half sides out, the streak at most 4 behind.
  static float extent(float half) { return half * 5.0f; }

  // Draws the sprites into the target; returns its texture (0 when it cannot) and, per sprite,
  // where its square goes on screen and which part of the texture shows there.
  unsigned render(GlResources& gl, const ShaderProgram& prog, float fb_scale, const std::vector<Sprite>& sprites, float time,
                  std::vector<Placed>& placed);

 private:
  static constexpr int kFloats = 13;  // per vertex: pos, local, shape, color, motion
  unsigned vao_ = 0, vbo_ = 0;
  unsigned uniforms_for_ = 0;
  int u_target_ = -1, u_time_ = -1;
  std::vector<float> verts_;
};

}  // namespace dtlab::app
