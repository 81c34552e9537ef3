// The topology view under Xvfb, as a person would use it: a run on a multi-node profile paused at
// a collective step, the view on the whole window, its screenshot checked for the GPUs (rank colors)
// and the lit links (the step's phase color; red where the binomial tree's cross-node step queues
// four transfers on each of the PCIe boxes' two NICs). Skips with a message without xvfb-run.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <string>

#include "app/views/views.h"
#include "tests/gui_util.h"
#include "tests/test_util.h"

using namespace dtlab;

TEST_SUITE("gui") {
  TEST_CASE("script: view topology parses, the lab offers every profile") {
    CHECK(test::script_error("view topology").empty());
    CHECK(test::script_error("view sideways").find("shards, pipeline, topology, sweep, mesh, sizing, roofline, experts, alltoall, context, all") != std::string::npos);
  }

  TEST_CASE("under Xvfb: the topology view lights the links of a step, red where they are shared") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir;
    const std::string png = dir.file("topology.png");
    // Collective #1 is the parameter broadcast (binomial tree from rank 0); its 4th step sends
    // r -> r + 8 for r < 8: across the two boxes, 4 transfers per NIC.
    test::ShellResult r = test::run_app("--world 16 --profile pcie-box --run 'step collective 1; step ring 4; view topology; "
                                        "screenshot " + png + "; quit'",
                                        dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("collective world #1 broadcast tree, 3 of 4 steps done") != std::string::npos);
    test::Image im = test::load_png(png);
    CHECK(im.w == 1280);
    for (int rank : {0, 7, 8, 15}) CHECK(test::count_near(im, app::rank_color(rank, 16), 8) > 30);
    CHECK(test::count_near(im, app::link_load_color(RingPhase::Broadcast, 4), 8) > 200);  // the shared NIC links
  }
}

#endif  // DTLAB_HAVE_GUI
