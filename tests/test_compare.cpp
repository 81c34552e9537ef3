// The lab's A/B comparison (app/compare.h): a run's last iteration summed up from its Snapshot (step
// time, overlap, peak memory, the slowest link and its bytes), the table of differences, the
// settings two runs differ in, and `compare FLAGS` applied to a configuration.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "app/compare.h"
#include "app/script.h"
#include "app/session.h"
#include "engine/core/check.h"
#include "engine/train/settings.h"
#include "tests/session_util.h"

using namespace dtlab;
using namespace dtlab::app;
using namespace dtlab::test;

namespace {

// A DDP run on ib2x4 (2 nodes of 4), its model's gradients in buckets of at most 64 KiB, run to the
// end of iteration 2, and its snapshot.
Snapshot ddp_on_two_nodes(Algorithm algo, int64_t bucket_cap) {
  TrainConfig c = lab_config(8);
  c.model = ModelSpec::parse("mlp:2,128,128,3");
  c.profile = "ib2x4";
  c.algo = algo;
  c.ddp.bucket_cap_bytes = bucket_cap;
  c.ddp.first_bucket_bytes = bucket_cap;
  Session s(c);
  step(s, GateKind::Iteration, 3);  // the constructor's checks, iterations 0 and 1
  return step(s, GateKind::Iteration, 1);
}

RunSummary summary(double step_s, double overlap, int64_t peak, const std::string& link, double link_bytes, double link_s) {
  RunSummary r;
  r.valid = true;
  r.iteration = 2;
  r.step_model_s = step_s;
  r.overlap = overlap;
  r.peak_bytes = peak;
  r.slowest_link = link;
  r.slowest_link_bytes = link_bytes;
  r.slowest_link_s = link_s;
  return r;
}

}  // namespace

