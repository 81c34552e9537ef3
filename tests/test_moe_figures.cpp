// The live figures lesson 31 (mixture of experts) reads: each rank's routing (moe.*), the rows each
// rank's experts compute under --ep (moe.rows*), and the newest all-to-all (alltoall.*); on a
// snapshot made by hand, and on a live --ep run stepped to its dispatch, where they must agree with
// what the engine's all-to-all really put in.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <chrono>

#include "app/figures.h"
#include "app/session.h"
#include "app/snapshot.h"
#include "app/spoilers.h"
#include "engine/core/check.h"
#include "tests/figure_util.h"
#include "tests/session_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

ExpertsBlockView block(int layer, int64_t tokens, int64_t capacity, std::vector<int64_t> routed) {
  ExpertsBlockView b;
  b.layer = layer, b.tokens = tokens, b.capacity = capacity, b.routed = routed;
  b.kept = routed;
  for (int64_t& k : b.kept)
    if (capacity > 0) k = std::min(k, capacity);
  for (size_t e = 0; e < routed.size(); e++) b.dropped += routed[e] - b.kept[e];
  b.aux_loss = 0.0125;
  return b;
}

}  // namespace

TEST_SUITE("lessons") {
  TEST_CASE("moe figures: each rank's routing, the rows its experts compute under --ep, and the newest all-to-all") {
    Snapshot s;
    s.config.world = 4;
    const FigureScope sc{&s, nullptr};
    auto eval = [&](const char* t) { return Figure::parse(t).eval(sc); };
    CHECK(test::figure_error("moe.tokens(0, 0)", s) == "moe.tokens(): this run has no mixture of experts; start a GPT with --moe experts=E,top_k=K");
    s.experts.moe = true;
    s.experts.experts = 4, s.experts.top_k = 2, s.experts.capacity_factor = 1.0, s.experts.ep = 2;
    CHECK(test::figure_error("moe.dropped(0, 0)", s).find("the routing is read when the run stands still") != std::string::npos);
    // 4 ranks in EP groups [0, 1] and [2, 3]: rank 0 and rank 2 hold experts 0-1, ranks 1 and 3 experts 2-3.
    // 8 tokens a rank, 16 pairs, capacity 4 (ceil(16 / 4 x 1.0)); block 1 only (block 0 is dense).
    s.experts.read = true;
    s.experts.at_step = 3;
    CHECK(test::figure_error("moe.dropped(0, 0)", s) ==
          "moe.dropped(): the routing was read at step 3 and the run has moved on since; pause or step it, and the lab reads every "
          "rank's router again");
    s.experts.current = true;
    s.experts.ranks = {{block(1, 8, 4, {7, 3, 4, 2})},
                       {block(1, 8, 4, {1, 5, 6, 4})},
                       {block(1, 8, 4, {4, 4, 4, 4})},
                       {}};
    CHECK(eval("moe.tokens(0, 1)") == 8);
    CHECK(eval("moe.capacity(0, 1)") == 4);
    CHECK(eval("moe.routed(0, 1, 0)") == 7);
    CHECK(eval("moe.kept(0, 1, 0)") == 4);
    CHECK(eval("moe.dropped(0, 1)") == 3);
    CHECK(eval("moe.dropped(1, 1)") == 3);  // experts 1 and 2 over by 1 and 2
    CHECK(eval("moe.dropped(2, 1)") == 0);  // exactly full
    CHECK(eval("moe.aux_loss(0, 1)") == doctest::Approx(0.0125));
    CHECK(test::figure_error("moe.routed(0, 1, 4)", s) == "moe.routed(): expert 4 does not exist (there are 4)");
    CHECK(test::figure_error("moe.tokens(0, 0)", s) == "moe.tokens(): rank 0 has no MoE block 0 in its last forward (its MoE blocks: 1)");
    CHECK(test::figure_error("moe.tokens(3, 1)", s) == "moe.tokens(): rank 3 has no MoE block 1 in its last forward (it ran none yet)");
    CHECK(test::figure_error("moe.tokens(4, 1)", s) == "moe.tokens(): rank 4 does not exist (there are 4)");
    // Rows: rank 0 computes its group's kept pairs for experts 0-1 (4 + 3 from rank 0, 1 + 4 from
    // rank 1), rank 1 for experts 2-3 (4 + 2, 4 + 4); rank 2 its group's for experts 0-1 (4 + 4, and
    // rank 3 sent none: it has not run block 1), rank 3 for experts 2-3 (4 + 4).
    CHECK(eval("moe.rows(0, 1)") == 12);
    CHECK(eval("moe.rows(1, 1)") == 14);
    CHECK(eval("moe.rows(2, 1)") == 8);
    CHECK(eval("moe.rows(3, 1)") == 8);
    CHECK(eval("moe.rows_max(1)") == 14);
    CHECK(eval("moe.rows_mean(1)") == 10.5);
    // Without --ep each rank computes its own kept pairs (rank 1's experts 1 and 2 capped at 4).
    s.experts.ep = 1;
    CHECK(eval("moe.rows(0, 1)") == 13);
    CHECK(eval("moe.rows(1, 1)") == 13);
    CHECK(test::figure_error("moe.rows(3, 1)", s) == "moe.rows(): rank 3 does not run MoE block 1");
    CHECK(eval("moe.rows_mean(1)") == 14);
    CHECK(test::figure_error("moe.rows_max(0)", s) == "moe.rows_max(): rank 0 has no MoE block 0 in its last forward (its MoE blocks: 1)");

    // The All-to-all view's all-to-all (here the newest): ep1's over ranks 2 and 3, rank 2 issued (96 bytes leave it), step 0 half moved.
    CHECK(test::figure_error("alltoall.total", s) ==
          "alltoall.total: no all-to-all has been issued yet (an --ep run's MoE blocks issue them in forward and backward)");
    AllToAllView& a = s.alltoall;
    a.valid = true, a.group = 2, a.group_name = "ep1", a.members = {2, 3}, a.n = 2;
    a.bytes = {32, 96, -1, -1};
    a.sent = {96, -1};
    a.total = 96;
    CHECK(eval("alltoall.sent(2)") == 96);
    CHECK(test::figure_error("alltoall.sent(3)", s) == "alltoall.sent(): rank 3 has not issued the all-to-all yet");
    CHECK(test::figure_error("alltoall.sent(0)", s) == "alltoall.sent(): rank 0 is not in the all-to-all's group (ep1)");
    CHECK(eval("alltoall.bytes(2, 3)") == 96);
    CHECK(eval("alltoall.bytes(2, 2)") == 32);
    CHECK(test::figure_error("alltoall.bytes(3, 2)", s) ==
          "alltoall.bytes(): rank 3's block for rank 2 has not moved yet; step the all-to-all (step ring)");
    CHECK(eval("alltoall.total") == 96);

    // No spoilers: the routing covers the Experts view; the rows also the All-to-all view, whose
    // matrix holds them in bytes.
    CHECK(views_drawing("moe.dropped(R, L)") == std::vector<std::string>{"experts"});
    CHECK(views_drawing("moe.rows_max(L)") == std::vector<std::string>{"experts", "alltoall"});
    CHECK(views_drawing("alltoall.sent(R)") == std::vector<std::string>{"alltoall"});
  }

  TEST_CASE("moe figures on a live --ep run held at its dispatch: the bytes that leave a rank are its routed rows") {
    TrainConfig c = test::lab_config(4);
    c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
    c.data = "text";
    c.moe = MoeSpec::parse("experts=4,top_k=2");
    c.ep = 2;
    c.batch = 3;
    Session session(c);
    // The first all-to-all of the run is block 0's counts, on ep0; the next collective its dispatch.
    const Snapshot* s = &test::step(session, GateKind::Collective);
    for (int i = 0; i < 20 && !(s->held.valid && s->held.gate.label.rfind("ep0 #", 0) == 0); i++) s = &test::step(session, GateKind::Collective);
    REQUIRE(s->held.gate.label.rfind("ep0 #0 ", 0) == 0);
    s = &test::step(session, GateKind::Collective);
    REQUIRE(s->held.gate.label.rfind("ep0 #1 ", 0) == 0);
    REQUIRE(s->experts.read);
    REQUIRE(s->experts.current);
    const FigureScope sc{s, nullptr};
    auto eval = [&](const std::string& t) { return Figure::parse(t).eval(sc); };
    for (int r = 0; r < 4; r++) {
      CAPTURE(r);
      CHECK(eval("moe.tokens(" + std::to_string(r) + ", 0)") == 3 * 8);
      CHECK(eval("moe.dropped(" + std::to_string(r) + ", 0)") == 0);  // dropless
    }
    // Rank 0 holds experts 0 and 1: every other pair's row leaves it, 16 floats.
    CHECK(eval("alltoall.sent(0)") == eval("(moe.tokens(0, 0) * 2 - moe.kept(0, 0, 0) - moe.kept(0, 0, 1)) * 16 * 4"));
    CHECK(eval("alltoall.sent(1)") == eval("(moe.kept(1, 0, 0) + moe.kept(1, 0, 1)) * 16 * 4"));
    // Every pair is computed by some rank: the rows add up to the pairs, and rank 0 computes its own
    // and rank 1's pairs for experts 0 and 1.
    CHECK(eval("moe.rows(0, 0) + moe.rows(1, 0) + moe.rows(2, 0) + moe.rows(3, 0)") == 4 * 3 * 8 * 2);
    CHECK(eval("moe.rows_mean(0)") == 3 * 8 * 2);
    CHECK(eval("moe.rows(0, 0)") == eval("moe.kept(0, 0, 0) + moe.kept(0, 0, 1) + moe.kept(1, 0, 0) + moe.kept(1, 0, 1)"));
    CHECK(eval("moe.rows_max(0)") >= eval("moe.rows_mean(0)"));
  }
}
#endif  // DTLAB_HAVE_GUI
