// Process-group collectives are collectives of their group (issue 16): on a DP x PP x TP mesh,
// every rank builds one group per mesh dimension (torch init_device_mesh's groups) and runs
// all-reduce, reduce-scatter and all-gather in each. The results are checked, and so are the
// events: each Collective names its group (name and global ranks = mesh_group for that rank), its
// size and nccl-tests bytes, the group's own sequence numbers, and every RingStep moves between
// members of that group inside its collective's span. The Chrome trace names the group the way
// torch.profiler does, and the importer reads it back.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/comm/group.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/half.h"
#include "engine/core/mesh.h"
#include "engine/trace/export.h"
#include "engine/trace/trace_import.h"
#include "engine/core/check.h"
#include "engine/core/half.h"

using namespace dtlab;

namespace {

constexpr MeshDim kDims[] = {MeshDim::DP, MeshDim::PP, MeshDim::TP};
constexpr int64_t kCount = 5;  // not a multiple of any group size: the all-reduce pads

float group_value(int rank, int64_t i) { return static_cast<float>(rank * 100 + i + 1); }

// Runs the three collectives in every group of every rank; returns nothing, checks the results.
void run_groups(ThreadsWorld& w, const MeshShape& m) {
  w.run([&](int rank, Communicator& comm, RankContext&) {
    auto ex = std::make_shared<GroupExecutor>();
    std::vector<std::unique_ptr<Communicator>> groups;
    for (MeshDim d : kDims)
      groups.push_back(new_group(comm, mesh_group(m, d, rank), 4096 * (static_cast<int>(d) + 1), ex, cpu_device(),
                                 mesh_group_name(m, d, rank)));
    for (MeshDim d : kDims) {
      Communicator& g = *groups[static_cast<size_t>(d)];
      const std::vector<int> members = mesh_group(m, d, rank);
      const int n = g.world_size();
      std::vector<float> ar(kCount), rs_in(static_cast<size_t>(kCount * n)), rs_out(kCount), ag_in(kCount),
          ag_out(static_cast<size_t>(kCount * n));
      for (int64_t i = 0; i < kCount; i++) ar[static_cast<size_t>(i)] = ag_in[static_cast<size_t>(i)] = group_value(rank, i);
      for (int64_t i = 0; i < kCount * n; i++) rs_in[static_cast<size_t>(i)] = group_value(rank, i);
      g.all_reduce(ar.data(), kCount)->wait();
      g.reduce_scatter(rs_out.data(), rs_in.data(), kCount, DType::F32, ReduceOp::Sum)->wait();
      g.all_gather(ag_out.data(), ag_in.data(), kCount, DType::F32)->wait();
      for (int64_t i = 0; i < kCount; i++) {
        float sum = 0, block = 0;
        for (int r : members) sum += group_value(r, i), block += group_value(r, g.rank() * kCount + i);
        CHECK(ar[static_cast<size_t>(i)] == sum);
        CHECK(rs_out[static_cast<size_t>(i)] == block);
        for (int k = 0; k < n; k++)
          CHECK(ag_out[static_cast<size_t>(k * kCount + i)] == group_value(members[static_cast<size_t>(k)], i));
      }
    }
  });
}

bool member(const std::vector<int>& ranks, int r) { return std::find(ranks.begin(), ranks.end(), r) != ranks.end(); }

// The events of one rank: every group collective names its mesh group, with its size, bytes, seq
// and steps; nothing else of the world's is recorded.
void check_events(const TraceRecorder& rec, const MeshShape& m, int rank) {
  std::map<std::string, std::vector<int>> expected;  // "tp1" -> its ranks
  for (MeshDim d : kDims) expected[mesh_group_name(m, d, rank)] = mesh_group(m, d, rank);
  std::map<std::string, int> collectives, issues;
  std::map<std::pair<int32_t, uint64_t>, const Event*> spans;
  const std::vector<Event> events = rec.events(rank);
  for (const Event& e : events) {
    CAPTURE(rank);
    if (e.kind == EventKind::Collective || e.kind == EventKind::CollectiveIssue) {
      REQUIRE(e.coll.group > 0);  // no world collective, no Send/Recv of the groups' steps
      std::string name;
      std::vector<int> ranks;
      REQUIRE(parse_group_label(rec.label(e.coll.group - 1), name, ranks));
      REQUIRE(expected.count(name) == 1);
      CHECK(ranks == expected[name]);
      const int n = static_cast<int>(ranks.size());
      CHECK(e.coll.group_size == n);
      const int nth = (e.kind == EventKind::Collective ? collectives : issues)[name]++;
      CHECK(e.coll.seq == static_cast<uint64_t>(nth));  // the group's own counter
      const CollectiveOp ops[] = {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter, CollectiveOp::AllGather};
      REQUIRE(nth < 3);
      CHECK(e.coll.op == ops[nth]);
      CHECK(e.coll.algo == Algorithm::Ring);
      CHECK(e.coll.bytes == (nth == 0 ? kCount * 4 : kCount * n * 4));  // nccl-tests' S
      if (e.kind == EventKind::Collective) spans[{e.coll.group, e.coll.seq}] = &e;
    }
  }
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    CHECK(collectives[it->first] == 3);
    CHECK(issues[it->first] == 3);
  }
  std::map<std::pair<int32_t, uint64_t>, int> steps;
  for (const Event& e : events) {
    if (e.kind != EventKind::RingStep) continue;
    REQUIRE(e.step.group > 0);
    std::string name;
    std::vector<int> ranks;
    REQUIRE(parse_group_label(rec.label(e.step.group - 1), name, ranks));
    CHECK(member(ranks, e.step.src));
    CHECK(member(ranks, e.step.dst));
    CHECK(e.step.dst == rank);  // a ring step records what this rank received
    CHECK(e.step.src != rank);
    // The all-reduce (seq 0) moves padded chunks of ceil(count / n); the others `count` a step.
    const int64_t n = static_cast<int64_t>(ranks.size());
    CHECK(e.step.bytes == (e.step.seq == 0 ? (kCount + n - 1) / n : kCount) * 4);
    const auto it = spans.find({e.step.group, e.step.seq});
    REQUIRE(it != spans.end());
    CHECK(it->second->model_begin <= e.model_begin);
    CHECK(e.model_end <= it->second->model_end);
    steps[{e.step.group, e.step.seq}]++;
  }
  for (auto it = spans.begin(); it != spans.end(); ++it) {
    const int n = it->second->coll.group_size;
    const int want = it->second->coll.op == CollectiveOp::AllReduce ? 2 * (n - 1) : n - 1;
    CHECK(steps[it->first] == want);
  }
}

