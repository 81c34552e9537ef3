// Pipeline schedules as data: golden grids for each generator (checked by hand against Megatron's
// warmup counts and PyTorch's orders), the action text round trip, the validator on broken grids
// (it names the rank, step and action and marks the step), the formulas for peak in-flight
// micro-batches and bubbles against the measured and simulated values, CSV round trips, and
// `dtlab-cli schedule` driven in-process.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "engine/core/check.h"
#include "engine/parallel/pipeline_schedule.h"
#include "tests/test_util.h"

using namespace dtlab;
using dtlab::test::TempDir;

namespace {

std::string grid(ScheduleKind kind, int p, int m, int v = 1) {
  const PipelineSchedule s = make_schedule(kind, p, m, v);
  validate(s);
  return format_schedule(s);
}

// A hand-written grid, one string per rank in CSV form ("0F0,,0B0").
PipelineSchedule grid_of(const std::vector<std::string>& rows, int stages, int ranks, int microbatches) {
  PipelineSchedule s;
  s.name = "test";
  s.stages = stages;
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.chunks = stages / ranks;
  for (const std::string& row : rows) {
    auto& out = s.order.emplace_back();
    std::stringstream is(row);
    for (std::string cell; std::getline(is, cell, ',');)
      out.push_back(cell.empty() ? std::nullopt : std::optional<Action>(parse_action(cell)));
  }
  return s;
}

// Validation must fail: returns the error for the caller's checks on its sentence and fields.
ScheduleError rejected(const PipelineSchedule& s) {
  try {
    validate(s);
  } catch (const ScheduleError& e) {
    return e;
  }
  FAIL("validate() accepted a broken schedule:\n" << format_schedule(s));
  return ScheduleError("", -1, -1, "");
}

std::string marked_line(const std::string& text) {
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);)
    if (line.find(" <-- ERROR HERE") != std::string::npos) return line;
  return "";
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

struct CliRun {
  int code = -1;
  std::string out, err;
};

