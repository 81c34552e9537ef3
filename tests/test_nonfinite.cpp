// A non-finite loss stops training (engine/train/nonfinite.h): one NaN in the data, or NaN
// parameters from a checkpoint, end the run at that step with one sentence naming the rank and where
// the non-finite values first appear, under every strategy; nothing is saved; --allow-nonfinite
// trains on as a plain PyTorch loop would. The fixture tests/data/nan_x.npz (make_fixtures.py) has
// 64 rows with a NaN in row 41.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "engine/core/check.h"
#include "engine/io/checkpoint.h"
#include "engine/train/nonfinite.h"
#include "engine/train/train.h"

using namespace dtlab;

namespace {

std::string nan_data() { return std::string(DTLAB_SOURCE_DIR) + "/tests/data/nan_x.npz"; }

// mlp:2,16,16,3 on nan_x.npz, 16 rows per rank per step, in order: row 41 is in rank 1's second
// batch with two ranks (a rank takes every second row), in the third batch of one rank.
TrainConfig nan_config(const std::string& strategy, int world) {
  TrainConfig c;
  c.strategy = strategy;
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,16,16,3");
  c.data = nan_data();
  c.batch = 16;
  c.steps = 4;
  c.shuffle = false;
  c.optimizer.lr = 0.01;
  return c;
}

// The sentence the run stops with, and the steps it reported before.
struct Stopped {
  std::string message;
  std::vector<StepReport> reports;
  bool run_stopped = false;  // thrown as RunStopped (not blamed on one rank)
};

Stopped run_until_stopped(const TrainConfig& c) {
  Stopped s;
  try {
    Trainer t(c);
    t.run([&](const StepReport& r) { s.reports.push_back(r); });
  } catch (const RunStopped& e) {
    s.message = e.what();
    s.run_stopped = true;
  } catch (const std::exception& e) {
    s.message = e.what();
  }
  return s;
}

}  // namespace

