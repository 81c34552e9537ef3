// The Sizing view under Xvfb: a `sizing SPEC` script line sets the calculator and brings the view
// forward, its memory bar is drawn in the memory view's category colors, and a bad key is one
// sentence at parse time. Skips without xvfb-run.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <string>

#include "app/views/views.h"
#include "tests/gui_util.h"
#include "tests/test_util.h"

using namespace dtlab;

TEST_SUITE("gui") {
  TEST_CASE("script: sizing KEY=VALUE parses, and a key that is no setting is one sentence") {
    CHECK(test::script_error("view sizing").empty());
    CHECK(test::script_error("sizing params=70B dp=128 tp=1 precision=fp16").empty());
    CHECK(test::script_error("sizing dq=4").find("'dq' is not a sizing setting") != std::string::npos);
    CHECK(test::script_error("sizing").find("sizing takes the calculator's settings") != std::string::npos);
    CHECK(test::script_error("sizing run").empty());
  }

  TEST_CASE("under Xvfb: sizing run restarts the lab with the layout scaled down, as the view's button") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir;
    // dp 2 x tp 2 with ZeRO-0: DDP on 4 ranks with --tp 2 (m = 64 / 2 = 32 micro-batches, capped at --accum 4).
    test::ShellResult r = test::run_app("--run 'sizing params=7B layers=32 hidden=4096 heads=32 global_batch=64 dp=2 tp=2 zero=0 sp=0 profile=nvlink8; "
                                        "sizing run; step iteration 1; screenshot " + dir.file("run.png") + "; quit'",
                                        dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    // The lab's default run has no mesh; the restarted one has data-parallel groups beside its TP pairs.
    CHECK(r.out.find("collective dp") != std::string::npos);  // dp0 or dp1: whichever group the stepper holds
    CHECK(r.out.find("[ranks 0, 1, 2, 3]") != std::string::npos);
  }

  TEST_CASE("under Xvfb: the Sizing view draws the course's 70B layout, its memory bar by category") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir;
    const std::string png = dir.file("sizing.png");
    test::ShellResult r = test::run_app("--run 'sizing params=70B dp=128 tp=1 global_batch=128 precision=fp16 zero=0 sp=0 compute_s=10; "
                                        "screenshot " + png + "; check layout; quit'",
                                        dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("nothing cut off, no text over text") != std::string::npos);
    test::Image im = test::load_png(png);
    for (MemCategory c : {MemCategory::Parameters, MemCategory::Gradients, MemCategory::OptimizerState, MemCategory::Activations})
      CHECK(test::count_near(im, app::memory_category_color(c), 8) > 100);
  }
}

#endif  // DTLAB_HAVE_GUI
