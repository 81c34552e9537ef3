// What the lab checks on its own screen: screenshots a script asks for (a PNG of the back buffer,
// and one line saying what it shows, which tests read), and --check-spoilers (the text on screen
// just before each lesson question's check, searched for the answer once it is revealed). The app
// calls both once a frame after rendering; the script runner asks for them.
#pragma once
#include <imgui.h>

#include <map>
#include <string>
#include <vector>

#include "app/lesson_runner.h"
#include "app/snapshot.h"
#include "app/spoilers.h"

namespace dtlab::app {

class Screenshots {
 public:
  // Takes a screenshot into `path` at the end of the `frames`-th frame from now (later frames let
  // the layout and the views' render targets settle).
  void request(const std::string& path, int frames);
  bool pending() const { return !path_.empty() || layout_frames_ > 0; }
  // Counts a rendered frame; true when the requested screenshot is to be taken now.
  bool due();
  // Reads the back buffer (w x h pixels) into the requested PNG, written whole or not at all, and
  // prints "screenshot PATH (WxH): STATE". False, with one sentence on stderr, when it cannot be
  // written. Clears the request either way.
  bool save(int w, int h, const std::string& state);
  // `check layout`: at the end of the `frames`-th frame from now, list what the screen cuts off
  // (app/layout_check.h); the app prints it and a script then exits 1.
  void request_layout_check(int frames) { layout_frames_ = frames; }
  bool layout_check_due() { return layout_frames_ > 0 && --layout_frames_ == 0; }

 private:
  std::string path_;
  int frames_ = 0;
  int layout_frames_ = 0;
};

// What a screenshot of a run shows, in words: iteration, step, the collective, held item, buckets
// and pipeline progress.
std::string run_state_text(const Snapshot& s);

class SpoilerCheck {
 public:
  // `lesson _precheck J` (before the question's reveal actions): true the first time, when the step's
  // screen is to be read: the app draws one more frame of it and runs the command again.
  bool capture_before(int step);
  // After ImGui::Render: reads the screen when a capture was asked for.
  void after_render(const ImDrawData& data);
  // Once a question's answer is revealed: was it on screen before the check? One sentence per
  // spoiler found (also printed on stderr).
  std::vector<std::string> check(const LessonRunner* lesson);

 private:
  // The text on screen just before each question's check, by step, until the revealed answer can
  // be looked for in it.
  std::map<int, std::vector<ScreenLine>> before_check_;
  int capture_step_ = -1;  // capture the screen at the end of this frame for that step
};

}  // namespace dtlab::app