TEST_SUITE("nonfinite") {
  TEST_CASE("one NaN in the data stops DDP at its step, naming the rank that read it") {
    const Stopped s = run_until_stopped(nan_config("ddp", 2));
    INFO(s.message);
    CHECK(s.run_stopped);
    CHECK(s.message.rfind("training stopped at step 2: the loss became nan on rank 1, whose input batch holds "
                          "non-finite values", 0) == 0);
    CHECK(s.message.find("--allow-nonfinite") != std::string::npos);
    REQUIRE(s.reports.size() == 1);  // step 1 was finite and reported
    CHECK(std::isfinite(s.reports[0].loss));
  }

  TEST_CASE("the same stop under single, FSDP and the pipeline") {
    {
      const Stopped s = run_until_stopped(nan_config("single", 1));
      INFO(s.message);
      CHECK(s.message.rfind("training stopped at step 3: the loss became nan on rank 0, whose input batch", 0) == 0);
    }
    {
      const Stopped s = run_until_stopped(nan_config("fsdp", 2));
      INFO(s.message);
      CHECK(s.run_stopped);
      CHECK(s.message.rfind("training stopped at step 2: the loss became nan on rank 1, whose input batch", 0) == 0);
    }
    {
      // Two stages, one replica: the replica reads rows in order, and its last stage (rank 1)
      // computes the loss.
      TrainConfig c = nan_config("pipeline", 2);
      c.pipeline.stages = 2;
      c.pipeline.microbatches = 2;
      const Stopped s = run_until_stopped(c);
      INFO(s.message);
      CHECK(s.run_stopped);
      CHECK(s.message.rfind("training stopped at step 3: the loss became nan on rank 1", 0) == 0);
      CHECK(s.reports.size() == 2);
    }
  }

  TEST_CASE("--allow-nonfinite trains on and reports the NaN loss") {
    TrainConfig c = nan_config("ddp", 2);
    c.allow_nonfinite = true;
    Trainer t(c);
    std::vector<StepReport> reports;
    t.run([&](const StepReport& r) { reports.push_back(r); });
    REQUIRE(reports.size() == 4);
    CHECK(std::isfinite(reports[0].loss));
    CHECK(std::isnan(reports[1].loss));
    CHECK(std::isnan(reports[3].loss));  // the NaN reached the parameters through the update
  }

  TEST_CASE("NaN parameters: the first layer whose output is non-finite is named") {
    Model m(ModelSpec::parse("mlp:2,8,8,3"), nullptr, 0);
    std::vector<float> p = m.host_params();
    const int w2 = m.find_parameter("2.weight");
    REQUIRE(w2 >= 0);
    p[static_cast<size_t>(m.parameters()[static_cast<size_t>(w2)].offset + 3)] = std::numeric_limits<float>::quiet_NaN();
    m.upload_params(p.data());
    std::vector<float> x = {0.5f, -0.25f, 1.0f, 2.0f};
    m.forward(x.data(), 2);
    const NonFiniteSite site = find_nonfinite(m);
    CHECK(site.kind == NonFiniteSite::LayerOutput);
    CHECK(site.layer == 2);
    const NonFiniteSite back = NonFiniteSite::decode(site.code());
    CHECK(back.kind == site.kind);
    CHECK(back.layer == site.layer);
    const std::string msg = nonfinite_stop_message(5, std::nan(""), 3, site, m);
    CHECK(msg.rfind("training stopped at step 5: the loss became nan on rank 3, where layer 2 (Linear 8->8) is the first "
                    "layer whose output is non-finite", 0) == 0);
    // A finite forward: the loss overflowed (or an earlier micro-batch went bad).
    p = Model(ModelSpec::parse("mlp:2,8,8,3"), nullptr, 0).host_params();
    m.upload_params(p.data());
    m.forward(x.data(), 2);
    CHECK(find_nonfinite(m).kind == NonFiniteSite::Loss);
    CHECK(nonfinite_stop_message(1, INFINITY, -1, find_nonfinite(m), m).rfind("training stopped at step 1: the loss became inf, "
                                                                               "whose forward pass was finite", 0) == 0);
  }

  TEST_CASE("a checkpoint of NaN parameters stops DDP at step 1 naming the layer") {
    test::TempDir dir;
    const std::string ckpt = dir.file("nan.safetensors");
    {
      Model m(ModelSpec::parse("mlp:2,16,16,3"), nullptr, 0);
      std::vector<float> p = m.host_params();
      const int w = m.find_parameter("2.weight");
      p[static_cast<size_t>(m.parameters()[static_cast<size_t>(w)].offset)] = std::numeric_limits<float>::quiet_NaN();
      m.upload_params(p.data());
      save_checkpoint(ckpt, m, 0, {});
    }
    TrainConfig c = nan_config("ddp", 2);
    c.data = "spiral";
    c.init_path = ckpt;
    const Stopped s = run_until_stopped(c);
    INFO(s.message);
    CHECK(s.message.rfind("training stopped at step 1: the loss became nan on rank 0, where layer 2 (Linear 16->16) is "
                          "the first layer whose output is non-finite", 0) == 0);
    CHECK(s.reports.empty());
  }

  TEST_CASE("dtlab-cli: exit 2, one line on stderr, no checkpoint written") {
    test::TempDir dir;
    const std::string out = dir.file("model.safetensors");
    test::CliResult r = test::run_cli({"train", "--strategy", "ddp", "--world", "2", "--model", "mlp:2,16,16,3", "--data",
                                       nan_data(), "--batch", "16", "--steps", "4", "--no-shuffle", "--save", out});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("dtlab-cli: training stopped at step 2: the loss became nan on rank 1", 0) == 0);
    CHECK(r.err.find('\n') == r.err.size() - 1);
    CHECK(!std::filesystem::exists(out));
    r = test::run_cli({"train", "--strategy", "ddp", "--world", "2", "--model", "mlp:2,16,16,3", "--data", nan_data(),
                       "--batch", "16", "--steps", "4", "--no-shuffle", "--allow-nonfinite"});
    CHECK(r.code == 0);
  }
}