void check_mesh(const MeshShape& m) {
  WorldOptions opt;
  opt.timeout_s = 30;
  ThreadsWorld w(m.world(), opt);
  run_groups(w, m);
  for (int r = 0; r < m.world(); r++) check_events(w.recorder(), m, r);
}

}  // namespace

TEST_CASE("group collectives on a 2 x 2 x 2 mesh carry their mesh group in events") { check_mesh({2, 2, 2}); }
TEST_CASE("group collectives on a 4 x 1 x 2 mesh carry their mesh group in events") { check_mesh({4, 1, 2}); }
TEST_CASE("group collectives on a 1 x 2 x 4 mesh carry their mesh group in events") { check_mesh({1, 2, 4}); }

// Mixed-precision HYBRID_SHARD reduces 16-bit gradients in its node and replica groups: a sum of two
// members is the float sum of their values rounded once (the threads backend's reduce_kernels.h), the
// copies move 2 bytes an element, and avg stays float32's, as on the world communicators.
TEST_CASE("bf16 and fp16 group collectives sum as the threads backend does, 2 bytes an element") {
  for (const DType dt : {DType::BF16, DType::F16}) {
    const HalfFormat f = dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16;
    CAPTURE(static_cast<int>(dt));
    // Values whose sums round: 1 + 3 * 2^-10 is no 16-bit number in either format.
    auto value = [&](int rank, int64_t i) { return half_from_float(1.0f + static_cast<float>(rank * 3 + i) / 1024.0f, f); };
    auto sum = [&](int a, int b, int64_t i) {
      return half_from_float(half_to_float(value(a, i), f) + half_to_float(value(b, i), f), f);
    };
    ThreadsWorld w(4);
    w.run([&](int rank, Communicator& comm, RankContext&) {
      auto ex = std::make_shared<GroupExecutor>();
      const int peer = rank ^ 1;  // groups {0, 1} and {2, 3}
      auto g = new_group(comm, {rank & ~1, rank | 1}, 64 + 2 * (rank / 2), ex);
      std::vector<uint16_t> buf(kCount), want(kCount);
      for (int64_t i = 0; i < kCount; i++) buf[static_cast<size_t>(i)] = value(rank, i), want[static_cast<size_t>(i)] = sum(rank, peer, i);
      g->all_reduce(buf.data(), kCount, dt, ReduceOp::Sum)->wait();
      CHECK(buf == want);
      std::vector<uint16_t> in(2 * kCount), out(kCount);
      for (int64_t i = 0; i < 2 * kCount; i++) in[static_cast<size_t>(i)] = value(rank, i);
      g->reduce_scatter(out.data(), in.data(), kCount, dt, ReduceOp::Sum)->wait();
      for (int64_t i = 0; i < kCount; i++) CHECK(out[static_cast<size_t>(i)] == sum(rank, peer, g->rank() * kCount + i));
      std::vector<uint16_t> all(2 * kCount);
      g->all_gather(all.data(), in.data(), kCount, dt)->wait();
      for (int m = 0; m < 2; m++)
        for (int64_t i = 0; i < kCount; i++) CHECK(all[static_cast<size_t>(m * kCount + i)] == value((rank & ~1) + m, i));
      CHECK_THROWS_WITH(g->all_reduce(buf.data(), kCount, dt, ReduceOp::Avg),
                        (std::string("avg is defined for float32 only; reduce ") + (dt == DType::BF16 ? "bfloat16" : "float16") +
                         " with sum or max").c_str());
    });
    int group_ops = 0;
    for (const Event& e : w.recorder().events(0)) {
      if (e.kind == EventKind::Collective && e.coll.group != 0) {
        group_ops++;
        CHECK(e.coll.dtype == dt);
        CHECK(e.coll.bytes == 2 * collective_traits(e.coll.op).payload_count(kCount, 2));
      }
      // The all-reduce's padded chunks of 3, the reduce-scatter's and all-gather's blocks of 5.
      if (e.kind == EventKind::RingStep && e.step.bytes > 0) CHECK((e.step.bytes == 2 * 3 || e.step.bytes == 2 * kCount));
    }
    CHECK(group_ops == 3);
  }
}