CliRun schedule_cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  args.insert(args.begin(), "schedule");
  const int code = dtlab::cli::run_cli(args, {out, err, false});
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_SUITE("pipeline_schedule") {

TEST_CASE("actions print as PyTorch's _Action.__repr__ and parse back") {
  CHECK(action_str({1, ActionType::Backward, 2}) == "1B2");
  CHECK(action_str({0, ActionType::Forward, 0}) == "0F0");
  CHECK(action_str({3, ActionType::BackwardInput, 10}) == "3I10");
  CHECK(action_str({3, ActionType::BackwardWeight, 1}) == "3W1");
  CHECK(action_str({0, ActionType::SendF, 1}) == "0SEND_F1");
  CHECK(action_str({1, ActionType::RecvF, 1}) == "1RECV_F1");
  CHECK(action_str({1, ActionType::SendB, 0}) == "1SEND_B0");
  CHECK(action_str({0, ActionType::RecvB, 0}) == "0RECV_B0");
  for (int t = 0; t < 8; t++) {
    const Action a{12, static_cast<ActionType>(t), 34};
    CHECK(parse_action(action_str(a)) == a);
  }
  CHECK(parse_action(" 1B2 ") == Action{1, ActionType::Backward, 2});  // PyTorch strips the text too
  for (const char* bad : {"", "F0", "1X2", "1B", "1B2x", "-1F0", "1F-2", "1F+2", "1SEND0", "99999999999F0"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_action(bad), ("'" + std::string(bad) + "' is not an action like 0F0 or 1B2").c_str(), Error);
  }
  CHECK(rank_of_stage(5, 2) == 1);  // looped: stage s on rank s % p
  CHECK(parse_schedule_kind("zb-h1") == ScheduleKind::ZBH1);
  CHECK_THROWS_WITH_AS(parse_schedule_kind("1f1b-interleaved"),
                       "'1f1b-interleaved' is not a pipeline schedule; use gpipe, 1f1b, interleaved or zb-h1", Error);
}

// Each golden grid was checked by hand: per rank, the order (warmup forwards, steady pairs,
// cool-down) and, per action, that it sits one step after the later of its rank's previous action
// and its dependencies.
TEST_CASE("golden grids: GPipe and 1F1B with p = 2, m = 2") {
  // GPipe: every rank runs F0 F1 B0 B1. 6 = 2(m+p-1) steps.
  CHECK(grid(ScheduleKind::GPipe, 2, 2) ==
        "        Rank 0 Rank 1\n"
        "Step 0: 0F0\n"
        "Step 1: 0F1    1F0\n"
        "Step 2:        1F1\n"
        "Step 3:        1B0\n"
        "Step 4: 0B0    1B1\n"
        "Step 5: 0B1\n");
  // 1F1B: warmup min(p-s-1, m) = 1 forward on rank 0, 0 on rank 1 (F0 B0 F1 B1).
  CHECK(grid(ScheduleKind::OneFOneB, 2, 2) ==
        "        Rank 0 Rank 1\n"
        "Step 0: 0F0\n"
        "Step 1: 0F1    1F0\n"
        "Step 2:        1B0\n"
        "Step 3: 0B0    1F1\n"
        "Step 4:        1B1\n"
        "Step 5: 0B1\n");
}

TEST_CASE("golden grids: GPipe and 1F1B with p = 4, m = 4") {
  CHECK(grid(ScheduleKind::GPipe, 4, 4) ==
        "         Rank 0  Rank 1  Rank 2  Rank 3\n"
        "Step 00: 0F0\n"
        "Step 01: 0F1     1F0\n"
        "Step 02: 0F2     1F1     2F0\n"
        "Step 03: 0F3     1F2     2F1     3F0\n"
        "Step 04:         1F3     2F2     3F1\n"
        "Step 05:                 2F3     3F2\n"
        "Step 06:                         3F3\n"
        "Step 07:                         3B0\n"
        "Step 08:                 2B0     3B1\n"
        "Step 09:         1B0     2B1     3B2\n"
        "Step 10: 0B0     1B1     2B2     3B3\n"
        "Step 11: 0B1     1B2     2B3\n"
        "Step 12: 0B2     1B3\n"
        "Step 13: 0B3\n");
  // Warmup 3, 2, 1, 0 forwards; then F,B pairs; rank 3 alternates from its first forward.
  CHECK(grid(ScheduleKind::OneFOneB, 4, 4) ==
        "         Rank 0  Rank 1  Rank 2  Rank 3\n"
        "Step 00: 0F0\n"
        "Step 01: 0F1     1F0\n"
        "Step 02: 0F2     1F1     2F0\n"
        "Step 03: 0F3     1F2     2F1     3F0\n"
        "Step 04:                         3B0\n"
        "Step 05:                 2B0     3F1\n"
        "Step 06:         1B0     2F2     3B1\n"
        "Step 07: 0B0     1F3     2B1     3F2\n"
        "Step 08:         1B1     2F3     3B2\n"
        "Step 09: 0B1             2B2     3F3\n"
        "Step 10:         1B2             3B3\n"
        "Step 11: 0B2             2B3\n"
        "Step 12:         1B3\n"
        "Step 13: 0B3\n");
}

TEST_CASE("golden grid: interleaved 1F1B with p = 2, v = 2, m = 4") {
  // Stages 0,2 on rank 0 and 1,3 on rank 1. Warmup (v-1)p + 2(p-r-1): 4 on rank 0 (0F0 0F1 2F0
  // 2F1), 2 on rank 1. Rounds of p = 2 micro-batches: forwards chunk 0 then 1, backwards chunk 1
  // then 0. 18 = 2(vm+p-1) steps: bubble (p-1)/(vm+p-1) = 1/9.
  CHECK(grid(ScheduleKind::Interleaved1F1B, 2, 4, 2) ==
        "         Rank 0  Rank 1\n"
        "Step 00: 0F0\n"
        "Step 01: 0F1     1F0\n"
        "Step 02: 2F0     1F1\n"
        "Step 03: 2F1     3F0\n"
        "Step 04: 0F2     3B0\n"
        "Step 05: 2B0     3F1\n"
        "Step 06: 0F3     3B1\n"
        "Step 07: 2B1     1F2\n"
        "Step 08: 2F2     1B0\n"
        "Step 09: 0B0     1F3\n"
        "Step 10: 2F3     1B1\n"
        "Step 11: 0B1     3F2\n"
        "Step 12:         3B2\n"
        "Step 13: 2B2     3F3\n"
        "Step 14:         3B3\n"
        "Step 15: 2B3     1B2\n"
        "Step 16: 0B2     1B3\n"
        "Step 17: 0B3\n");
}

TEST_CASE("golden grids: ZB-H1 with p = 2 and p = 3, m = 4") {
  // Warmup p-r-1 forwards; then F, I, and rank r holds back its first r Ws, so rank 0 runs
  // F I W from the start and the last rank's Ws fill its tail. 13 = 3m + p-1 steps.
  CHECK(grid(ScheduleKind::ZBH1, 2, 4) ==
        "         Rank 0  Rank 1\n"
        "Step 00: 0F0\n"
        "Step 01: 0F1     1F0\n"
        "Step 02:         1I0\n"
        "Step 03: 0I0     1F1\n"
        "Step 04: 0W0     1I1\n"
        "Step 05: 0F2     1W0\n"
        "Step 06: 0I1     1F2\n"
        "Step 07: 0W1     1I2\n"
        "Step 08: 0F3     1W1\n"
        "Step 09: 0I2     1F3\n"
        "Step 10: 0W2     1I3\n"
        "Step 11: 0I3     1W2\n"
        "Step 12: 0W3     1W3\n");
  CHECK(grid(ScheduleKind::ZBH1, 3, 4) ==
        "         Rank 0  Rank 1  Rank 2\n"
        "Step 00: 0F0\n"
        "Step 01: 0F1     1F0\n"
        "Step 02: 0F2     1F1     2F0\n"
        "Step 03:                 2I0\n"
        "Step 04:         1I0     2F1\n"
        "Step 05: 0I0     1F2     2I1\n"
        "Step 06: 0W0     1I1     2F2\n"
        "Step 07: 0F3     1W0     2I2\n"
        "Step 08: 0I1     1F3     2W0\n"
        "Step 09: 0W1     1I2     2F3\n"
        "Step 10: 0I2     1W1     2I3\n"
        "Step 11: 0W2     1I3     2W1\n"
        "Step 12: 0I3     1W2     2W2\n"
        "Step 13: 0W3     1W3     2W3\n");
}

TEST_CASE("generated schedules validate, and their bad sizes are one sentence") {
  for (int p = 1; p <= 6; p++)
    for (int m = 1; m <= 12; m++) {
      CAPTURE(p);
      CAPTURE(m);
      for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) CHECK_NOTHROW(validate(make_schedule(k, p, m)));
      for (int v = 1; v <= 3 && m % p == 0; v++) CHECK_NOTHROW(validate(make_schedule(ScheduleKind::Interleaved1F1B, p, m, v)));
    }
  CHECK_THROWS_WITH_AS(make_schedule(ScheduleKind::Interleaved1F1B, 4, 6, 2),
                       "Interleaved 1F1B runs micro-batches in rounds of one per rank, so the micro-batches (6) must "
                       "be a multiple of the ranks (4), as in PyTorch", Error);
  CHECK_THROWS_WITH_AS(make_schedule(ScheduleKind::OneFOneB, 4, 4, 2),
                       "1F1B places one stage per rank; more chunks per rank need the interleaved schedule", Error);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::GPipe, 0, 4), Error);
  CHECK_THROWS_AS(make_schedule(ScheduleKind::GPipe, 2, 0), Error);
}

