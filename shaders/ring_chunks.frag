#version 330 core
// ring_chunks: a rounded square with a lit face and a darker rim, a soft glow that breathes with
// time, and a fading streak behind it along its direction of travel. Output is premultiplied
// alpha: the view draws the target with blend (ONE, ONE_MINUS_SRC_ALPHA).
in vec2 v_local;
flat in vec2 v_shape;
flat in vec4 v_color;
flat in vec3 v_motion;

uniform float u_time;  // seconds

out vec4 o_color;

float sd_round_box(vec2 p, vec2 half_size, float radius) {
  vec2 q = abs(p) - half_size + vec2(radius);
  return length(max(q, 0.0)) + min(max(q.x, q.y), 0.0) - radius;
}

void main() {
  float half_side = v_shape.x;
  float d = sd_round_box(v_local, vec2(half_side), v_shape.y);  // < 0 inside, pixels
  float body = 1.0 - smoothstep(-0.75, 0.75, d);

  vec2 uv = v_local / half_side;  // -1 .. 1 across the face
  vec3 base = v_color.rgb;
  float light = 1.0 + 0.14 * (-uv.x - uv.y);
  float spec = 0.30 * (1.0 - smoothstep(0.0, 0.55, length(uv - vec2(-0.42, -0.42))));
  float rim = smoothstep(-max(1.5, half_side * 0.2), 0.0, d);
  vec3 face = mix(base * light + vec3(spec), base * 0.45, rim * 0.85);

  // Glow: reaches 1.5 half sides out and fades to exactly zero there (no quad edge shows).
  float pulse = 0.8 + 0.2 * sin(u_time * 5.0);
  float g = clamp(1.0 - max(d, 0.0) / (half_side * 1.5), 0.0, 1.0);
  float glow = 0.7 * pulse * g * g * g;

  // Streak: behind the chunk, narrowing and fading with distance.
  vec2 dir = v_motion.xy;
  float tail = max(v_motion.z, 1e-3);
  float behind = dot(v_local, -dir);
  float across = abs(dot(v_local, vec2(-dir.y, dir.x)));
  float k = clamp(behind / tail, 0.0, 1.0);
  float width = half_side * mix(0.95, 0.25, k);
  float streak = behind > 0.0 && behind < tail ? 0.6 * pow(1.0 - k, 1.5) * (1.0 - smoothstep(width * 0.4, width, across)) : 0.0;

  float outside = max(glow, streak) * (1.0 - body);
  vec3 halo = mix(base, vec3(1.0), 0.3);
  float a = clamp(body + outside, 0.0, 1.0) * v_color.a;
  o_color = vec4((face * body + halo * outside) * v_color.a, a);
}
