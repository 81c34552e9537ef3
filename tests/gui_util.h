// What the GUI suites (gui, trace gui) share: the lab run under Xvfb as a person would, and its
// screenshots read back as RGB pixels, with how many are near a view's color ("the ranks are on screen").
#pragma once
#include <doctest/doctest.h>
#include <imgui.h>
#include <stb_image.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "app/script.h"
#include "engine/core/check.h"
#include "tests/test_util.h"

namespace dtlab::test {

// The sentence a --run script fails to parse with, or "" when it parses.
inline std::string script_error(const std::string& text) {
  try {
    app::parse_script(text, "--run");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline bool have_xvfb() { return shell("command -v xvfb-run").code == 0; }
// Leaves the test case, saying why, on a machine without xvfb-run (the GUI suites' first line).
#define DTLAB_REQUIRE_XVFB()                                                      \
  do {                                                                            \
    if (!::dtlab::test::have_xvfb()) {                                            \
      MESSAGE("skipped: xvfb-run is not installed (apt-get install xvfb xauth)"); \
      return;                                                                     \
    }                                                                             \
  } while (0)

// The app under a fresh virtual display of 1280x720, layout from a throwaway config dir.
inline ShellResult run_app(const std::string& args, const TempDir& dir) { return run_lab(dir.file("config"), args); }

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> px;  // RGB
  ImU32 at(int x, int y) const {
    const unsigned char* p = &px[(static_cast<size_t>(y) * static_cast<size_t>(w) + static_cast<size_t>(x)) * 3];
    return IM_COL32(p[0], p[1], p[2], 255);
  }
};

inline Image load_png(const std::string& path) {
  Image im;
  int comp = 0;
  unsigned char* data = stbi_load(path.c_str(), &im.w, &im.h, &comp, 3);
  REQUIRE_MESSAGE(data != nullptr, "cannot read " << path);
  im.px.assign(data, data + static_cast<size_t>(im.w) * static_cast<size_t>(im.h) * 3);
  stbi_image_free(data);
  return im;
}

// Pixels within `tol` (per channel) of color c.
inline int count_near(const Image& im, ImU32 c, int tol = 24) {
  const int r = static_cast<int>(c & 0xff), g = static_cast<int>((c >> 8) & 0xff), b = static_cast<int>((c >> 16) & 0xff);
  int n = 0;
  for (size_t i = 0; i + 2 < im.px.size(); i += 3)
    if (std::abs(im.px[i] - r) <= tol && std::abs(im.px[i + 1] - g) <= tol && std::abs(im.px[i + 2] - b) <= tol) n++;
  return n;
}

}  // namespace dtlab::test
