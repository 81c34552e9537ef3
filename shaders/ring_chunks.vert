#version 330 core
// ring_chunks: the chunks a collective step moves next, drawn by the ring view as quads built on
// the CPU (six vertices per chunk) into its render target. Positions arrive in target pixels with
// the origin at the top left, so the view never thinks in clip space.
layout(location = 0) in vec2 a_pos;    // target pixels, origin top left
layout(location = 1) in vec2 a_local;  // pixels from the chunk's center
layout(location = 2) in vec2 a_shape;  // half side, corner radius (pixels)
layout(location = 3) in vec4 a_color;  // straight RGBA
layout(location = 4) in vec3 a_motion; // unit direction of travel (xy), tail length in pixels (z)

uniform vec2 u_target;  // target size in pixels

out vec2 v_local;
flat out vec2 v_shape;
flat out vec4 v_color;
flat out vec3 v_motion;

void main() {
  vec2 ndc = a_pos / u_target * 2.0 - 1.0;
  gl_Position = vec4(ndc.x, -ndc.y, 0.0, 1.0);  // pixel rows grow downwards
  v_local = a_local;
  v_shape = a_shape;
  v_color = a_color;
  v_motion = a_motion;
}
