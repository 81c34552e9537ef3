// The single-rank training loop (engine/train): the README demo reaches its accuracy, runs are
// bit-reproducible, step/epoch/batch counts follow a torch DataLoader, the memory tracker's peaks
// match the arithmetic per optimizer, and checkpoints continue a run.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "tests/test_util.h"
#include "tests/train_util.h"
#include "engine/core/check.h"
#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/train/train.h"

namespace fs = std::filesystem;
using namespace dtlab;

namespace {

constexpr int64_t kSpiralN = 3000;  // "spiral": 3 classes x 1000 points

// The README demo, on one rank with batches of 64.
TrainConfig demo_config(int64_t steps = 300) { return test::demo_config("single", 1, 64, steps); }

TrainConfig sgd_config(double momentum, int64_t steps) {
  TrainConfig c = demo_config(steps);
  c.optimizer.kind = OptimizerKind::SGD;
  c.optimizer.lr = 0.1;
  c.optimizer.weight_decay = 0.0;
  c.optimizer.momentum = momentum;
  return c;
}

struct Run {
  TrainSummary summary;
  std::vector<StepReport> reports;
};

Run train(const TrainConfig& c) {
  Trainer t(c);
  Run r;
  r.summary = t.run([&](const StepReport& s) { r.reports.push_back(s); });
  return r;
}

std::vector<uint32_t> loss_bits(const Run& r) {
  std::vector<uint32_t> v;
  for (const auto& s : r.reports) v.push_back(std::bit_cast<uint32_t>(s.loss));
  return v;
}

using dtlab::test::TempDir;

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("BLAS threads: one when several ranks share the machine, as torchrun sets, and --threads wins") {
    // The environment decides when it names a count (the TSan stage sets OPENBLAS_NUM_THREADS=1).
    const bool env = std::getenv("OPENBLAS_NUM_THREADS") != nullptr || std::getenv("OMP_NUM_THREADS") != nullptr;
    set_compute_threads(0);
    const int library = compute_threads();
    {
      Trainer t(test::demo_config("ddp", 4, 16, 1));
      CHECK(compute_threads() == (env ? library : 1));
    }
    {
      TrainConfig c = test::demo_config("ddp", 2, 16, 1);
      c.threads = 3;
      Trainer t(c);
      CHECK(compute_threads() == 3);
    }
    {
      Trainer t(demo_config(1));  // one rank: the library's choice again
      CHECK(compute_threads() == library);
    }
  }

  TEST_CASE("README demo: mlp:2,64,64,3 on spiral reaches 95% in 300 steps") {
    Trainer t(demo_config());
    CHECK(t.total_steps() == 300);
    CHECK(t.batches_per_epoch() == 47);
    CHECK(t.dataset().n == kSpiralN);
    Run r;
    r.summary = t.run([&](const StepReport& s) { r.reports.push_back(s); });
    const TrainSummary& s = r.summary;
    CHECK(s.steps == 300);
    CHECK(s.start_step == 0);
    CHECK(s.eval_samples == kSpiralN);
    CHECK(s.eval_correct == std::llround(s.eval_accuracy * kSpiralN));
    CHECK(s.eval_accuracy >= 0.95);
    CHECK(s.eval_loss < 0.2f);
    REQUIRE(r.reports.size() == 300);
    for (size_t i = 0; i < r.reports.size(); i++) {
      CHECK(r.reports[i].step == static_cast<int64_t>(i) + 1);
      CHECK(r.reports[i].total_steps == 300);
      CHECK(std::isfinite(r.reports[i].loss));
    }
    CHECK(r.reports.back().epoch == 6);  // 300 steps = 6 full epochs of 47 batches + 18
  }

  TEST_CASE("the same config twice gives bit-identical losses") {
    Run a = train(demo_config());
    Run b = train(demo_config());
    REQUIRE(a.reports.size() == 300);
    CHECK(loss_bits(a) == loss_bits(b));
    CHECK(std::bit_cast<uint32_t>(a.summary.eval_loss) == std::bit_cast<uint32_t>(b.summary.eval_loss));
    CHECK(a.summary.eval_correct == b.summary.eval_correct);

    TrainConfig other = demo_config();
    other.seed = 1;  // different init and shuffle: different losses
    CHECK(loss_bits(train(other)) != loss_bits(a));
  }

