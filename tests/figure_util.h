// Helpers the suites that evaluate live figures on snapshots made by hand share
// (test_precision_figures.cpp, test_moe_figures.cpp).
#pragma once
#include <string>

#include "app/figures.h"
#include "engine/core/check.h"

namespace dtlab::test {

// The sentence a figure fails with on `s` ("" when it has a value).
inline std::string figure_error(const std::string& text, const app::Snapshot& s) {
  try {
    app::Figure::parse(text).eval(app::FigureScope{&s, nullptr});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dtlab::test
