// The start screen: a newcomer's first minute. It names what is on screen, offers three runs that
// each show one idea within their first presses, and the course; it opens at the first start and
// again on H, until its checkbox says no (app.cpp keeps that in the config directory).
#include <imgui.h>

#include <algorithm>

#include "app/views/views.h"

namespace dtlab::app {

namespace {

// One scenario: a wide button and, beside it, what the run will show.
bool scenario_button(const char* title, const char* what, float button_w) {
  const bool clicked = ImGui::Button(title, ImVec2(button_w, ImGui::GetFrameHeight() * 1.4f));
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("%s", what);
  ImGui::PopTextWrapPos();
  return clicked;
}

void on_screen(const char* name, const char* what) {
  ImGui::Bullet();
  ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1.0f), "%s", name);
  ImGui::SameLine();
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextUnformatted(what);
  ImGui::PopTextWrapPos();
}

}  // namespace

StartChoice draw_start_screen(bool& show_at_start, bool large) {
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const float font = ImGui::GetFontSize();
  const float w = std::min(vp->WorkSize.x * 0.9f, font * (large ? 44.0f : 58.0f));
  ImGui::SetNextWindowPos(ImVec2(vp->WorkPos.x + vp->WorkSize.x * 0.5f, vp->WorkPos.y + vp->WorkSize.y * 0.5f),
                          ImGuiCond_Always, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(w, 0), ImGuiCond_Always);
  ImGui::SetNextWindowSizeConstraints(ImVec2(w, 0), ImVec2(w, vp->WorkSize.y * 0.95f));
  ImGui::SetNextWindowFocus();
  StartChoice choice = StartChoice::None;
  bool open = true;
  if (!ImGui::Begin("Start here", &open, ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoMove)) {
    ImGui::End();
    return open ? choice : StartChoice::Close;
  }
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextUnformatted("dtlab runs a real training job on several ranks and lets you stop before any operation of "
                         "any rank. Behind this window a run waits, paused (the lab starts with DDP on 4 ranks).");
  ImGui::PopTextWrapPos();
  ImGui::Spacing();
  on_screen("Toolbar:", "Space runs and pauses; R steps one ring step, C one collective, F one layer, B one gradient "
                        "into its bucket, I one iteration. The yellow line says what the next press does.");
  on_screen("Ring:", "the collective in flight, chunk by chunk: each cell counts the ranks whose values it holds.");
  on_screen("Buckets:", "DDP's gradient buckets filling during backward and launching their all-reduce.");
  on_screen("Timeline:", "each rank's compute and communication on the modeled clock (M: the wall clock).");
  on_screen("Memory, Collective, Data:", "what each rank holds; who has arrived and the predicted time; which "
                                         "samples each rank trains on.");
  ImGui::Spacing();
  ImGui::Separator();
  ImGui::TextUnformatted("Start with one idea:");
  const float bw = font * (large ? 13.0f : 15.0f);
  struct Scenario {
    const char* title;
    const char* what;
    StartChoice choice;
  };
  static const Scenario kScenarios[] = {
      {"DDP: overlap", "4 ranks, small buckets: runs 3 iterations, then the timeline shows the all-reduces hidden "
                       "behind backward", StartChoice::DdpOverlap},
      {"FSDP: memory", "parameters, gradients and optimizer state split over 4 ranks: the Memory view beside the "
                       "planner's figures", StartChoice::FsdpMemory},
      {"Pipeline: the bubble", "4 stages, 8 micro-batches, 1F1B with equal stage costs: the measured bubble equals "
                               "(p-1)/(m+p-1)", StartChoice::PipelineBubble},
      {"The course", "lessons that ask you to predict what happens next, then step the run to check (L opens and "
                     "closes them)", StartChoice::Course},
  };
  for (const Scenario& sc : kScenarios)
    if (scenario_button(sc.title, sc.what, bw)) choice = sc.choice;
  ImGui::Separator();
  if (ImGui::Button("Close") || ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false)) choice = StartChoice::Close;
  ImGui::SameLine(0, font * 1.5f);
  ImGui::Checkbox("Show this at start", &show_at_start);
  ImGui::TextDisabled("H: this screen again   P: presentation   F11: full screen   Esc: close");
  ImGui::End();
  if (!open) choice = StartChoice::Close;
  return choice;
}

}  // namespace dtlab::app
