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
  c.strategy = parse_strategy(strategy);
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
    CHECK(s.message.rfind("training stopped at step 2 on rank 1: its input batch holds non-finite values", 0) == 0);
    CHECK(s.message.find("--allow-nonfinite") != std::string::npos);
    REQUIRE(s.reports.size() == 1);  // step 1 was finite and reported
    CHECK(std::isfinite(s.reports[0].loss));
  }

  TEST_CASE("the same stop under single, FSDP and the pipeline") {
    {
      const Stopped s = run_until_stopped(nan_config("single", 1));
      INFO(s.message);
      CHECK(s.message.rfind("training stopped at step 3 on rank 0: its input batch holds non-finite values", 0) == 0);
    }
    {
      const Stopped s = run_until_stopped(nan_config("fsdp", 2));
      INFO(s.message);
      CHECK(s.run_stopped);
      CHECK(s.message.rfind("training stopped at step 2 on rank 1: its input batch holds non-finite values", 0) == 0);
    }
    {
      // Two stages, one replica: the replica reads rows in order; its first stage (rank 0) reports
      // the bad batch, and its last stage (rank 1) would have computed the loss.
      TrainConfig c = nan_config("pipeline", 2);
      c.pipeline.stages = 2;
      c.pipeline.microbatches = 2;
      const Stopped s = run_until_stopped(c);
      INFO(s.message);
      CHECK(s.run_stopped);
      CHECK(s.message.rfind("training stopped at step 3 on rank 0: its input batch holds non-finite values", 0) == 0);
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

  TEST_CASE("an infinity the ReLUs hide from the loss still stops the step, an overflowing last update stops the run") {
    // inf_x.npz: 30 rows, x[0][0] = +inf. With seed 0 every first-layer weight on feature 0 is
    // negative, so the ReLUs turn the infinities into zeros and the loss is finite, but the weight
    // gradient is inf x 0 = NaN: the update would poison every parameter.
    TrainConfig c = nan_config("single", 1);
    c.model = ModelSpec::parse("mlp:2,4,3");
    c.data = std::string(DTLAB_SOURCE_DIR) + "/tests/data/inf_x.npz";
    c.batch = 30;
    c.steps = 1;
    Stopped s = run_until_stopped(c);
    INFO(s.message);
    CHECK(s.message.rfind("training stopped at step 1 on rank 0: its input batch holds non-finite values", 0) == 0);
    c.allow_nonfinite = true;  // what used to happen: a finite loss, NaN parameters, exit 0
    {
      Trainer t(c);
      std::vector<float> loss;
      t.run([&](const StepReport& r) { loss.push_back(r.loss); });
      REQUIRE(loss.size() == 1);
      CHECK(std::isfinite(loss[0]));
      const std::vector<float> p = t.model().host_params();
      CHECK(has_nonfinite(p.data(), static_cast<int64_t>(p.size())));
    }
    // A learning rate beyond float's range: step 1's loss is finite (computed before the update),
    // the update is not. The run stops before --save instead of writing NaN parameters.
    test::TempDir dir;
    TrainConfig big = nan_config("ddp", 2);
    big.data = "spiral";
    big.steps = 1;
    big.optimizer.lr = 1e39;
    big.save_path = dir.file("m.safetensors");
    s = run_until_stopped(big);
    INFO(s.message);
    CHECK(s.run_stopped);
    CHECK(s.message.rfind("training ended after step 1 with non-finite values in 0.weight", 0) == 0);
    CHECK(!std::filesystem::exists(big.save_path));
  }

  // Finite parameters, finite step losses, but the last update made the weights so large that the
  // forward overflows: the loss over the training set is NaN. It once ended with exit 0 and saved.
  TEST_CASE("a NaN loss over the training set after the last step stops the run before --save") {
    test::TempDir dir;
    const std::string out = dir.file("m.safetensors");
    const std::vector<std::string> args = {"train", "--lr", "1e5", "--optimizer", "sgd", "--steps", "3", "--save", out};
    test::CliResult r = test::run_cli(args);
    INFO(r.out << r.err);
    CHECK(r.code == 2);
    CHECK(r.err == "dtlab-cli: training ended after step 3 with a NaN loss over the training set: the last update left parameters "
                   "so large that the forward overflows; lower --lr, or pass --allow-nonfinite to keep them\n");
    CHECK(r.out.find("step 3/3") != std::string::npos);  // every step's own loss was finite
    CHECK(!std::filesystem::exists(out));
    std::vector<std::string> allowed = args;
    allowed.push_back("--allow-nonfinite");
    r = test::run_cli(allowed);
    CHECK(r.code == 0);
    CHECK(std::filesystem::exists(out));
  }

  TEST_CASE("dtlab-cli: exit 2, one line on stderr, no checkpoint written") {
    test::TempDir dir;
    const std::string out = dir.file("model.safetensors");
    test::CliResult r = test::run_cli({"train", "--strategy", "ddp", "--world", "2", "--model", "mlp:2,16,16,3", "--data",
                                       nan_data(), "--batch", "16", "--steps", "4", "--no-shuffle", "--save", out});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.err.rfind("dtlab-cli: training stopped at step 2 on rank 1: its input batch holds non-finite values", 0) == 0);
    CHECK(r.err.find('\n') == r.err.size() - 1);
    CHECK(!std::filesystem::exists(out));
    r = test::run_cli({"train", "--strategy", "ddp", "--world", "2", "--model", "mlp:2,16,16,3", "--data", nan_data(),
                       "--batch", "16", "--steps", "4", "--no-shuffle", "--allow-nonfinite"});
    CHECK(r.code == 0);
  }
}