TEST_CASE("a group without a name is group<tag>, the world's collectives keep group 0") {
  ThreadsWorld w(2);
  w.run([&](int rank, Communicator& comm, RankContext&) {
    auto ex = std::make_shared<GroupExecutor>();
    auto g = new_group(comm, {0, 1}, 77, ex);
    float x = 1;
    g->all_reduce(&x, 1)->wait();
    comm.all_reduce(&x, 1)->wait();
    CHECK(x == 4);
  });
  int group = 0, world = 0;
  for (const Event& e : w.recorder().events(0)) {
    if (e.kind != EventKind::Collective) continue;
    if (e.coll.group == 0) {
      world++;
    } else {
      group++;
      CHECK(w.recorder().label(e.coll.group - 1) == "group77: 0,1");
    }
  }
  CHECK(group == 1);
  CHECK(world == 1);
  CHECK(describe_group_label("tp0: 0,1") == "tp0: ranks 0,1");
  CHECK(describe_group_label("tp3: 5") == "tp3: rank 5");
}

TEST_CASE("the Chrome trace names a group collective's group as torch.profiler does, and the importer reads it") {
  const MeshShape m{2, 1, 2};
  ThreadsWorld w(4);
  run_groups(w, m);
  TraceExportOptions opt;
  opt.labels = w.recorder().labels();
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json(w.recorder().events(2), opt));
  // Rank 2: tp1 = {2, 3}, dp0 = {0, 2}, pp2 = {2}.
  std::map<std::string, std::string> ranks_of;
  nlohmann::json tp_args;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("cat", "") != "collective") continue;
    const nlohmann::json& a = e["args"];
    REQUIRE(a.contains("Process Group Name"));
    ranks_of[a["Process Group Name"].get<std::string>()] = a["Process Group Ranks"].get<std::string>();
    if (a["Process Group Name"] == "tp1" && a["Collective name"] == "allreduce") tp_args = a;
  }
  CHECK(ranks_of["tp1"] == "[2, 3]");
  CHECK(ranks_of["dp0"] == "[0, 2]");
  CHECK(ranks_of["pp2"] == "[2]");
  REQUIRE(!tp_args.is_null());
  CHECK(tp_args["Group size"] == 2);
  // Back through the importer: the exported args on a record_param_comms op of a torch trace.
  auto rank_file = [&](int rank) {
    nlohmann::json f;
    f["schemaVersion"] = 1;
    f["distributedInfo"] = {{"backend", "nccl"}, {"rank", rank}, {"world_size", 2}};
    f["traceEvents"] = nlohmann::json::array(
        {{{"ph", "X"}, {"cat", "user_annotation"}, {"name", "ProfilerStep#1"}, {"pid", 1}, {"tid", 1}, {"ts", 0.0}, {"dur", 1000.0}},
         {{"ph", "X"}, {"cat", "cpu_op"}, {"name", "record_param_comms"}, {"pid", 1}, {"tid", 1}, {"ts", 100.0}, {"dur", 5.0},
          {"args", tp_args}},
         {{"ph", "X"}, {"cat", "kernel"}, {"name", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}, {"pid", 0}, {"tid", 20},
          {"ts", 110.0}, {"dur", 50.0}}});
    return f.dump();
  };
  const ImportedTrace tr = import_trace_texts({{"rank0.json", rank_file(0)}, {"rank1.json", rank_file(1)}});
  REQUIRE(tr.ranks.size() == 2);
  REQUIRE(tr.ranks[0].collectives.size() == 1);
  const RankCollective& c = tr.ranks[0].collectives[0];
  CHECK(c.name == "allreduce");
  CHECK(c.group_name == "tp1");
  CHECK(c.group_ranks == std::vector<int>{2, 3});
  CHECK(c.group_size == 2);
}