TEST_CASE("the validator names the step, the action and what it waits for") {
  SUBCASE("a backward before the next stage's backward finished") {
    const ScheduleError e = rejected(grid_of({"0F0,0F1,0B0,,0B1", ",1F0,1B0,1F1,1B1"}, 2, 2, 2));
    CHECK(e.sentence == "Rank 0, step 2: 0B0 waits for 1B0, which runs at step 2 on rank 1; a dependency must finish in an earlier step");
    CHECK(e.rank == 0);
    CHECK(e.step == 2);
    CHECK(std::string(e.what()) == e.sentence + "\n\n"
                                   "        Rank 0 Rank 1\n"
                                   "Step 0: 0F0\n"
                                   "Step 1: 0F1    1F0\n"
                                   "Step 2: 0B0    1B0    <-- ERROR HERE\n"
                                   "Step 3:        1F1\n"
                                   "Step 4: 0B1    1B1");
  }
  SUBCASE("a forward before the previous stage's forward") {
    const ScheduleError e = rejected(grid_of({"0F0,0F1,,0B0,,0B1", "1F0,,1B0,1F1,1B1"}, 2, 2, 2));
    CHECK(e.sentence == "Rank 1, step 0: 1F0 waits for 0F0, which runs at step 0 on rank 0; a dependency must finish in an earlier step");
    CHECK(marked_line(e.what()).rfind("Step 0:", 0) == 0);
  }
  SUBCASE("a missing action that another waits for") {
    const ScheduleError e = rejected(grid_of({"0F0,0F1,,0B0,,0B1", ",1F0,1B0,1F1"}, 2, 2, 2));
    CHECK(e.sentence == "Rank 0, step 5: 0B1 waits for 1B1 (or 1I1), which no rank runs");
    CHECK(e.step == 5);
    CHECK(marked_line(e.what()) == "Step 5: 0B1           <-- ERROR HERE");
  }
  SUBCASE("a missing action nothing waits for has no step to mark") {
    const ScheduleError e = rejected(grid_of({"0F0,0F1,,0B0", ",1F0,1B0,1F1,1B1"}, 2, 2, 2));
    CHECK(e.sentence == "Rank 0 never runs the backward of micro-batch 1 on stage 0 (0B1, or 0I1 and 0W1)");
    CHECK(e.step == -1);
    CHECK(marked_line(e.what()).empty());
    const ScheduleError w = rejected(grid_of({"0F0,0I0"}, 1, 1, 1));
    CHECK(w.sentence == "Rank 0 never runs 0W0, the weight gradient that 0I0 (step 1) leaves to do");
  }
  SUBCASE("a deadlock: each rank waits for the other") {
    // Rank 0 holds 0F1 behind 0B0, which needs rank 1's 1B0; rank 1 holds 1B0 behind 1F1, which
    // needs 0F1.
    const ScheduleError e = rejected(grid_of({"0F0,,,0B0,0F1,,0B1", ",1F0,1F1,1B0,,1B1"}, 2, 2, 2));
    CHECK(e.sentence == "Deadlock: rank 0 waits at step 3 with 0B0 for 1B0 (rank 1, step 3), rank 1 waits at step 2 "
                        "with 1F1 for 0F1 (rank 0, step 4); no rank can make progress");
    CHECK(e.rank == 1);
    CHECK(e.step == 2);
    CHECK(marked_line(e.what()).rfind("Step 2:", 0) == 0);
  }
  SUBCASE("a rank waiting for its own later action") {
    const ScheduleError e = rejected(grid_of({"0B0,0F0"}, 1, 1, 1));
    CHECK(e.sentence == "Deadlock: rank 0 waits at step 0 with 0B0 for its own later 0F0 (step 1); no rank can make progress");
  }
  SUBCASE("cells: twice, two ranks, out of range, communication, W after B") {
    CHECK(rejected(grid_of({"0F0,0F0,0B0"}, 1, 1, 1)).sentence ==
          "Rank 0, step 1: 0F0 repeats 0F0 (rank 0, step 0); each micro-batch runs F once and B (or I and W) once per stage");
    CHECK(rejected(grid_of({"0F0,0I0,0B0,0W0"}, 1, 1, 1)).sentence ==
          "Rank 0, step 2: 0B0 repeats 0I0 (rank 0, step 1); each micro-batch runs F once and B (or I and W) once per stage");
    CHECK(rejected(grid_of({"0F0,,,0B0", ",1F0,0B0"}, 2, 2, 1)).sentence ==
          "Rank 1, step 2: 0B0 puts stage 0 on rank 1, but rank 0 already runs it (0F0 at step 0); a stage lives on one rank");
    CHECK(rejected(grid_of({"0F0,0F1,0B0"}, 1, 1, 1)).sentence ==
          "Rank 0, step 1: 0F1 names micro-batch 1, but the schedule has micro-batches 0 to 0");
    CHECK(rejected(grid_of({"0F0,0SEND_F0"}, 1, 1, 1)).sentence ==
          "Rank 0, step 1: 0SEND_F0 is a communication action; a schedule grid holds compute actions only (F, B, I, W)");
    CHECK(rejected(grid_of({"0F0,0B0,0W0"}, 1, 1, 1)).sentence ==
          "Rank 0, step 2: 0W0 comes with the full backward 0B0 (rank 0, step 1), which already computes the weight "
          "gradient; use I and W, or B alone");
  }
}

