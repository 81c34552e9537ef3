// The Bus bandwidth view under Xvfb, as a person would use it: a 16-rank run on two DGX-H100-like
// nodes, the plot on the whole window, its screenshot checked for one curve per algorithm the profile
// offers (ring, dbtree, hierarchical, nvls) and the dashed crossover lines. Skips without xvfb-run.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <string>

#include "app/views/views.h"
#include "tests/gui_util.h"
#include "tests/test_util.h"

using namespace dtlab;

TEST_SUITE("gui") {
  TEST_CASE("under Xvfb: the busbw plot draws every algorithm the profile offers, and the crossovers") {
    DTLAB_REQUIRE_XVFB();
    CHECK(test::script_error("view sweep").empty());
    test::TempDir dir;
    const std::string png = dir.file("sweep.png");
    test::ShellResult r = test::run_app("--world 16 --profile dgx-h100x2 --algo auto --run 'step collective 2; view sweep; "
                                        "screenshot " + png + "; quit'",
                                        dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    test::Image im = test::load_png(png);
    for (Algorithm a : {Algorithm::Ring, Algorithm::DoubleTree, Algorithm::Hierarchical, Algorithm::InNetwork}) {
      INFO(algorithm_name(a));
      CHECK(test::count_near(im, app::algorithm_color(a), 8) > 150);
    }
    CHECK(test::count_near(im, IM_COL32(255, 230, 120, 255), 8) > 50);  // the crossovers' labels
  }
}

#endif  // DTLAB_HAVE_GUI