#ifdef DTLAB_HAVE_GUI
#include "app/snapshot_builder.h"

// The lab's snapshot of a run whose last collective is a process group's: the ring view's
// CollectiveView is that group's, in group ranks (its members are the ring), and the world's
// collective before it does not hide it.
TEST_CASE("the snapshot shows a group's collective on the ring of its members") {
  TrainConfig config;
  config.world_size = 4;
  config.model = ModelSpec::parse("mlp:2,8,3");
  const Model model(config.model, nullptr, config.seed);
  const Dataset data = make_dataset(config.data, 2, 3);
  const CostModel cost(find_profile(config.profile), 4);
  ThreadsWorld w(4);
  w.run([&](int rank, Communicator& comm, RankContext&) {
    auto ex = std::make_shared<GroupExecutor>();
    auto tp = new_group(comm, mesh_group({2, 1, 2}, MeshDim::TP, rank), 64, ex, cpu_device(), mesh_group_name({2, 1, 2}, MeshDim::TP, rank));
    std::vector<float> x(8, 1.0f);
    comm.all_reduce(x.data(), 8)->wait();  // world #0
    tp->all_reduce(x.data(), 8)->wait();   // tp0 / tp1 #0, after it
  });
  app::RunSources run;
  run.config = &config;
  run.model = &model;
  run.dataset = &data;
  run.cost = &cost;
  run.backend = "threads";
  app::SnapshotBuilder b;
  b.reset(run);
  b.begin_frame(nullptr);
  b.add_events(w.recorder());
  b.set_world_status(WorldStatus{});
  const app::CollectiveView& cv = b.finish_frame().collective;
  REQUIRE(cv.valid);
  REQUIRE(cv.group != 0);
  CHECK(cv.seq == 0);
  CHECK(cv.world == 2);
  CHECK(cv.world_size == 4);
  CHECK(cv.op == CollectiveOp::AllReduce);
  CHECK(cv.steps == 2);
  CHECK(cv.steps_done == 2);
  CHECK_FALSE(cv.in_flight);
  // Which TP group started last is a race; either is drawn on its own two ranks.
  CHECK((cv.members == std::vector<int>{0, 1} || cv.members == std::vector<int>{2, 3}));
  CHECK(cv.group_name == (cv.members[0] == 0 ? "tp0" : "tp1"));
  REQUIRE(cv.cells.size() == 2);
  for (const auto& row : cv.cells) CHECK(row == std::vector<int>{2, 2});
  CHECK(cv.label.empty());
  CHECK(cv.predicted_s > 0);  // the group's two steps on the profile's links
}
#endif  // DTLAB_HAVE_GUI