TEST_CASE("peak in-flight micro-batches: measured equals the formula") {
  // 1F1B min(p-s, m), GPipe m, interleaved min((v-1)p + 2(p-r-1) + 1, vm); ZB-H1 keeps 1F1B's
  // min(p-s, m) until I, and holds min(p, m) on every rank until W.
  for (int p = 1; p <= 6; p++)
    for (int m = 1; m <= 12; m++)
      for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B, ScheduleKind::ZBH1})
        for (int v = 1; v <= (k == ScheduleKind::Interleaved1F1B ? 3 : 1); v++) {
          if (k == ScheduleKind::Interleaved1F1B && m % p != 0) continue;
          const PipelineSchedule s = make_schedule(k, p, m, v);
          for (int r = 0; r < p; r++) {
            CAPTURE(s.name);
            CAPTURE(p);
            CAPTURE(m);
            CAPTURE(v);
            CAPTURE(r);
            for (auto until : {InflightUntil::BackwardInput, InflightUntil::BackwardWeight})
              CHECK(measured_peak_inflight(s, r, until) == formula_peak_inflight(k, r, p, m, v, until));
          }
        }
  CHECK(formula_peak_inflight(ScheduleKind::OneFOneB, 0, 4, 8) == 4);
  CHECK(formula_peak_inflight(ScheduleKind::OneFOneB, 3, 4, 8) == 1);
  CHECK(formula_peak_inflight(ScheduleKind::ZBH1, 3, 4, 8, 1, InflightUntil::BackwardWeight) == 4);
  // Interleaved rank 0 with p = 4, v = 2: (v-1)p + 2(p-1) + 1 = 11 chunks = p + (p-1)/v stage-equivalents (5.5).
  CHECK(formula_peak_inflight(ScheduleKind::Interleaved1F1B, 0, 4, 8, 2) == 11);
}

