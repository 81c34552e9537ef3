// All-to-all's two algorithms (collective.h): pairwise exchange, n-1 rounds of one pair per rank, and
// NCCL's grouped send/recv, every block in one step. Both leave the same blocks on the world
// communicator, on a process group (all_to_all and all_to_all_v) and in an expert-parallel run; the
// steps each records, the plan's transfers, the modeled times and the setting's sentence.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/comm/group.h"
#include "engine/comm/plan.h"
#include "engine/comm/threads_backend.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/event.h"
#include "engine/trace/tuning.h"
#include "engine/train/settings.h"
#include "engine/train/train.h"
#include "tests/comm_util.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace dtlab {

namespace {

WorldOptions recorded(Algorithm alltoall = Algorithm::Pairwise) {
  WorldOptions o;
  o.timeout_s = 20;
  o.record = true;
  o.trace_capacity = size_t{1} << 14;
  o.profile = "nvlink8";
  o.alltoall_algo = alltoall;
  return o;
}

float block_value(int src, int dst, int64_t i) { return static_cast<float>(100 * src + 10 * dst) + static_cast<float>(i % 7); }

// The RingStep events of rank r's all-to-all number `seq` (world collectives: group 0).
std::vector<Event> steps_of(const TraceRecorder& rec, int r, uint64_t seq, int32_t group = 0) {
  std::vector<Event> out;
  for (const Event& e : rec.events(r))
    if (e.kind == EventKind::RingStep && e.step.seq == seq && e.step.group == group) out.push_back(e);
  return out;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("all-to-all pairwise and grouped: the same blocks, n-1 steps of one pair against one step of every pair") {
    for (int n : {2, 3, 4, 5}) {
      CAPTURE(n);
      ThreadsWorld w(n, recorded());
      const int64_t count = 6;
      std::vector<std::vector<float>> got(static_cast<size_t>(2 * n));
      test::run_counting(w, [&](int r, Communicator& c) {
        std::vector<float> in(static_cast<size_t>(count * n));
        for (int dst = 0; dst < n; dst++)
          for (int64_t i = 0; i < count; i++) in[static_cast<size_t>(dst * count + i)] = block_value(r, dst, i);
        for (Algorithm a : {Algorithm::Pairwise, Algorithm::Grouped}) {
          std::vector<float> out(static_cast<size_t>(count * n), -1.0f);
          c.all_to_all(out.data(), in.data(), count, DType::F32, a)->wait();
          got[static_cast<size_t>(2 * r + (a == Algorithm::Grouped))] = out;
        }
        return int64_t{0};
      });
      for (int r = 0; r < n; r++) {
        CAPTURE(r);
        std::vector<float> want(static_cast<size_t>(count * n));
        for (int src = 0; src < n; src++)
          for (int64_t i = 0; i < count; i++) want[static_cast<size_t>(src * count + i)] = block_value(src, r, i);
        CHECK(got[static_cast<size_t>(2 * r)] == want);
        CHECK(got[static_cast<size_t>(2 * r + 1)] == want);
        // Pairwise: step s brings the block of rank r - s - 1; grouped: one step brings every block.
        const std::vector<Event> pair = steps_of(w.recorder(), r, 0), group = steps_of(w.recorder(), r, 1);
        REQUIRE(pair.size() == static_cast<size_t>(n - 1));
        REQUIRE(group.size() == static_cast<size_t>(n - 1));
        std::set<int> sources;
        for (int s = 0; s < n - 1; s++) {
          CHECK(pair[static_cast<size_t>(s)].step.step == s);
          CHECK(pair[static_cast<size_t>(s)].step.steps == n - 1);
          CHECK(pair[static_cast<size_t>(s)].step.src == (r - s - 1 + n) % n);
          CHECK(group[static_cast<size_t>(s)].step.step == 0);
          CHECK(group[static_cast<size_t>(s)].step.steps == 1);
          CHECK(group[static_cast<size_t>(s)].step.bytes == count * 4);
          sources.insert(group[static_cast<size_t>(s)].step.src);
        }
        CHECK(sources.size() == static_cast<size_t>(n - 1));
        CHECK(sources.count(r) == 0);
      }
      // The plans the stepper and the views read: n-1 rounds of n transfers, one step of n(n-1).
      CHECK(algorithm_step_count(CollectiveOp::AllToAll, Algorithm::Pairwise, n) == n - 1);
      CHECK(algorithm_step_count(CollectiveOp::AllToAll, Algorithm::Grouped, n) == 1);
      CHECK(algorithm_step_plan(CollectiveOp::AllToAll, Algorithm::Grouped, n, -1, 0).size() == static_cast<size_t>(n * (n - 1)));
      CHECK(algorithm_step_plan(CollectiveOp::AllToAll, Algorithm::Pairwise, n, -1, 0).size() == static_cast<size_t>(n));
      // The modeled clock: one latency instead of n-1 (each rank's n-1 blocks share its links).
      const CostModel& m = w.cost();
      const double small = 64.0 * n, pair_t = m.collective_time(CollectiveOp::AllToAll, Algorithm::Pairwise, small),
                   group_t = m.collective_time(CollectiveOp::AllToAll, Algorithm::Grouped, small);
      if (n > 2) CHECK(group_t < pair_t);
      for (const Event& e : w.recorder().all_events())
        if (e.kind == EventKind::Collective) {
          const double want = m.collective_time(e.coll.op, e.coll.algo, static_cast<double>(e.coll.bytes));
          CHECK(std::abs((e.model_end - e.model_begin) - want) <= 1e-9 * want);
        }
    }
  }

  TEST_CASE("a process group's all_to_all_v runs grouped or pairwise, the world's choice its default") {
    const int n = 4;
    for (Algorithm world_default : {Algorithm::Pairwise, Algorithm::Grouped}) {
      CAPTURE(std::string(algorithm_name(world_default)));
      ThreadsWorld w(n, recorded(world_default));
      std::vector<std::vector<float>> got(static_cast<size_t>(n));
      test::run_counting(w, [&](int r, Communicator& c) {
        auto ex = std::make_shared<GroupExecutor>();
        auto g = new_group(c, {0, 1, 2, 3}, 512, ex, cpu_device(), "a2a");
        CHECK(g->alltoall_default() == world_default);
        // Rank r sends r + j + 1 elements to rank j.
        std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
        for (int j = 0; j < n; j++) {
          sc[static_cast<size_t>(j)] = r + j + 1;
          rc[static_cast<size_t>(j)] = j + r + 1;
        }
        std::vector<float> in, out;
        for (int j = 0; j < n; j++)
          for (int64_t i = 0; i < sc[static_cast<size_t>(j)]; i++) in.push_back(block_value(r, j, i));
        int64_t total = 0;
        for (int64_t v : rc) total += v;
        out.assign(static_cast<size_t>(total), -1.0f);
        g->all_to_all_v(out.data(), rc, in.data(), sc, DType::F32)->wait();
        got[static_cast<size_t>(r)] = out;
        return int64_t{0};
      });
      for (int r = 0; r < n; r++) {
        CAPTURE(r);
        std::vector<float> want;
        for (int src = 0; src < n; src++)
          for (int64_t i = 0; i < src + r + 1; i++) want.push_back(block_value(src, r, i));
        CHECK(got[static_cast<size_t>(r)] == want);
        int steps = 0, moves = 0;
        for (const Event& e : w.recorder().events(r)) {
          if (e.kind == EventKind::Collective && e.coll.op == CollectiveOp::AllToAll) CHECK(e.coll.algo == world_default);
          if (e.kind != EventKind::RingStep) continue;
          moves++;
          steps = std::max(steps, e.step.step + 1);
        }
        CHECK(moves == n - 1);
        CHECK(steps == (world_default == Algorithm::Grouped ? 1 : n - 1));
      }
    }
  }

  TEST_CASE("expert parallelism with --alltoall grouped equals pairwise, each all-to-all one step") {
    TrainConfig c = test::demo_config("ddp", 4, 4, 2);
    c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
    c.data = "text";
    c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
    c.moe = MoeSpec::parse("experts=4,top_k=2");
    c.ep = 2;
    Trainer pairwise(c);
    pairwise.run();
    c.alltoall_algo = Algorithm::Grouped;
    Trainer grouped(c);
    grouped.run();
    CHECK(test::max_abs_diff(grouped.result_model(), pairwise.result_model()) == 0.0);
    int all_to_alls = 0;
    std::set<std::pair<int32_t, uint64_t>> ops;  // (group, seq) of each all-to-all
    const std::vector<Event> events = grouped.recorder().events(0);
    for (const Event& e : events)
      if (e.kind == EventKind::Collective && e.coll.op == CollectiveOp::AllToAll) {
        CHECK(e.coll.algo == Algorithm::Grouped);
        ops.insert({e.coll.group, e.coll.seq});
        all_to_alls++;
      }
    CHECK(all_to_alls > 0);
    int moves = 0;
    for (const Event& e : events)
      if (e.kind == EventKind::RingStep && ops.count({e.step.group, e.step.seq})) {
        CHECK(e.step.steps == 1);  // one step, a block from the other EP rank
        moves++;
      }
    CHECK(moves == all_to_alls);
    // The setting's sentence.
    const Setting* s = find_setting("--alltoall");
    REQUIRE(s != nullptr);
    TrainConfig t;
    CHECK(test::error_sentence([&] { s->set(t, {"ring"}); }) == "--alltoall 'ring' is not an all-to-all algorithm; use pairwise or grouped");
    s->set(t, {"grouped"});
    CHECK(t.alltoall_algo == Algorithm::Grouped);
  }
}

}  // namespace dtlab
