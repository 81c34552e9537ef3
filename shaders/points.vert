#version 330 core
// One sample of the data view's scatter: its first two features, its color (owner rank or class)
// and its group (the same rank or class as a number), so a legend hover can dim the others.
layout(location = 0) in vec2 a_pos;    // data coordinates
layout(location = 1) in vec4 a_color;  // RGBA, normalized from bytes
layout(location = 2) in float a_group;

uniform vec2 u_center;        // data point drawn at the middle of the target
uniform vec2 u_scale;         // data units to clip space (aspect kept by the caller)
uniform float u_point_size;   // diameter in pixels
uniform float u_highlight;    // group to show in full, < 0: every group
uniform int u_pass;           // 0: every point; 1: only the dimmed ones; 2: only the highlighted ones

out vec4 v_color;

void main() {
  bool dim = u_highlight >= 0.0 && abs(a_group - u_highlight) > 0.5;
  if ((u_pass == 1 && !dim) || (u_pass == 2 && dim)) {
    gl_Position = vec4(2.0, 2.0, 2.0, 1.0);  // outside the clip volume: not drawn in this pass
    gl_PointSize = 1.0;
    v_color = vec4(0.0);
    return;
  }
  gl_Position = vec4((a_pos - u_center) * u_scale, 0.0, 1.0);
  gl_PointSize = dim ? u_point_size * 0.75 : u_point_size;
  v_color = dim ? vec4(a_color.rgb * 0.55, a_color.a * 0.6) : a_color;
}