  TEST_CASE("--epochs: steps follow the DataLoader's batches per epoch") {
    TrainConfig c = demo_config(0);
    c.epochs = 2;
    const int64_t per_epoch = (kSpiralN + 63) / 64;  // ceil(3000 / 64) = 47
    Trainer t(c);
    CHECK(t.batches_per_epoch() == per_epoch);
    CHECK(t.total_steps() == 2 * per_epoch);
    Run r;
    r.summary = t.run([&](const StepReport& s) { r.reports.push_back(s); });
    CHECK(r.summary.steps == 2 * per_epoch);
    CHECK(r.summary.epochs_started == 2);
    REQUIRE(r.reports.size() == static_cast<size_t>(2 * per_epoch));
    int64_t samples[2] = {0, 0};
    for (size_t i = 0; i < r.reports.size(); i++) {
      const int64_t epoch = static_cast<int64_t>(i) / per_epoch;
      CHECK(r.reports[i].epoch == epoch);
      samples[epoch] += r.reports[i].batch_size;
    }
    CHECK(samples[0] == kSpiralN);  // every sample once per epoch
    CHECK(samples[1] == kSpiralN);
  }

  TEST_CASE("without drop_last the last batch of each epoch is partial") {
    TrainConfig c = demo_config(0);
    c.epochs = 2;
    Run r = train(c);
    REQUIRE(r.reports.size() == 94);
    for (size_t i = 0; i < r.reports.size(); i++) {
      const bool last_of_epoch = (i + 1) % 47 == 0;
      CHECK(r.reports[i].batch_size == (last_of_epoch ? kSpiralN % 64 : 64));  // 3000 % 64 = 56
    }
    CHECK(r.reports[46].batch_size == 56);
    CHECK(r.reports[93].batch_size == 56);
  }

  TEST_CASE("drop_last: floor(n / B) full batches per epoch") {
    TrainConfig c = demo_config(0);
    c.epochs = 2;
    c.drop_last = true;
    Trainer t(c);
    CHECK(t.batches_per_epoch() == kSpiralN / 64);  // 46
    CHECK(t.total_steps() == 2 * (kSpiralN / 64));
    Run r;
    r.summary = t.run([&](const StepReport& s) { r.reports.push_back(s); });
    CHECK(r.summary.epochs_started == 2);
    REQUIRE(r.reports.size() == 92);
    for (const auto& s : r.reports) CHECK(s.batch_size == 64);
    CHECK(r.reports[45].epoch == 0);
    CHECK(r.reports[46].epoch == 1);

    SUBCASE("--steps running past an epoch starts the next one") {
      TrainConfig d = demo_config(47);
      d.drop_last = true;
      Run q = train(d);
      CHECK(q.summary.epochs_started == 2);
      CHECK(q.reports.back().epoch == 1);
      CHECK(q.reports.back().batch_size == 64);
    }
  }

  TEST_CASE("SGD with momentum trains") {
    Run m = train(sgd_config(0.9, 300));
    REQUIRE(m.reports.size() == 300);
    const float first = m.reports.front().loss;
    CHECK(first > 0.9f);  // about ln(3) at init
    CHECK(m.reports.back().loss < 0.5f * first);
    CHECK(m.summary.eval_loss < 0.3f * first);
    CHECK(m.summary.eval_accuracy > 0.9);

    Run plain = train(sgd_config(0.0, 300));
    CHECK(plain.reports.front().loss == first);  // same init, same first batch
    CHECK(m.summary.eval_loss < plain.summary.eval_loss);
  }

  TEST_CASE("memory peaks: parameters, gradients and optimizer state per optimizer") {
    const int64_t P = ModelSpec::parse("mlp:2,64,64,3").num_params();
    CHECK(P == 2 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3);

    struct Case {
      const char* name;
      TrainConfig cfg;
      int64_t state_bytes;
    };
    const Case cases[] = {{"adamw", demo_config(3), 8 * P},
                          {"sgd momentum", sgd_config(0.9, 3), 4 * P},
                          {"plain sgd", sgd_config(0.0, 3), 0}};
    for (const Case& k : cases) {
      INFO("optimizer: ", k.name);
      Trainer t(k.cfg);
      CHECK(t.model().num_params() == P);
      // Optimizer state appears lazily, on the first step, as in torch.
      CHECK(t.memory().stats().peak_of(MemCategory::OptimizerState) == 0);
      TrainSummary s = t.run();
      const MemoryStats& m = s.memory;
      CHECK(m.peak_of(MemCategory::Parameters) == 4 * P);
      CHECK(m.peak_of(MemCategory::Gradients) == 4 * P);
      CHECK(m.peak_of(MemCategory::OptimizerState) == k.state_bytes);
      CHECK(m.peak_of(MemCategory::Activations) > 0);
      CHECK(m.total_peak >= 8 * P + k.state_bytes + m.current_of(MemCategory::Activations));
      CHECK(m.total_peak <= std::accumulate(m.peak.begin(), m.peak.end(), int64_t{0}));
    }
  }