// Mixed precision's gradients and 16-bit TP activations cross process groups (HYBRID_SHARD's, a
// mesh's TP and DP groups): a group sums bf16 and fp16 in the ring order the world's ring does,
// widening, adding and rounding once per step, so its results are the world's ring's bit for bit
// (chunks of equal size), and an all-gather moves the 2-byte elements as they are.
TEST_CASE("a process group all-reduces, reduce-scatters and all-gathers bf16 and fp16 as the world does, bit for bit") {
  for (DType dt : {DType::BF16, DType::F16}) {
    const HalfFormat f = dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16;
    constexpr int n = 4;
    constexpr int64_t count = 12;  // equal chunks: the group's padded ring and the world's cut them alike
    ThreadsWorld w(n);
    w.run([&](int rank, Communicator& comm, RankContext&) {
      auto ex = std::make_shared<GroupExecutor>();
      auto group = new_group(comm, {0, 1, 2, 3}, 4096, ex, cpu_device(), "all");
      std::vector<uint16_t> mine(static_cast<size_t>(count * n));
      for (size_t i = 0; i < mine.size(); i++)
        mine[i] = half_from_float(0.37f * static_cast<float>(rank + 1) + 0.011f * static_cast<float>(i), f);
      std::vector<uint16_t> a = mine, b = mine;
      comm.all_reduce(a.data(), count, dt, ReduceOp::Sum, Algorithm::Ring)->wait();
      group->all_reduce(b.data(), count, dt, ReduceOp::Sum)->wait();
      CHECK(a == b);
      std::vector<uint16_t> rs_world(count), rs_group(count);
      comm.reduce_scatter(rs_world.data(), mine.data(), count, dt, ReduceOp::Sum)->wait();
      group->reduce_scatter(rs_group.data(), mine.data(), count, dt, ReduceOp::Sum)->wait();
      CHECK(rs_world == rs_group);
      std::vector<uint16_t> ag(static_cast<size_t>(count * n));
      group->all_gather(ag.data(), mine.data(), count, dt)->wait();
      for (int r = 0; r < n; r++)
        CHECK(ag[static_cast<size_t>(r * count)] == half_from_float(0.37f * static_cast<float>(r + 1), f));
      // avg is float32's only, as on the world.
      CHECK_THROWS_WITH_AS(group->all_reduce(b.data(), count, dt, ReduceOp::Avg), doctest::Contains("avg is defined for float32 only"),
                           Error);
    });
  }
}

// An all-to-all's events say what each rank keeps and what leaves it, for both kinds (the lab's
// All-to-all view draws them): the plain one's equal blocks, count elements to each rank and its own
// block kept, and all_to_all_v's split sizes, its own count kept.
TEST_CASE("all-to-all events: the plain one's equal blocks and all_to_all_v's split sizes, the own block kept") {
  const int n = 3;
  const int64_t S[3][3] = {{5, 7, 2}, {3, 4, 9}, {6, 1, 8}};  // elements group rank i sends j (all_to_all_v)
  ThreadsWorld w(n);
  w.run([&](int rank, Communicator& comm, RankContext&) {
    auto ex = std::make_shared<GroupExecutor>();
    auto g = new_group(comm, {0, 1, 2}, 64, ex, cpu_device(), "ep0");
    std::vector<float> in(32, static_cast<float>(rank)), out(32, -1.0f);
    g->all_to_all(out.data(), in.data(), 2, DType::F32)->wait();
    for (int j = 0; j < n; j++) CHECK(out[static_cast<size_t>(2 * j)] == static_cast<float>(j));
    std::vector<int64_t> send(n), recv(n);
    for (int j = 0; j < n; j++) send[static_cast<size_t>(j)] = S[rank][j], recv[static_cast<size_t>(j)] = S[j][rank];
    g->all_to_all_v(out.data(), recv, in.data(), send, DType::F32)->wait();
    comm.all_to_all(out.data(), in.data(), 3, DType::F32)->wait();
  });
  for (int r = 0; r < n; r++) {
    CAPTURE(r);
    int seen = 0;
    for (const Event& e : w.recorder().events(r)) {
      if ((e.kind != EventKind::CollectiveIssue && e.kind != EventKind::Collective) || e.coll.op != CollectiveOp::AllToAll) continue;
      seen++;
      if (e.coll.group == 0) {  // the world's plain all_to_all, 3 elements a block
        CHECK_FALSE(e.coll.split_sizes);
        CHECK(e.coll.in_count == 3 * n);
        CHECK(e.coll.kept_count == 3);
      } else if (e.coll.seq == 0) {  // the group's plain one, 2 elements a block
        CHECK_FALSE(e.coll.split_sizes);
        CHECK(e.coll.in_count == 2 * n);
        CHECK(e.coll.kept_count == 2);
      } else {  // all_to_all_v: what it sends in all, its own count kept, the rest leaves
        CHECK(e.coll.split_sizes);
        CHECK(e.coll.in_count == S[r][0] + S[r][1] + S[r][2]);
        CHECK(e.coll.kept_count == S[r][r]);
        CHECK(e.coll.bytes == (e.coll.in_count - S[r][r]) * 4);
      }
    }
    CHECK(seen == 6);  // three all-to-alls, each issued and run
  }
}
