// The focus every view follows (the stepper's, engine/trace/stepper.h): one line that says which
// rank, replica and group the views show, the same text in each.
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/mesh.h"

namespace dtlab::app {

std::string focus_caption(const Snapshot& s) {
  const StepperState& st = s.stepper;
  const MeshShape& m = s.mesh.shape;
  if (st.focus_rank >= 0) {
    std::string text = "focus: rank " + std::to_string(st.focus_rank);
    if (m.world() > 1 && st.focus_rank < m.world() && (m.dp > 1 || m.pp > 1 || m.tp > 1)) {
      const MeshCoord c = mesh_coord(m, st.focus_rank);
      std::vector<std::string> parts;
      if (m.dp > 1) parts.push_back("replica " + std::to_string(c.dp));
      if (m.pp > 1) parts.push_back("stage " + std::to_string(c.pp));
      if (m.tp > 1) parts.push_back(mesh_group_name(m, MeshDim::TP, st.focus_rank));
      std::string joined;
      for (size_t i = 0; i < parts.size(); i++) joined += (i ? ", " : "") + parts[i];
      text += " (" + joined + ")";
    }
    return text;
  }
  if (!st.focus_group.empty()) return "focus: group " + st.focus_group;
  return "";
}

void draw_focus_line(const Snapshot& s) {
  const std::string f = focus_caption(s);
  if (f.empty()) return;
  // Wrapped at the window's edge; the next gate beside the caption where it fits.
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextColored(ImVec4(0.55f, 0.85f, 1.0f, 1.0f), "%s", f.c_str());
  if (s.stepper.focused.valid) {
    const std::string next = "next: " + s.stepper.focused.gate.label;
    flow(ImGui::CalcTextSize(next.c_str()).x);
    ImGui::TextDisabled("%s", next.c_str());
  }
  ImGui::PopTextWrapPos();
}

}  // namespace dtlab::app