  TEST_CASE("shuffle=false: the first batch is rows 0..63") {
    SUBCASE("DataLoader over a one-rank sampler") {
      Dataset ds = make_dataset("spiral", 2, 3);
      DistributedSampler sampler(SamplerConfig{.n = ds.n, .world_size = 1, .rank = 0, .shuffle = false,
                                               .seed = 0, .drop_last = false});
      DataLoader loader(ds, sampler, 64, false);
      CHECK(loader.num_batches() == 47);
      Batch b;
      REQUIRE(loader.next(b));
      std::vector<int64_t> want(64);
      std::iota(want.begin(), want.end(), int64_t{0});
      CHECK(b.indices == want);
      CHECK(std::memcmp(b.x.data(), ds.x.data(), 64 * 2 * sizeof(float)) == 0);
      CHECK(std::vector<int64_t>(ds.y.begin(), ds.y.begin() + 64) == b.y);
    }
    SUBCASE("Trainer: step 1's loss is the initial model's loss on rows 0..63") {
      TrainConfig c = demo_config(1);
      c.shuffle = false;
      Trainer t(c);
      const Dataset& full = t.dataset();
      Dataset head;
      head.name = "head";
      head.n = 64;
      head.d = full.d;
      head.num_classes = full.num_classes;
      head.x.assign(full.x.begin(), full.x.begin() + 64 * full.d);
      head.y.assign(full.y.begin(), full.y.begin() + 64);
      const float expect = evaluate(t.model(), head, 64).loss;
      Run r;
      r.summary = t.run([&](const StepReport& s) { r.reports.push_back(s); });
      REQUIRE(r.reports.size() == 1);
      CHECK(r.reports[0].batch_size == 64);
      CHECK(std::bit_cast<uint32_t>(r.reports[0].loss) == std::bit_cast<uint32_t>(expect));

      // Shuffled (the default), the first batch is a different set of rows.
      Run shuffled = train(demo_config(1));
      CHECK(shuffled.reports[0].loss != r.reports[0].loss);
    }
  }

  TEST_CASE("save_path and init_path continue a run") {
    TempDir dir;
    const std::string path = (dir.path / "run.safetensors").string();
    TrainConfig c = demo_config(20);
    c.save_path = path;
    Trainer first(c);
    first.run();
    REQUIRE(fs::exists(path));

    TrainConfig d = demo_config(1);
    d.init_path = path;
    Trainer second(d);
    const Model& a = first.model();
    Model& b = second.model();
    REQUIRE(b.num_params() == a.num_params());
    CHECK(std::memcmp(b.params(), a.params(), static_cast<size_t>(a.num_params()) * sizeof(float)) == 0);
    TrainSummary s = second.run();
    CHECK(s.start_step == 20);
    CHECK(s.steps == 1);
  }

  TEST_CASE("bad configurations throw dtlab::Error before any step") {
    auto rejects = [](TrainConfig c, const char* why) {
      INFO(why);
      CHECK_THROWS_AS(Trainer{c}, Error);
    };
    TrainConfig c = demo_config(1);
    c.strategy = Strategy::Pipeline;
    rejects(c, "strategy");
    c = demo_config(1);
    c.world_size = 2;
    rejects(c, "world_size");
    c = demo_config(1);
    c.batch = 0;
    rejects(c, "batch 0");
    c = demo_config(0);
    rejects(c, "neither steps nor epochs");
    c = demo_config(5);
    c.epochs = 1;
    rejects(c, "both steps and epochs");
    c = demo_config(1);
    c.optimizer.lr = 0;
    rejects(c, "lr 0");
    c = sgd_config(1.0, 1);
    rejects(c, "momentum 1");
    c = demo_config(1);
    c.optimizer.weight_decay = -1;
    rejects(c, "negative weight decay");
    c = demo_config(1);
    c.model = ModelSpec::parse("mlp:3,8,3");
    rejects(c, "3 inputs on 2-D data");
    c = demo_config(1);
    c.batch = 5000;
    c.drop_last = true;
    rejects(c, "drop_last leaves no batch");
    c = demo_config(1);
    c.save_path = (fs::temp_directory_path() / "dtlab_no_such_dir_for_tests" / "x.safetensors").string();
    rejects(c, "save into a missing directory");
  }
}
