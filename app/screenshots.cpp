#include "app/screenshots.h"

#include <GL/gl.h>
#include <stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "app/figures.h"
#include "app/snapshot_builder.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"

namespace dtlab::app {

void Screenshots::request(const std::string& path, int frames) {
  path_ = path;
  frames_ = frames;
}

bool Screenshots::due() { return !path_.empty() && --frames_ <= 0; }

bool Screenshots::save(int w, int h, const std::string& state) {
  const std::string path = path_;
  path_.clear();
  std::vector<unsigned char> px(static_cast<size_t>(w) * static_cast<size_t>(h) * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, w, h, GL_RGBA, GL_UNSIGNED_BYTE, px.data());
  // OpenGL's rows start at the bottom; PNG's at the top. Alpha is made opaque.
  std::vector<unsigned char> flipped(px.size());
  const size_t row = static_cast<size_t>(w) * 4;
  for (int y = 0; y < h; y++)
    std::copy(px.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h - 1 - y) * row),
              px.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h - y) * row),
              flipped.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(y) * row));
  for (size_t i = 3; i < flipped.size(); i += 4) flipped[i] = 255;
  std::vector<unsigned char> png;
  stbi_write_png_to_func([](void* ctx, void* data, int size) {
    auto* out = static_cast<std::vector<unsigned char>*>(ctx);
    out->insert(out->end(), static_cast<unsigned char*>(data), static_cast<unsigned char*>(data) + size);
  }, &png, w, h, 4, flipped.data(), static_cast<int>(row));
  try {
    check_output_path("screenshot", path);
    AtomicFile f(path);  // whole file or nothing
    f.write(png.data(), png.size());
    f.commit();
  } catch (const Error& e) {
    std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
    return false;
  }
  // What the picture shows, in words: scripts and tests check the state they stopped at.
  std::printf("screenshot %s (%dx%d): %s\n", path.c_str(), w, h, state.c_str());
  std::fflush(stdout);
  return true;
}

std::string run_state_text(const Snapshot& sn) {
  std::string state = "iteration " + std::to_string(sn.iteration) + ", step " + std::to_string(sn.step);
  if (sn.collective.valid) {
    const CollectiveView& cv = sn.collective;
    state += "; collective " + (cv.group_name.empty() ? std::string("world") : cv.group_name) + " #" + std::to_string(cv.seq) + " " +
             collective_name(cv.op) + " " + algorithm_name(cv.algo) +
             ", " + std::to_string(cv.steps_done) + " of " + std::to_string(cv.steps) + " steps done";
    if (cv.steps_done < cv.steps && cv.phase != RingPhase::None) state += ", next " + std::string(ring_phase_name(cv.phase));
  }
  if (sn.held.valid) state += "; paused before " + pending_text(sn.held);
  if (!sn.buckets.empty()) {
    state += "; buckets";
    for (const BucketView& b : sn.buckets) state += " " + std::to_string(b.index) + ":" + bucket_state_name(b.state);
  }
  if (const PipelineView& pv = sn.pipeline; pv.valid && pv.iteration >= 0) {
    int done = 0;
    for (int r = 0; r < pv.p; r++) done += static_cast<int>(pv.row(r).done.size());
    state += "; pipeline " + pv.plan.name + " iteration " + std::to_string(pv.iteration) +
             (pv.complete ? " finished" : ", " + std::to_string(done) + " actions done");
  }
  return state;
}

bool SpoilerCheck::capture_before(int step) {
  if (before_check_.count(step)) return false;
  capture_step_ = step;
  before_check_[step];
  return true;
}

void SpoilerCheck::after_render(const ImDrawData& data) {
  if (capture_step_ >= 0) before_check_[capture_step_] = screen_text(data), capture_step_ = -1;
}

std::vector<std::string> SpoilerCheck::check(const LessonRunner* lesson) {
  std::vector<std::string> found;
  for (auto it = before_check_.begin(); it != before_check_.end();) {
    const int j = it->first;
    if (!lesson || capture_step_ == j || j >= lesson->steps() || !lesson->answer(j).revealed) {
      ++it;
      continue;
    }
    const LessonStep& st = lesson->lesson().steps[static_cast<size_t>(j)];
    const double live = lesson->answer(j).live;
    // A whole number asked without a tolerance must be given exactly: "4.4 KiB" does not give 4544.
    const bool exact = st.question && live == std::floor(live) && st.question->tol_abs < 0 && st.question->tol_rel < 0;
    std::string where = st.question && st.question->choices.empty() ? find_spoiler(it->second, answer_spellings(live, exact), st.question->unit) : "";
    std::string fix = "open that view in the question's reveal: or ask what the screen does not show";
    if (const std::string guess = st.question ? bare_guess(*st.question, live) : ""; where.empty() && !guess.empty()) {
      const std::string why = lesson->lesson().path + ":" + std::to_string(st.question->line) + ": step " + std::to_string(j + 1) +
                              " '" + st.title + "' takes the guess " + guess +
                              " as its answer, which a learner gets right without reasoning; ask for an amount between none and all";
      std::fprintf(stderr, "dtlab: %s\n", why.c_str());
      found.push_back(why);
      it = before_check_.erase(it);
      continue;
    }
    if (where.empty()) {
      // The lesson's own text (earlier steps and the header included) and the earlier answers.
      std::vector<double> earlier;
      for (int k = 0; k < j; k++)
        earlier.push_back(lesson->answer(k).revealed ? lesson->answer(k).live : std::numeric_limits<double>::quiet_NaN());
      if (const std::string in_text = find_text_spoiler(lesson->lesson(), j, live, earlier); !in_text.empty()) {
        where = "the lesson's text, " + in_text;
        fix = "ask for what the text before it does not state: other numbers, a derived quantity, a prediction";
      }
    }
    if (!where.empty()) {
      const std::string why = lesson->lesson().path + ":" + std::to_string(st.question->line) + ": step " +
                              std::to_string(j + 1) + " '" + st.title + "' shows its answer (" + format_figure(live) +
                              ") before the check, in " + where + "; " + fix;
      std::fprintf(stderr, "dtlab: %s\n", why.c_str());
      found.push_back(why);
    }
    it = before_check_.erase(it);
  }
  return found;
}

}  // namespace dtlab::app
