// The mesh view's data without a run (Snapshot::mesh from the SnapshotBuilder: the shape, each
// rank's slices of the weights, the newest collective's group from synthetic events with group
// labels "tp2: 4,5") and the view itself under Xvfb on a world-8 run.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "app/snapshot_builder.h"
#include "app/views/views.h"
#include "tests/gui_util.h"
#include "tests/test_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

// What a Trainer would hand the builder for a mesh run, built without one.
struct MeshRig {
  TrainConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<Dataset> data;
  std::unique_ptr<CostModel> cost;
  std::unique_ptr<TraceRecorder> rec;
  SnapshotBuilder builder;

  MeshRig(const std::string& strategy, const std::string& spec, int world, int tp, int stages) {
    config.strategy = parse_strategy(strategy);
    config.world_size = world;
    config.tp = tp;
    config.pipeline.stages = stages;
    config.model = ModelSpec::parse(spec);
    if (config.model.is_gpt()) config.data = "text";
    model = std::make_unique<Model>(config.model, nullptr, config.seed);
    data = std::make_unique<Dataset>(make_dataset(config.data, config.model.in_features(), config.model.out_features()));
    cost = std::make_unique<CostModel>(find_profile(config.profile), world);
    rec = std::make_unique<TraceRecorder>(world);
    RunSources run;
    run.config = &config;
    run.model = model.get();
    run.dataset = data.get();
    run.cost = cost.get();
    run.total_steps = 10;
    run.backend = "threads";
    builder.reset(run);
  }
  // A collective of `op` in the group labelled `label` ("" for the world), ended on every member.
  void collective(const std::string& label, const std::vector<int>& ranks, CollectiveOp op = CollectiveOp::AllReduce) {
    const int32_t group = label.empty() ? 0 : 1 + rec->intern(label);
    for (int r : ranks) {
      Event e(EventKind::Collective, Lane::Comm, 0, 0, 0, 0);
      e.rank = r;
      e.coll.op = op;
      e.coll.algo = Algorithm::Ring;
      e.coll.group_size = static_cast<int16_t>(ranks.size());
      e.coll.seq = seq_++;
      e.coll.group = group;
      rec->record(e);
    }
  }
  const Snapshot& frame() {
    builder.begin_frame(nullptr);
    builder.add_events(*rec);
    WorldStatus ws;
    ws.compute_activity.assign(static_cast<size_t>(config.world_size), "idle");
    ws.comm_activity.assign(static_cast<size_t>(config.world_size), "idle");
    builder.set_world_status(ws);
    return builder.finish_frame();
  }

 private:
  uint64_t seq_ = 0;
};

}  // namespace

