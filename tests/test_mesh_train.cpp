// --tp in the trainer (engine/train/train_mesh.cpp, docs/course_sources.md §6c): tensor parallelism
// composed with DDP, FSDP and the pipeline on the device mesh. Every layout trains to the parameters of
// its reference (one TP rank per replica) within 1e-5 after 20 steps, saves the full unsharded state
// dict under torch.nn.Sequential's names, and records its collectives in the mesh's groups.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// Two Linear pairs and a replicated last Linear at tp 2; a single pair plus the last at tp 4.
TrainConfig mesh_config(const std::string& strategy, int world, int tp, OptimizerKind kind) {
  TrainConfig c = test::demo_config(strategy, world, 16, 20);
  c.model = ModelSpec::parse("mlp:2,32,32,32,32,3");
  c.tp = tp;
  c.seed = 3;
  c.timeout_s = 20;
  c.optimizer = default_optimizer_config(kind);
  if (kind == OptimizerKind::SGD) c.optimizer.momentum = 0.9;
  if (kind == OptimizerKind::AdamW) c.optimizer.lr = 0.01;
  return c;
}

double max_diff(Model& a, Model& b) { return test::max_abs_diff(a, b); }

using test::error_of;

}  // namespace

TEST_SUITE("mesh") {
  TEST_CASE("tensor parallel alone (dp 1) trains to the one-rank model, with and without sequence parallelism") {
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      TrainConfig one = mesh_config("single", 1, 1, kind);
      Trainer ref(one);
      ref.run();
      for (int tp : {2, 4}) {
        for (bool sp : {false, true}) {
          CAPTURE(optimizer_name(kind));
          CAPTURE(tp);
          CAPTURE(sp);
          TrainConfig c = mesh_config("ddp", tp, tp, kind);
          c.sequence_parallel = sp;
          Trainer t(c);
          t.run();
          CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
        }
      }
    }
  }

  TEST_CASE("--tp T --activation-checkpointing (ddp at world T, fsdp at world 2T) trains to the model without either") {
    for (int tp : {2, 4}) {
      for (bool sp : {false, true}) {
        CAPTURE(tp);
        CAPTURE(sp);
        TrainConfig one = mesh_config("single", 1, 1, OptimizerKind::AdamW);
        one.steps = 3;
        Trainer ref(one);
        ref.run();
        TrainConfig c = mesh_config("ddp", tp, tp, OptimizerKind::AdamW);
        c.steps = 3;
        c.sequence_parallel = sp;
        c.activation_checkpointing = true;
        Trainer t(c);
        t.run();
        CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
      }
    }
    // FSDP gathers each unit again for its recompute; with TP the gathered shard replays its collectives.
    TrainConfig two = mesh_config("ddp", 2, 1, OptimizerKind::AdamW);
    two.steps = 3;
    Trainer ref(two);
    ref.run();
    TrainConfig f = mesh_config("fsdp", 4, 2, OptimizerKind::AdamW);
    f.steps = 3;
    f.activation_checkpointing = true;
    Trainer t(f);
    t.run();
    CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
  }

  TEST_CASE("--tp T --lora-rank 4 trains and saves the one-rank run's adapters (ddp at world T, dp 2 x tp 2 on ddp and fsdp)") {
    const std::string dir = std::filesystem::temp_directory_path() / ("dtlab_mesh_lora_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto lora_run = [&](const char* strategy, int world, int tp) {
      TrainConfig c = mesh_config(strategy, world, tp, OptimizerKind::AdamW);
      c.steps = 3;
      c.lora.rank = 4;
      c.save_path = dir + "/" + strategy + std::to_string(world) + "_" + std::to_string(tp) + ".safetensors";
      return c;
    };
    auto same_file = [](const std::string& a, const std::string& b) {
      const SafetensorsFile fa = load_safetensors(a), fb = load_safetensors(b);
      REQUIRE(fa.entries.size() == fb.entries.size());
      double d = 0;
      for (const SafetensorsEntry& e : fa.entries) {
        const SafetensorsEntry* o = fb.find(e.name);
        REQUIRE(o != nullptr);
        CHECK(o->shape == e.shape);
        REQUIRE(e.dtype == DType::F32);
        std::vector<float> x(static_cast<size_t>((e.end - e.begin) / 4)), y(x.size());
        std::memcpy(x.data(), fa.bytes(e), x.size() * sizeof(float));
        std::memcpy(y.data(), fb.bytes(*o), y.size() * sizeof(float));
        for (size_t i = 0; i < x.size(); i++) d = std::max(d, static_cast<double>(std::fabs(x[i] - y[i])));
      }
      return d;
    };
    const TrainConfig one = lora_run("single", 1, 1);
    Trainer ref(one);
    ref.run();
    for (int tp : {2, 4}) {
      CAPTURE(tp);
      const TrainConfig c = lora_run("ddp", tp, tp);
      Trainer t(c);
      t.run();
      CHECK(t.result_model().lora());
      CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
      CHECK(same_file(c.save_path, one.save_path) <= 1e-5);
    }
    const TrainConfig two = lora_run("ddp", 2, 1);
    Trainer ddp(two);
    ddp.run();
    for (const char* strategy : {"ddp", "fsdp"}) {
      CAPTURE(strategy);
      const TrainConfig c = lora_run(strategy, 4, 2);
      Trainer t(c);
      t.run();
      CHECK(max_diff(t.result_model(), ddp.result_model()) <= 1e-5);
      CHECK(same_file(c.save_path, two.save_path) <= 1e-5);
    }
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("DDP x TP (world 4, tp 2) equals DDP on world 2, FSDP x TP equals it too") {
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      Trainer ref(mesh_config("ddp", 2, 1, kind));
      ref.run();
      for (const char* strategy : {"ddp", "fsdp"}) {
        CAPTURE(optimizer_name(kind));
        CAPTURE(strategy);
        Trainer t(mesh_config(strategy, 4, 2, kind));
        t.run();
        CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
      }
    }
  }

  TEST_CASE("HYBRID_SHARD x TP (world 8: tp 2, node groups of 2 data-parallel ranks) equals DDP on world 4, with LoRA and in bf16") {
    // torch's 3-D mesh ("replicate", "shard", "tp"): each TP coordinate's 4 data-parallel ranks shard
    // in node groups of 2 and replicate across the 2 groups. The node and replica groups are groups
    // of the world (their collectives name world ranks) and run on the mesh's one executor per rank.
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW})
      for (int lora : {0, 4}) {
        CAPTURE(optimizer_name(kind));
        CAPTURE(lora);
        TrainConfig d = mesh_config("ddp", 4, 1, kind);
        d.lora.rank = lora;
        Trainer ref(d);
        ref.run();
        TrainConfig c = mesh_config("fsdp", 8, 2, kind);
        c.lora.rank = lora;
        c.fsdp.sharding = Sharding::Hybrid;
        c.fsdp.node_size = 2;
        Trainer t(c);
        t.run();
        CHECK(max_diff(t.result_model(), ref.result_model()) <= 1e-5);
        if (kind != OptimizerKind::SGD || lora != 0) continue;
        std::set<std::string> groups;
        for (const Event& e : t.recorder().all_events())
          if (e.kind == EventKind::Collective && e.rank == 0)
            groups.insert(e.coll.group == 0 ? std::string("world") : t.recorder().label(e.coll.group - 1));
        // rank 0: its TP group, the mesh's DP group (FSDP's broadcast of the model), its node group
        // and its replica group, both on world ranks, and the world's loss report.
        CHECK(groups == std::set<std::string>{"world", "tp0: 0,1", "dp0: 0,2,4,6", "shard0: 0,2", "replicate0: 0,4"});
      }
    // bf16: the node groups reduce-scatter and the replicas all-reduce 16-bit gradients, rounding
    // where DDP's buckets do not: within bf16's rounding at each tensor's scale.
    TrainConfig d = mesh_config("ddp", 4, 1, OptimizerKind::SGD);
    d.steps = 3;
    d.precision = Precision::BF16;
    Trainer ref(d);
    ref.run();
    d.precision = Precision::FP32;
    Trainer exact(d);
    exact.run();
    TrainConfig c = mesh_config("fsdp", 8, 2, OptimizerKind::SGD);
    c.steps = 3;
    c.precision = Precision::BF16;
    c.fsdp.sharding = Sharding::Hybrid;
    c.fsdp.node_size = 2;
    Trainer t(c);
    t.run();
    const std::string why = test::differs_at_tensor_scale(c.model, t.result_model().merged_params(), ref.result_model().merged_params(),
                                                          exact.result_model().merged_params(), 1.6e-2);
    CHECK_MESSAGE(why.empty(), why);
  }

  TEST_CASE("a 2 x 2 x 2 mesh (pipeline, dp 2, tp 2) equals DDP on world 2 and the pipeline without TP") {
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      CAPTURE(optimizer_name(kind));
      Trainer ddp(mesh_config("ddp", 2, 1, kind));
      ddp.run();
      TrainConfig p = mesh_config("pipeline", 4, 1, kind);
      p.pipeline.stages = 2;
      p.pipeline.dp = 2;
      p.pipeline.microbatches = 4;
      Trainer pipe(p);
      pipe.run();
      TrainConfig m = p;
      m.world_size = 8;
      m.tp = 2;
      Trainer mesh(m);
      CHECK(mesh.mesh() == MeshShape{2, 2, 2});
      mesh.run();
      CHECK(max_diff(mesh.result_model(), pipe.result_model()) <= 1e-5);
      CHECK(max_diff(mesh.result_model(), ddp.result_model()) <= 1e-5);
    }
  }

  TEST_CASE("--sequence-parallel in an MLP pipeline trains as the pipeline without it, each stage sending its TP rank's rows") {
    // Megatron's sequence parallelism inside each stage (engine/core/model.h, sp_stage_*): the stages
    // exchange each TP rank's rows of a micro-batch (padded to a multiple of tp), the column layers'
    // gathered inputs are kept per micro-batch in flight, and ZB-H1's W reads the gathered output
    // gradient its I kept. Batch 12 in 4 micro-batches of 3 rows: each padded to 4, 2 per TP rank.
    struct Case {
      ScheduleKind schedule;
      int64_t batch;
      bool recompute;
      int lora;
      OptimizerKind opt;
    };
    const Case cases[] = {{ScheduleKind::GPipe, 16, false, 0, OptimizerKind::AdamW},  {ScheduleKind::OneFOneB, 12, false, 0, OptimizerKind::SGD},
                          {ScheduleKind::ZBH1, 16, false, 0, OptimizerKind::AdamW},   {ScheduleKind::ZBH1, 12, true, 0, OptimizerKind::SGD},
                          {ScheduleKind::OneFOneB, 16, true, 4, OptimizerKind::SGD},  {ScheduleKind::ZBH1, 12, false, 4, OptimizerKind::AdamW}};
    for (const Case& k : cases) {
      // Under the sanitizers (test::quick) the three ZB-H1 and padded cases.
      if (test::quick() && (k.schedule == ScheduleKind::GPipe || (k.schedule == ScheduleKind::OneFOneB && k.batch == 16))) continue;
      TrainConfig c = mesh_config("pipeline", 4, 2, k.opt);
      c.pipeline.stages = 2;
      c.pipeline.microbatches = 4;
      c.pipeline.schedule = k.schedule;
      c.batch = k.batch;
      c.activation_checkpointing = k.recompute;
      c.lora.rank = k.lora;
      const std::string what = std::string(schedule_kind_name(k.schedule)) + " batch " + std::to_string(k.batch) +
                               (k.recompute ? " recompute" : "") + " lora " + std::to_string(k.lora);
      CAPTURE(what);
      Trainer ref(c);
      ref.run();
      c.sequence_parallel = true;
      Trainer sp(c);
      sp.run();
      CHECK(test::max_abs_diff(sp.result_model().merged_params(), ref.result_model().merged_params()) <= 1e-5);
      if (k.batch != 16) continue;
      // Stage 0's F sends its TP rank's 2 of the micro-batch's 4 rows of 32 floats: half the bytes.
      int sends = 0;
      for (const Event& e : sp.recorder().all_events())
        if (e.kind == EventKind::PipelineAction && e.pipe.stage == 0 && e.pipe.type == ActionType::Forward) {
          CHECK(e.pipe.bytes == 2 * 32 * 4);
          sends++;
        }
      CHECK(sends == 20 * 4 * 2);  // 20 steps x 4 micro-batches x the 2 ranks of stage 0
    }
  }

  TEST_CASE("--sequence-parallel in a 16-bit MLP pipeline: ZB-H1 equals 1F1B bit for bit, and both train as one 16-bit rank") {
    for (bool amp : {false, true}) {
      for (int lora : {0, 4}) {
        CAPTURE(amp);
        CAPTURE(lora);
        TrainConfig c = mesh_config("pipeline", 4, 2, OptimizerKind::SGD);
        c.pipeline.stages = 2;
        c.pipeline.microbatches = 1;  // one micro-batch per stage: I then W add what B adds
        c.sequence_parallel = true;
        c.steps = 3;
        c.lora.rank = lora;
        (amp ? c.amp : c.precision) = Precision::BF16;
        test::zb_h1_equals_1f1b(c);
        Trainer pipe(c);
        test::check_16bit_like_one_rank(c, pipe);  // and one 16-bit rank on the same batch
      }
    }
  }

  TEST_CASE("--save writes the full unsharded state dict with torch.nn.Sequential names from every layout") {
    const std::string dir = std::filesystem::temp_directory_path() / ("dtlab_mesh_save_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    struct Layout {
      const char* strategy;
      int world, tp, stages;
    };
    for (const Layout& l : {Layout{"ddp", 2, 2, 1}, Layout{"ddp", 4, 2, 1}, Layout{"fsdp", 4, 2, 1}, Layout{"pipeline", 8, 2, 2}}) {
      CAPTURE(l.strategy);
      CAPTURE(l.world);
      TrainConfig c = mesh_config(l.strategy, l.world, l.tp, OptimizerKind::AdamW);
      c.steps = 3;
      if (l.stages > 1) c.pipeline.stages = l.stages, c.pipeline.dp = l.world / (l.stages * l.tp), c.pipeline.microbatches = 2;
      c.save_path = dir + "/" + l.strategy + std::to_string(l.world) + ".safetensors";
      Trainer t(c);
      t.run();
      const SafetensorsFile f = load_safetensors(c.save_path);
      std::set<std::string> names;
      for (const SafetensorsEntry& e : f.entries) names.insert(e.name);
      CHECK(names == std::set<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias", "6.weight",
                                           "6.bias", "8.weight", "8.bias"});
      CHECK(f.find("2.weight")->shape == Shape{32, 32});
      CHECK(f.find("0.weight")->shape == Shape{32, 2});
      Model back(c.model, nullptr, 99);
      load_checkpoint(c.save_path, back);
      CHECK(max_diff(back, t.result_model()) == 0);
    }
    std::filesystem::remove_all(dir);
  }

  TEST_CASE("collectives carry the mesh's groups") {
    TrainConfig c = mesh_config("ddp", 4, 2, OptimizerKind::AdamW);
    c.steps = 2;
    Trainer t(c);
    t.run();
    std::set<std::string> groups;
    for (const Event& e : t.recorder().all_events()) {
      if (e.kind != EventKind::Collective || e.rank != 0) continue;
      groups.insert(e.coll.group == 0 ? std::string("world") : t.recorder().label(e.coll.group - 1));
    }
    // rank 0: its TP group {0, 1}, its DP group {0, 2}, and the world's loss report.
    CHECK(groups == std::set<std::string>{"world", "tp0: 0,1", "dp0: 0,2"});
  }

  TEST_CASE("bad meshes get one sentence") {
    TrainConfig c = mesh_config("ddp", 4, 3, OptimizerKind::AdamW);
    CHECK(error_of(c) == "--world 4 is not a multiple of --tp 3 x --stages 1 = 3; the data-parallel degree is world / (tp x stages), "
                         "so pick a world that divides");
    c = mesh_config("ddp", 4, 4, OptimizerKind::AdamW);
    c.model = ModelSpec::parse("mlp:2,30,30,3");
    CHECK(error_of(c) == "--tp 4 splits the output features of Linear 0 (width 30) across the tensor-parallel group, but 30 is not "
                         "divisible by 4; use hidden widths that are multiples of --tp");
    c = mesh_config("dp", 2, 2, OptimizerKind::AdamW);
    CHECK(error_of(c) == "--tp with --strategy dp: torch.nn.DataParallel replicates the whole module from one process and has no "
                         "process groups to split it over; use --strategy ddp (or fsdp) with --tp");
    c = mesh_config("ddp", 2, 1, OptimizerKind::AdamW);
    c.sequence_parallel = true;
    CHECK(error_of(c) == "--sequence-parallel splits activations across the tensor-parallel group; add --tp 2 or more");
    c = mesh_config("pipeline", 8, 2, OptimizerKind::AdamW);
    c.pipeline.stages = 2;
    c.pipeline.dp = 1;
    CHECK(error_of(c) == "--world 8 with --tp 2 and --stages 2 leaves 2 data-parallel replicas, but --dp is 1; set --dp 2 or drop --world");
  }

  TEST_CASE("the run's header lists the mesh, its groups, each Linear's split and each rank's coordinates") {
    TrainConfig c = mesh_config("ddp", 4, 2, OptimizerKind::AdamW);
    Trainer t(c);
    const std::vector<std::string> lines = t.describe_mesh_lines();
    REQUIRE(lines.size() == 12);
    CHECK(lines[1] == "  tp groups: tp0 [0, 1] tp1 [2, 3]");
    CHECK(lines[2] == "  dp groups: dp0 [0, 2] dp1 [1, 3]");
    CHECK(lines[3] == "  Linear 0 (2 -> 32): column-parallel, 16 of 32 output features per rank");
    CHECK(lines[4] == "  Linear 2 (32 -> 32): row-parallel, 16 of 32 input features per rank, outputs summed by an all-reduce");
    CHECK(lines[7] == "  Linear 8 (32 -> 3): replicated, every rank holds all of it");
    CHECK(lines[8] == "  rank 0: dp 0, pp 0, tp 0 -- every layer, TP shard 0 of 2, replica 0 of 2");
    CHECK(lines[11] == "  rank 3: dp 1, pp 0, tp 1 -- every layer, TP shard 1 of 2, replica 1 of 2");
  }

  TEST_CASE("each rank of a pipeline mesh: its coordinates, its stage's Linear layers, its TP shard and replica") {
    TrainConfig c = mesh_config("pipeline", 8, 2, OptimizerKind::AdamW);
    c.pipeline.stages = 2, c.pipeline.dp = 2, c.pipeline.microbatches = 2;
    Trainer t(c);
    // mlp:2,32,32,32,32,3 balanced over 2 stages: Linear layers 0-2 (2,208 parameters) and 3-4 (1,155).
    REQUIRE(t.pipeline_plan()->stages == std::vector<StageRange>{{0, 3}, {3, 5}});
    const std::vector<std::string> lines = t.describe_mesh_lines();
    REQUIRE(lines.size() >= 9);
    CHECK(lines[0] == "mesh: dp 2 x pp 2 x tp 2 = 8 ranks, laid out as torch's init_device_mesh (\"dp\", \"pp\", \"tp\"): "
                      "rank = (dp x 2 + pp) x 2 + tp");
    const std::vector<std::string> ranks(lines.end() - 8, lines.end());
    CHECK(ranks[0] == "  rank 0: dp 0, pp 0, tp 0 -- stage 0 (Linear 0, 2, 4), TP shard 0 of 2, replica 0 of 2");
    CHECK(ranks[2] == "  rank 2: dp 0, pp 1, tp 0 -- stage 1 (Linear 6, 8), TP shard 0 of 2, replica 0 of 2");
    CHECK(ranks[5] == "  rank 5: dp 1, pp 0, tp 1 -- stage 0 (Linear 0, 2, 4), TP shard 1 of 2, replica 1 of 2");
    CHECK(ranks[7] == "  rank 7: dp 1, pp 1, tp 1 -- stage 1 (Linear 6, 8), TP shard 1 of 2, replica 1 of 2");

    // Replicas of a pipeline without --tp are a mesh too; interleaved ranks hold two stages each.
    c = mesh_config("pipeline", 4, 1, OptimizerKind::AdamW);
    c.pipeline.stages = 2, c.pipeline.dp = 2, c.pipeline.microbatches = 2;
    c.pipeline.schedule = ScheduleKind::Interleaved1F1B, c.pipeline.chunks = 2, c.pipeline.split = {1, 1, 2, 1};
    const std::vector<std::string> dp = Trainer(c).describe_mesh_lines();
    REQUIRE(dp.size() == 7);
    CHECK(dp[1] == "  pp groups: pp0 [0, 1] pp1 [2, 3]");
    CHECK(dp[2] == "  dp groups: dp0 [0, 2] dp1 [1, 3]");
    CHECK(dp[4] == "  rank 1: dp 0, pp 1, tp 0 -- stages 1 (Linear 2), 3 (Linear 8), replica 0 of 2");
    CHECK(dp[5] == "  rank 2: dp 1, pp 0, tp 0 -- stages 0 (Linear 0), 2 (Linear 4, 6), replica 1 of 2");

    // One pipeline and plain replicas are no mesh: nothing to print.
    c.pipeline.dp = 1, c.world_size = 2;
    CHECK(Trainer(c).describe_mesh_lines().empty());
    CHECK(Trainer(mesh_config("ddp", 4, 1, OptimizerKind::AdamW)).describe_mesh_lines().empty());
  }

  TEST_CASE("a replica's and a stage's ranks in the mesh, and how they read") {
    const MeshShape m{2, 2, 2};
    CHECK(mesh_ranks_at(m, MeshDim::DP, 1) == std::vector<int>{4, 5, 6, 7});
    CHECK(mesh_ranks_at(m, MeshDim::PP, 1) == std::vector<int>{2, 3, 6, 7});
    CHECK(mesh_ranks_at(m, MeshDim::TP, 0) == std::vector<int>{0, 2, 4, 6});
    CHECK(rank_runs_text({4, 5, 6, 7}) == "ranks 4-7");
    CHECK(rank_runs_text({2, 3, 6, 7}) == "ranks 2, 3, 6, 7");
    CHECK(rank_runs_text({0, 1, 2, 5, 8, 9, 10, 11}) == "ranks 0-2, 5, 8-11");
    CHECK(rank_runs_text({3}) == "rank 3");
  }

  TEST_CASE("a 2 x 2 x 2 mesh's pipeline figures are per world rank: replica, stage and tp rank from the mesh") {
    TrainConfig c = mesh_config("pipeline", 8, 2, OptimizerKind::AdamW);
    c.pipeline.stages = 2, c.pipeline.dp = 2, c.pipeline.microbatches = 2;
    c.steps = 2;
    Trainer t(c);
    std::vector<StepReport> reports;
    const TrainSummary s = t.run([&](const StepReport& r) { reports.push_back(r); });
    REQUIRE(reports.size() == 2);
    CHECK(reports[1].bubble.size() == 8);
    REQUIRE(s.pipeline.ranks.size() == 8);
    for (int r = 0; r < 8; r++) {
      CAPTURE(r);
      const PipelineRankStats& x = s.pipeline.ranks[static_cast<size_t>(r)];
      const MeshCoord at = mesh_coord(t.mesh(), r);
      CHECK(x.rank == r);
      CHECK(x.replica == at.dp);
      CHECK(x.pipe_rank == at.pp);
      CHECK(x.tp_rank == at.tp);
      CHECK(x.stages == std::vector<int>{at.pp});
      CHECK(x.bubble == doctest::Approx(reports.back().bubble[static_cast<size_t>(r)] / 2 +
                                        reports.front().bubble[static_cast<size_t>(r)] / 2));
    }
  }
}

TEST_SUITE("mesh") {
  TEST_CASE("--tp with a strategy that has no replica to split gets the strategy's sentence first") {
    TrainConfig c = mesh_config("single", 1, 2, OptimizerKind::AdamW);
    CHECK(error_of(c) == "--tp with --strategy single: one rank has no group to split a layer across; use --strategy ddp --world T "
                         "--tp T (one replica in T shards)");
    c = mesh_config("pipeline", 4, 1, OptimizerKind::AdamW);
    c.pipeline.stages = 2;
    c.pipeline.dp = 1;
    c.world_size = 3;  // without --tp the pipeline's own sentence stays
    CHECK(error_of(c).rfind("--world 3 is not --stages 2 x --dp 1 = 2", 0) == 0);
  }
}
