// ImVec2 arithmetic for the canvas code (ImGui 1.86 keeps its operators internal). One definition,
// so the ring view, its layout solver and its GL pass can share a unity batch.
#pragma once
#include <imgui.h>

#include <cmath>

namespace dtlab::app {

inline constexpr float kPi = 3.14159265358979f;

inline ImVec2 operator+(ImVec2 a, ImVec2 b) { return ImVec2(a.x + b.x, a.y + b.y); }
inline ImVec2 operator-(ImVec2 a, ImVec2 b) { return ImVec2(a.x - b.x, a.y - b.y); }
inline ImVec2 operator*(ImVec2 a, float k) { return ImVec2(a.x * k, a.y * k); }
inline float length(ImVec2 a) { return std::sqrt(a.x * a.x + a.y * a.y); }

}  // namespace dtlab::app