TEST_SUITE("gui") {
  TEST_CASE("mesh snapshot: a 2 x 2 x 2 pipeline mesh, each rank's slices of the weights") {
    MeshRig rig("pipeline", "mlp:8,64,64,64,4", 8, 2, 2);
    const Snapshot& s = rig.frame();
    CHECK(s.mesh.shape == MeshShape{2, 2, 2});
    CHECK(s.mesh.error.empty());
    REQUIRE(s.mesh.stages.size() == 2);
    CHECK(s.mesh.stages[0] == StageRange{0, 2});
    REQUIRE(s.mesh.slices.size() == 8);
    // rank 5 = (dp 1, pp 0, tp 1): stage 0's pair, the second half of each split.
    CHECK(s.mesh.slices[5] == std::vector<std::string>{"0.weight rows 32-63 of 64 (column-parallel)", "0.bias 32-63 of 64",
                                                       "2.weight columns 32-63 of 64 (row-parallel)",
                                                       "2.bias whole (added once, after the partial outputs are summed)"});
    // rank 2 = (dp 0, pp 1, tp 0): stage 1's pair, the first half.
    CHECK(s.mesh.slices[2][0] == "4.weight rows 0-31 of 64 (column-parallel)");
    CHECK(s.mesh.slices[2][2] == "6.weight columns 0-31 of 64 (row-parallel)");
    CHECK_FALSE(s.mesh.group.valid);  // no collective yet
  }

  TEST_CASE("mesh snapshot: a GPT on 2 x 2 x 2, each rank's heads and MLP columns, its stage's blocks in one entry") {
    MeshRig rig("pipeline", "gpt:layers=4,heads=4,embd=32,ctx=16,vocab=62", 8, 2, 2);
    const Snapshot& s = rig.frame();
    CHECK(s.mesh.shape == MeshShape{2, 2, 2});
    REQUIRE(s.mesh.slices.size() == 8);
    // rank 7 = (dp 1, pp 1, tp 1): blocks 2 and 3, ln_f and the head's copy of wte; heads 2-3.
    CHECK(s.mesh.slices[7] ==
          std::vector<std::string>{"transformer.h.2-3, each: heads 2-3 of 4, MLP columns 64-127 of 128 (6,448 parameters)",
                                   "  attn.c_attn: rows 16-31 of each of q, k, v (column-parallel); attn.c_proj: columns 16-31 (row-parallel)",
                                   "  mlp.c_fc: rows 64-127 (column-parallel); mlp.c_proj: columns 64-127 (row-parallel)",
                                   "  ln_1, ln_2 and both c_proj biases whole (a bias is added once, after the sum)",
                                   "transformer.ln_f whole (replicated in the tp group)",
                                   "lm_head.weight whole, 62 x 32 (wte's copy; the embedding group sums their gradients)"});
    CHECK(s.mesh.slices[0][0] == "transformer.wte.weight whole, 62 x 32 (replicated in the tp group)");
  }

  TEST_CASE("mesh snapshot: DDP x TP keeps an odd last Linear replicated, a world that does not divide says why") {
    MeshRig rig("ddp", "mlp:8,64,64,3", 4, 2, 1);
    const Snapshot& s = rig.frame();
    CHECK(s.mesh.shape == MeshShape{2, 1, 2});
    REQUIRE(s.mesh.slices.size() == 4);
    CHECK(s.mesh.slices[1].size() == 6);
    CHECK(s.mesh.slices[1][0] == "0.weight rows 32-63 of 64 (column-parallel)");
    CHECK(s.mesh.slices[1][4] == "4.weight whole, 3 x 64 (replicated in the tp group)");

    MeshRig bad("ddp", "mlp:8,64,64,3", 8, 3, 1);
    const Snapshot& b = bad.frame();
    CHECK(b.mesh.shape == MeshShape{8, 1, 1});
    CHECK(b.mesh.error.find("--world 8 is not a multiple of --tp 3") != std::string::npos);
  }

  TEST_CASE("mesh snapshot: the newest collective's group, from its label, else the world") {
    MeshRig rig("pipeline", "mlp:8,64,64,64,4", 8, 2, 2);
    rig.collective("dp1: 1,5", {1, 5});
    rig.collective("tp2: 4,5", {4, 5}, CollectiveOp::AllGather);
    const Snapshot& s = rig.frame();
    REQUIRE(s.mesh.group.valid);
    CHECK(s.mesh.group.name == "tp2");
    CHECK(s.mesh.group.ranks == std::vector<int>{4, 5});
    CHECK(s.mesh.group.op == CollectiveOp::AllGather);

    rig.collective("", {0, 1, 2, 3, 4, 5, 6, 7});  // group 0: the whole world
    CHECK(rig.frame().mesh.group.name == "the world");
    CHECK(rig.frame().mesh.group.ranks.size() == 8);
    rig.collective("", {2, 4}, CollectiveOp::Send);  // a pipeline send is no group to light
    CHECK(rig.frame().mesh.group.name == "the world");
  }

  TEST_CASE("script: view mesh parses") {
    CHECK(test::script_error("view mesh").empty());
  }

  TEST_CASE("under Xvfb: the mesh view draws every rank and lights the world's all-reduce") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir;
    const std::string png = dir.file("mesh.png");
    test::ShellResult r = test::run_app("--world 8 --run 'step collective 2; view mesh; screenshot " + png + "; quit'", dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    test::Image im = test::load_png(png);
    for (int rank : {0, 3, 7}) CHECK(test::count_near(im, app::rank_color(rank, 8), 8) > 200);
    CHECK(test::count_near(im, IM_COL32(255, 255, 255, 255), 4) > 200);  // the lit group's outlines
  }
}

#endif  // DTLAB_HAVE_GUI