TEST_SUITE("compare") {
  TEST_CASE("a ring all-reduce across two nodes puts 2(n-1)/n of every payload on one NIC") {
    const Snapshot s = ddp_on_two_nodes(Algorithm::Ring, 64 * 1024);
    const RunSummary r = summarize_run(s);
    REQUIRE(r.valid);
    CHECK(r.iteration == 2);
    CHECK(r.step_model_s > 0);
    // Iteration 2's collectives: its buckets' all-reduces (and nothing else on the world).
    CHECK(r.collectives >= 2);
    CHECK(r.collective_bytes > 0);
    // Ring 0 -> 1 -> ... -> 7 -> 0 crosses between the nodes at 3 -> 4 and 7 -> 0; each of the 2(n-1)
    // steps moves S/n over each of those NICs: 14/8 of S in all, the most busy time of any link.
    CAPTURE(r.slowest_link);
    CHECK(r.slowest_link.find("NIC") != std::string::npos);
    CHECK(r.slowest_link_bytes == doctest::Approx(1.75 * static_cast<double>(r.collective_bytes)).epsilon(1e-9));
    CHECK(r.slowest_link_s > 0);
    // The peak is a rank's total at its highest, never below what it holds between iterations.
    CHECK(r.peak_bytes >= s.memory[0].stats.total_current);
    CHECK(r.peak_rank >= 0);
  }

  TEST_CASE("the same iteration with the double binary tree moves fewer bytes on its slowest link") {
    const RunSummary ring = summarize_run(ddp_on_two_nodes(Algorithm::Ring, 64 * 1024));
    const RunSummary tree = summarize_run(ddp_on_two_nodes(Algorithm::DoubleTree, 64 * 1024));
    REQUIRE(ring.valid);
    REQUIRE(tree.valid);
    CHECK(tree.collective_bytes == ring.collective_bytes);  // the same gradients, the same buckets
    CHECK(tree.peak_bytes == ring.peak_bytes);
    CHECK(tree.slowest_link_bytes < ring.slowest_link_bytes);
    const std::vector<DifferenceRow> rows = difference_rows(ring, tree);
    REQUIRE(rows.size() == 6);
    CHECK(rows[2].what == "peak memory");
    CHECK(rows[2].change == "same");
    CHECK(rows[4].what == "bytes on it");
    CHECK(rows[4].better == 1);
  }

  TEST_CASE("one large bucket runs fewer all-reduces of the same bytes than small ones") {
    const RunSummary small = summarize_run(ddp_on_two_nodes(Algorithm::Ring, 16 * 1024));
    const RunSummary large = summarize_run(ddp_on_two_nodes(Algorithm::Ring, 25 << 20));
    REQUIRE(small.valid);
    REQUIRE(large.valid);
    // One bucket's all-reduce (and the step report's all-reduce of the loss) against several.
    CHECK(large.collectives == 2);
    CHECK(small.collectives > large.collectives);
    CHECK(small.collective_bytes == large.collective_bytes);
    CHECK(small.slowest_link_bytes == doctest::Approx(large.slowest_link_bytes).epsilon(1e-9));
  }

  TEST_CASE("a run with no finished iteration summarizes as not yet") {
    Session s(lab_config(2));
    const RunSummary r = summarize_run(step(s, GateKind::Collective, 1));
    CHECK_FALSE(r.valid);
    const std::vector<DifferenceRow> rows = difference_rows(r, summary(1e-3, 0.5, 1024, "node 0 NIC 0 out", 4096, 1e-4));
    CHECK(rows[0].a == "not yet");
    CHECK(rows[0].change.empty());
  }

  TEST_CASE("the differences table: percent changes, overlap in points, better and worse") {
    const RunSummary a = summary(2e-3, 0.48, 40 << 20, "rank 0 port out", 12 << 20, 1.0e-3);
    const RunSummary b = summary(2.5e-3, 0.0, 40 << 20, "node 0 NIC 3 out", 6 << 20, 0.5e-3);
    const std::vector<DifferenceRow> rows = difference_rows(a, b);
    REQUIRE(rows.size() == 6);
    CHECK(rows[0].change == "+25%");
    CHECK(rows[0].better == -1);
    CHECK(rows[1].a == "48%");
    CHECK(rows[1].b == "0%");
    CHECK(rows[1].change == "-48 pts");
    CHECK(rows[1].better == -1);
    CHECK(rows[2].change == "same");
    CHECK(rows[2].better == 0);
    CHECK(rows[3].change == "another");
    CHECK(rows[4].a == "12.0 MiB");
    CHECK(rows[4].change == "-50%");
    CHECK(rows[4].better == 1);
    CHECK(rows[5].change == "-50%");
  }

  TEST_CASE("the captions name the settings the runs differ in, defaults by their value") {
    RunConfigView a, b;
    a.settings = {{"--strategy", "ddp"}, {"--bucket-cap-mb", "1"}};
    b.settings = {{"--strategy", "ddp"}, {"--algo", "dbtree"}};
    const std::vector<SettingDifference> d = setting_differences(a, b);
    REQUIRE(d.size() == 2);
    CHECK(d[0].flag == "--bucket-cap-mb");
    CHECK(d[0].a == "1");
    CHECK(d[0].b == setting_text(*find_setting("--bucket-cap-mb"), TrainConfig{}));
    CHECK(d[1].flag == "--algo");
    CHECK(d[1].b == "dbtree");
    CHECK(side_caption(d, false).find("--algo dbtree") != std::string::npos);
    CHECK(side_caption({}, true) == "the same settings");
  }

  TEST_CASE("compare FLAGS: the lab's flags on top of the run's settings, refused with one sentence") {
    TrainConfig c = lab_config(4);
    apply_compare_flags(c, {"--bucket-cap-mb", "25", "--algo", "dbtree"});
    CHECK(c.ddp.bucket_cap_bytes == int64_t{25} << 20);
    CHECK(c.algo == Algorithm::DoubleTree);
    CHECK(c.world_size == 4);  // what was not named stays
    CHECK_THROWS_WITH_AS(apply_compare_flags(c, {}), doctest::Contains("compare needs the settings of run B"), Error);
    CHECK_THROWS_WITH_AS(apply_compare_flags(c, {"--world", "many"}), doctest::Contains("--world"), Error);
    CHECK_THROWS_WITH_AS(apply_compare_flags(c, {"--sharding", "FULL_SHARD"}), doctest::Contains("--sharding"), Error);
  }

  TEST_CASE("scripts: pin, unpin and compare --FLAG parse, and a flag that is no setting fails before any window") {
    const std::vector<ScriptCommand> cmds = parse_script("pin; compare --bucket-cap-mb 25 --algo=ring; unpin", "test");
    REQUIRE(cmds.size() == 3);
    CHECK(cmds[0].kind == ScriptCommand::Pin);
    CHECK(cmds[1].kind == ScriptCommand::CompareRun);
    CHECK(cmds[1].arg == "--bucket-cap-mb 25 --algo=ring");
    CHECK(cmds[2].kind == ScriptCommand::Unpin);
    CHECK(live_command(cmds[1]));
    CHECK_THROWS_WITH_AS(parse_script("compare --bucket-cap 25", "test"), doctest::Contains("--bucket-cap is not a setting"), Error);
    CHECK_THROWS_WITH_AS(parse_script("pin now", "test"), doctest::Contains("pin takes no argument"), Error);
    // The imported traces' `compare PROFILE` is unchanged.
    CHECK(parse_script("compare nvlink8", "test")[0].kind == ScriptCommand::Compare);
  }
}
#endif