TEST_CASE("simulated bubble equals the formula") {
  SUBCASE("GPipe and 1F1B with equal costs: exactly (p-1)/(m+p-1) on every rank") {
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 16; m++)
        for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB}) {
          const ScheduleTiming t = simulate(make_schedule(k, p, m));
          CHECK(t.makespan == 2.0 * (m + p - 1));
          for (double b : t.bubble) CHECK(b == (p - 1.0) / (m + p - 1.0));
          CHECK(formula_bubble(k, p, m).of_wall == (p - 1.0) / (m + p - 1.0));
          CHECK(formula_bubble(k, p, m).of_ideal == (p - 1.0) / m);
        }
  }
  SUBCASE("every schedule with random costs (ZB-H1 also for m < p and long Ws)") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> cost(0.25, 3.0);
    for (int i = 0; i < 400; i++) {
      const auto k = static_cast<ScheduleKind>(i % 4);
      const int p = 1 + static_cast<int>(rng() % 5), v = k == ScheduleKind::Interleaved1F1B ? 1 + static_cast<int>(rng() % 3) : 1;
      const int m = k == ScheduleKind::Interleaved1F1B ? p * (1 + static_cast<int>(rng() % 3)) : 1 + static_cast<int>(rng() % 10);
      ActionCosts c;
      c.forward = cost(rng);
      c.backward = cost(rng);
      c.backward_input = cost(rng);
      c.backward_weight = cost(rng);
      const ScheduleTiming t = simulate(make_schedule(k, p, m, v), c);
      const BubbleFormula f = formula_bubble(k, p, m, v, c);
      CAPTURE(schedule_kind_name(k));
      CAPTURE(p);
      CAPTURE(m);
      CAPTURE(v);
      CHECK(t.makespan == doctest::Approx(f.idle + f.ideal));
      for (double b : t.bubble) CHECK(b == doctest::Approx(f.of_wall));
    }
  }
  SUBCASE("ZB-H1: the paper's (p-1)(T_F+T_I-T_W) when m >= p and T_W <= T_F, T_I") {
    const BubbleFormula f = formula_bubble(ScheduleKind::ZBH1, 4, 8);
    CHECK(f.idle == 3);  // (p-1)(1+1-1)
    CHECK(f.ideal == 24);
    CHECK(f.idle_text == "(p-1)(T_F+T_I-T_W)");
    CHECK(formula_bubble(ScheduleKind::ZBH1, 4, 2).idle == 5);  // 2(p-1) - (m-1): only one W to spare
  }
  SUBCASE("interleaving divides the bubble by v") {
    CHECK(formula_bubble(ScheduleKind::Interleaved1F1B, 4, 8, 2).of_ideal == 3.0 / 16);
    CHECK(formula_bubble(ScheduleKind::Interleaved1F1B, 4, 8, 2).of_wall == 3.0 / 19);
  }
  SUBCASE("hop latency delays each crossing") {
    ActionCosts c;
    c.hop_latency = 0.5;
    const ScheduleTiming t = simulate(make_schedule(ScheduleKind::GPipe, 2, 2), c);
    CHECK(t.makespan == 7);  // 6 steps plus one crossing down and one back up
    CHECK(t.ranks[1][0].start == 1.5);
    CHECK(t.ranks[0][2].start == 5);  // 0B0 after 1B0 ends at 4.5, plus 0.5
  }
}

