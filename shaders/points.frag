#version 330 core
// A round, soft-edged point with a slightly darker rim, so overlapping samples stay apart.
in vec4 v_color;
uniform float u_point_size;  // diameter in pixels: the edge is antialiased over about one pixel
out vec4 frag_color;

void main() {
  float r = length(gl_PointCoord * 2.0 - 1.0);  // 0 at the center, 1 at the edge
  float edge = 2.0 / max(u_point_size, 1.0);
  float coverage = 1.0 - smoothstep(1.0 - edge, 1.0, r);
  if (coverage <= 0.0) discard;
  float rim = smoothstep(0.55, 0.95, r);
  frag_color = vec4(v_color.rgb * (1.0 - 0.35 * rim), v_color.a * coverage);
}