TEST_CASE("CSV: PyTorch's layout, round trip, bad cells and mismatched sizes") {
  TempDir dir;
  const PipelineSchedule s = make_schedule(ScheduleKind::Interleaved1F1B, 2, 4, 2);
  const std::string path = dir.file("interleaved.csv");
  save_csv(s, path);
  std::ifstream f(path);
  std::string first;
  std::getline(f, first);
  CHECK(first == "0F0,0F1,2F0,2F1,0F2,2B0,0F3,2B1,2F2,0B0,2F3,0B1,,2B2,,2B3,0B2,0B3");
  const PipelineSchedule back = load_csv(path, 4, 4);
  CHECK(back.order == s.order);
  CHECK(back.stages == 4);
  CHECK(back.ranks == 2);
  CHECK(back.chunks == 2);
  CHECK(back.microbatches == 4);
  CHECK(back.name == "interleaved.csv");
  CHECK(dir.listing().size() == 1);  // no temp file left behind

  // PyTorch's csv.writer ends rows with \r\n; blank cells may be padded.
  write_file(dir.file("torch.csv"), "0F0, 0F1 ,,0B0,,0B1\r\n,1F0,1B0,1F1,1B1\r\n");
  CHECK(format_schedule(load_csv(dir.file("torch.csv"))) == format_schedule(make_schedule(ScheduleKind::OneFOneB, 2, 2)));

  write_file(dir.file("bad.csv"), "0F0,0F1,,0B0,,0B1\n,1F0,1X0,1F1,1B1\n");
  CHECK_THROWS_WITH_AS(load_csv(dir.file("bad.csv")), (dir.file("bad.csv") + ":2:3: '1X0' is not an action like 0F0 or 1B2").c_str(), Error);
  CHECK_THROWS_WITH_AS(load_csv(path, 3), ("'" + path + "' runs 4 stages, not 3").c_str(), Error);
  CHECK_THROWS_WITH_AS(load_csv(path, std::nullopt, 8), ("'" + path + "' runs 4 micro-batches, not 8").c_str(), Error);
  // Hostile numbers: past int (it used to wrap to "-2147483648 stages"), and pairs that would make
  // validate() allocate gigabytes.
  write_file(dir.file("huge.csv"), "2147483647F0\n");
  CHECK_THROWS_WITH_AS(load_csv(dir.file("huge.csv")),
                       (dir.file("huge.csv") + ":1:1: '2147483647F0' names stage 2147483647; stages and micro-batches are numbered 0 to 65535").c_str(),
                       Error);
  write_file(dir.file("wide.csv"), "0F0,65535F65535\n");
  CHECK_THROWS_WITH_AS(load_csv(dir.file("wide.csv")),
                       "the schedule has 65536 stages x 65536 micro-batches; dtlab checks at most 4194304 (stage, micro-batch) pairs", Error);
  write_file(dir.file("uneven.csv"), "0F0,1F0,2F0,2B0,1B0,0B0\n");
  CHECK(load_csv(dir.file("uneven.csv")).chunks == 3);  // one rank may hold every stage
  write_file(dir.file("odd.csv"), "0F0,,,,2F0,2B0,,,,0B0\n,1F0,,,,,,1B0\n");
  CHECK_THROWS_WITH_AS(load_csv(dir.file("odd.csv")),
                       ("'" + dir.file("odd.csv") + "' puts 3 stages on 2 ranks; give every rank the same number of stages").c_str(), Error);
  write_file(dir.file("empty.csv"), "\n\n");
  CHECK_THROWS_AS(load_csv(dir.file("empty.csv")), Error);
  CHECK_THROWS_WITH_AS(load_csv(dir.file("none.csv")), ("'" + dir.file("none.csv") + "' does not exist; check the path").c_str(), Error);
  // A broken schedule in a file fails validation like any other.
  write_file(dir.file("early.csv"), "0F0,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");
  CHECK_THROWS_AS(load_csv(dir.file("early.csv")), ScheduleError);
}

TEST_CASE("dtlab-cli schedule: grid, table, JSON, CSV and bad input") {
  SUBCASE("the grid and per-rank figures") {
    const CliRun r = schedule_cli({"--schedule", "1f1b", "--stages", "4", "--microbatches", "4"});
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find("1F1B: 4 ranks, 4 stages, 4 micro-batches, 14 time steps") == 0);
    CHECK(r.out.find(grid(ScheduleKind::OneFOneB, 4, 4)) != std::string::npos);
    CHECK(r.out.find("   1  1                    3        3   42.9%    42.9%\n") != std::string::npos);
    CHECK(r.out.find("formula: idle (p-1)(T_F+T_B) over ideal m(T_F+T_B), 42.9% of wall time, 75.0% of the ideal") != std::string::npos);
  }
  SUBCASE("--json") {
    const CliRun r = schedule_cli({"--schedule", "zb-h1", "--stages", "2", "--microbatches", "4", "--json"});
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["name"] == "ZB-H1");
    CHECK(j["ranks"] == 2);
    CHECK(j["stages"] == 2);
    CHECK(j["chunks"] == 1);
    CHECK(j["microbatches"] == 4);
    CHECK(j["order"][1][0].is_null());
    CHECK(j["order"][1][1] == "1F0");
    CHECK(j["bubble"]["simulated"][0] == doctest::Approx(1.0 / 13));
    CHECK(j["bubble"]["formula"] == doctest::Approx(1.0 / 13));
    CHECK(j["peak_inflight"]["measured"] == nlohmann::json({2, 1}));
    CHECK(j["peak_inflight"]["formula_until_w"] == nlohmann::json({2, 2}));
  }
  SUBCASE("--csv then --load gives the same grid; --schedule adds the formulas") {
    TempDir dir;
    const std::string path = dir.file("s.csv");
    const CliRun saved = schedule_cli({"--schedule", "interleaved", "--stages", "2", "--microbatches", "4", "--csv", path});
    REQUIRE(saved.code == 0);
    const CliRun loaded = schedule_cli({"--load", path});
    INFO(loaded.err);
    REQUIRE(loaded.code == 0);
    CHECK(loaded.out.find(grid(ScheduleKind::Interleaved1F1B, 2, 4, 2)) != std::string::npos);
    CHECK(loaded.out.find("s.csv: 2 ranks, 4 stages, 4 micro-batches") == 0);
    CHECK(loaded.out.find("   0  0,2                  5        -") != std::string::npos);
    const CliRun with = schedule_cli({"--load", path, "--schedule", "interleaved"});
    CHECK(with.out.find("   0  0,2                  5        5   11.1%    11.1%") != std::string::npos);
  }
  SUBCASE("bad input: one sentence and exit code 2") {
    auto usage = [](std::vector<std::string> args, const std::string& expect) {
      const CliRun r = schedule_cli(args);
      INFO(r.err);
      CHECK(r.code == 2);
      CHECK(r.out.empty());
      CHECK(r.err.rfind("dtlab-cli: ", 0) == 0);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(r.err.find(expect) != std::string::npos);
    };
    usage({"--schedule", "pipedream", "--stages", "2", "--microbatches", "2"}, "'pipedream' is not a pipeline schedule; use gpipe, 1f1b, interleaved or zb-h1");
    usage({"--stages", "2", "--microbatches", "2"}, "give --schedule gpipe|1f1b|interleaved|zb-h1 with --stages and --microbatches, or --load FILE");
    usage({"--schedule", "gpipe", "--microbatches", "2"}, "--schedule needs --stages p (ranks in the pipeline) and --microbatches m");
    usage({"--schedule", "1f1b", "--stages", "2", "--microbatches", "2", "--chunks", "2"}, "--chunks applies to --schedule interleaved; 1f1b places one stage per rank");
    usage({"--schedule", "interleaved", "--stages", "4", "--microbatches", "6"}, "must be a multiple of the ranks (4)");
    usage({"--schedule", "gpipe", "--stages", "x", "--microbatches", "2"}, "'x' is not a whole number");
    usage({"--schedule", "gpipe", "--stages", "0", "--microbatches", "2"}, "0 is out of range; use 1 to 64");
    usage({"--load", "/nonexistent/s.csv"}, "'/nonexistent/s.csv' does not exist; check the path");
    usage({"--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--csv", "/nonexistent/s.csv"}, "directory /nonexistent does not exist");
    TempDir dir;
    write_file(dir.file("bad.csv"), "0F0,0F1\n1F0,1Q1\n");
    usage({"--load", dir.file("bad.csv")}, "bad.csv:2:2: '1Q1' is not an action like 0F0 or 1B2");
    write_file(dir.file("s.csv"), "0F0,0F1,,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");
    usage({"--load", dir.file("s.csv"), "--microbatches", "4"}, "--microbatches 4 does not match");
  }
  SUBCASE("a schedule that fails validation: the sentence, then the grid marking the step") {
    TempDir dir;
    write_file(dir.file("early.csv"), "0F0,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\n");
    const CliRun r = schedule_cli({"--load", dir.file("early.csv")});
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("dtlab-cli: Rank 0, step 2: 0B0 waits for 1B0, which runs at step 2 on rank 1; a dependency must finish in an earlier step\n", 0) == 0);
    CHECK(marked_line(r.err) == "Step 2: 0B0    1B0    <-- ERROR HERE");
  }
}

}  // TEST_SUITE
