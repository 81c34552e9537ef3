// Gradient clipping (--clip-grad-norm, engine/train/grad_clip.h) and Join for uneven inputs (--join,
// --uneven-rank; docs/course_sources.md §19), the course's lesson 28 made live: clipping equals a
// hand-computed torch.nn.utils.clip_grad_norm_ on one rank, and every strategy that spreads the
// gradient over ranks (ddp, fsdp, pipeline, tp, dp, mixed precision, LoRA) clips to the one-rank
// result, so its norm is the whole model's.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/ops.h"
#include "engine/trace/export.h"
#include "engine/train/compose.h"
#include "engine/train/grad_clip.h"
#include "engine/train/train.h"
#include "tests/cli_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// SGD without momentum: the update is lr x the (clipped) gradient, so the gradient can be read back
// from the parameters and a clipping error shows undamped.
TrainConfig clip_config(const std::string& strategy, int world, int64_t batch, int64_t steps, double max_norm) {
  TrainConfig c = test::demo_config(strategy, world, batch, steps);
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  c.clip_grad_norm = max_norm;
  c.timeout_s = 20;
  return c;
}

struct ClipRun {
  std::vector<float> params;  // the result model's, on the host
  std::vector<double> norms;  // each step's reported norm before clipping
  std::vector<double> coefs;
};

ClipRun run_clipped(const TrainConfig& c) {
  Trainer t(c);
  ClipRun r;
  t.run([&](const StepReport& s) {
    r.norms.push_back(s.grad_norm);
    r.coefs.push_back(s.clip_coef);
  });
  r.params = t.result_model().host_params();
  return r;
}


// The strategy's run against the one-rank reference: the same norms (relative `rtol`) every step,
// each one clipped (coefficient below 1), and the same final parameters (within `atol`).
void check_like_reference(const ClipRun& got, const ClipRun& want, double rtol, double atol) {
  REQUIRE(got.norms.size() == want.norms.size());
  for (size_t s = 0; s < want.norms.size(); s++) {
    CAPTURE(s);
    CHECK(want.coefs[s] < 1.0);
    CHECK(got.norms[s] == doctest::Approx(want.norms[s]).epsilon(rtol));
  }
  CHECK(test::max_abs_diff(got.params, want.params) <= atol);
}

// The uneven-inputs run of lesson 28: 4 DDP ranks, rank 3's data running out after 2 of 3 steps; SGD
// without momentum, so the last step's update is lr x the averaged gradient.
TrainConfig uneven_config(bool join) {
  TrainConfig c = test::demo_config("ddp", 4, 16, 3);
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  c.uneven_rank = 3;
  c.join = join;
  c.timeout_s = join ? 20 : 0.5;
  return c;
}

// Rank r's mean cross-entropy gradient at `params` on its DistributedSampler batch of step `step`.
std::vector<float> rank_gradient(const TrainConfig& c, const Dataset& data, const std::vector<float>& params, int rank, int step) {
  RankBatches batches(c, data, c.world_size, rank);
  const Batch* b = nullptr;
  for (int s = 0; s < step; s++) b = &batches.next();
  Model m(c.model, nullptr, c.seed);
  std::copy(params.begin(), params.end(), m.params());
  m.zero_grad();
  const int64_t B = b->size, C = c.model.out_features();
  const float* logits = m.forward(b->x.data(), B);
  std::vector<float> probs(static_cast<size_t>(B * C)), dl(probs.size());
  cross_entropy_forward(probs.data(), logits, b->y.data(), B, C);
  cross_entropy_backward(dl.data(), probs.data(), b->y.data(), B, C, 1.0f / static_cast<float>(B));
  m.backward(dl.data());
  return std::vector<float>(m.grads(), m.grads() + m.num_params());
}

}  // namespace

TEST_SUITE("clip_join") {
  TEST_CASE("clip_coefficient is torch's: max_norm over the norm plus 1e-6, never above 1") {
    CHECK(clip_coefficient(10.0, 1.0) == doctest::Approx(1.0 / (10.0 + 1e-6)));
    CHECK(clip_coefficient(0.5, 1.0) == 1.0f);
    CHECK(clip_coefficient(0.0, 1.0) == 1.0f);
  }

  TEST_CASE("single rank clipping equals a hand-computed clip_grad_norm_ of the gradient") {
    // lr 1 without clipping: the parameters move by exactly the gradient, which gives the reference.
    TrainConfig plain = clip_config("single", 1, 64, 1, 0);
    plain.optimizer.lr = 1.0;
    Trainer t0(plain);
    const std::vector<float> before = t0.result_model().host_params();
    t0.run();
    const std::vector<float> after = t0.result_model().host_params();
    double sq = 0;
    std::vector<double> grad(before.size());
    for (size_t i = 0; i < before.size(); i++) grad[i] = double(before[i]) - double(after[i]), sq += grad[i] * grad[i];
    const double norm = std::sqrt(sq);
    const double max_norm = norm / 4;  // clipping is active: every gradient scaled by about 1/4
    const double coef = max_norm / (norm + 1e-6);

    TrainConfig clipped = plain;
    clipped.clip_grad_norm = max_norm;
    const ClipRun r = run_clipped(clipped);
    REQUIRE(r.norms.size() == 1);
    CHECK(r.norms[0] == doctest::Approx(norm).epsilon(1e-5));
    CHECK(r.coefs[0] == doctest::Approx(coef).epsilon(1e-6));
    double worst = 0;
    for (size_t i = 0; i < before.size(); i++) worst = std::max(worst, std::fabs(double(r.params[i]) - (before[i] - coef * grad[i])));
    CHECK(worst <= 1e-6);  // float32 parameters of magnitude ~1: a few ulps

    // A max_norm above the norm leaves the step as it was.
    clipped.clip_grad_norm = norm * 2;
    const ClipRun loose = run_clipped(clipped);
    CHECK(loose.coefs[0] == 1.0);
    CHECK(test::max_abs_diff(loose.params, after) == 0.0);
  }

  TEST_CASE("ddp, fsdp, dp, pipeline and tp clip with the whole model's norm, like one rank") {
    const double max_norm = 0.05;
    const ClipRun ref = run_clipped(clip_config("single", 1, 64, 3, max_norm));
    // float32 sums in another order, and FSDP1's one-float all-reduce of the squares: 1e-5.
    SUBCASE("ddp") { check_like_reference(run_clipped(clip_config("ddp", 4, 16, 3, max_norm)), ref, 1e-5, 1e-5); }
    SUBCASE("dp") { check_like_reference(run_clipped(clip_config("dp", 4, 16, 3, max_norm)), ref, 1e-5, 1e-5); }
    SUBCASE("fsdp, every sharding") {
      for (Sharding s : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::NoShard, Sharding::Zero1}) {
        CAPTURE(sharding_name(s));
        TrainConfig c = clip_config("fsdp", 4, 16, 3, max_norm);
        c.fsdp.sharding = s;
        check_like_reference(run_clipped(c), ref, 1e-5, 1e-5);
      }
    }
    SUBCASE("fsdp hybrid: the second node's copies are not counted twice") {
      TrainConfig c = clip_config("fsdp", 4, 16, 3, max_norm);
      c.fsdp.sharding = Sharding::Hybrid;
      c.fsdp.node_size = 2;
      check_like_reference(run_clipped(c), ref, 1e-5, 1e-5);
    }
    SUBCASE("pipeline: the stages' squares summed, with and without replicas") {
      TrainConfig c = clip_config("pipeline", 2, 64, 3, max_norm);
      c.pipeline.stages = 2;
      check_like_reference(run_clipped(c), ref, 1e-5, 1e-5);
      TrainConfig d = clip_config("pipeline", 4, 32, 3, max_norm);
      d.pipeline.stages = 2;
      d.pipeline.dp = 2;
      check_like_reference(run_clipped(d), ref, 1e-5, 1e-5);
    }
    SUBCASE("tp: split parameters summed over the TP group, the replicated last Linear counted once") {
      TrainConfig c = clip_config("ddp", 2, 64, 3, max_norm);
      c.tp = 2;
      check_like_reference(run_clipped(c), ref, 1e-5, 1e-5);
      TrainConfig f = clip_config("fsdp", 4, 32, 3, max_norm);
      f.tp = 2;
      check_like_reference(run_clipped(f), ref, 1e-5, 1e-5);
      TrainConfig p = clip_config("pipeline", 4, 64, 3, max_norm);
      p.pipeline.stages = 2;
      p.tp = 2;
      check_like_reference(run_clipped(p), ref, 1e-5, 1e-5);
    }
  }

  TEST_CASE("every rank records each step's norm and factor in the trace") {
    TrainConfig c = clip_config("fsdp", 2, 32, 2, 0.05);
    Trainer t(c);
    const test::Trained run = test::train(t);
    for (int rank = 0; rank < 2; rank++) {
      CAPTURE(rank);
      std::vector<double> norms;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind != EventKind::GradClip) continue;
        norms.push_back(e.clip.total_norm);
        CHECK(e.clip.coef < 1.0f);
      }
      REQUIRE(norms.size() == 2);
      for (size_t s = 0; s < norms.size(); s++) CHECK(norms[s] == run.steps[s].grad_norm);  // one norm on every rank
      CHECK(chrome_trace_json(t.recorder().events(rank)).find("\"clip grad norm\"") != std::string::npos);
    }
  }

  TEST_CASE("mixed precision clips the unscaled float32 gradient, and LoRA only the adapters") {
    const double max_norm = 0.05;
    SUBCASE("bf16 and fp16 against float32: the norm within the dtype's rounding") {
      const ClipRun ref = run_clipped(clip_config("single", 1, 64, 3, max_norm));
      for (Precision p : {Precision::BF16, Precision::FP16}) {
        CAPTURE(precision_name(p));
        TrainConfig c = clip_config("single", 1, 64, 3, max_norm);
        c.precision = p;
        const ClipRun one = run_clipped(c);
        // 16-bit parameters and gradients: bf16 keeps 8 bits of mantissa (rtol 1.6e-2), fp16 11.
        const double rtol = p == Precision::BF16 ? 2e-2 : 2e-3;
        for (size_t s = 0; s < ref.norms.size(); s++) CHECK(one.norms[s] == doctest::Approx(ref.norms[s]).epsilon(rtol));
        CHECK(test::max_abs_diff(one.params, ref.params) <= 2e-2);
        // ddp and fsdp in the same dtype clip to the one-rank 16-bit run.
        for (const char* strategy : {"ddp", "fsdp"}) {
          CAPTURE(strategy);
          TrainConfig d = clip_config(strategy, 4, 16, 3, max_norm);
          d.precision = p;
          const ClipRun got = run_clipped(d);
          for (size_t s = 0; s < one.norms.size(); s++) CHECK(got.norms[s] == doctest::Approx(one.norms[s]).epsilon(rtol));
          CHECK(test::max_abs_diff(got.params, one.params) <= 2e-2);
        }
      }
    }
    SUBCASE("LoRA: the adapters' norm, the same on 4 ddp ranks as on one") {
      TrainConfig c = clip_config("single", 1, 64, 3, 0.005);
      c.lora.rank = 4;
      const ClipRun one = run_clipped(c);
      TrainConfig d = clip_config("ddp", 4, 16, 3, 0.005);
      d.lora.rank = 4;
      check_like_reference(run_clipped(d), one, 1e-5, 1e-5);
    }
  }

  TEST_CASE("dtlab-cli train prints the norm each step, and refuses a negative or NaN max norm") {
    const test::CliResult r = test::run_cli({"train", "--strategy", "fsdp", "--world", "2", "--steps", "2", "--clip-grad-norm", "0.05"});
    CHECK(r.code == 0);
    CHECK(r.out.find("grad norm ") != std::string::npos);
    CHECK(r.out.find("clipped x") != std::string::npos);
    const test::CliResult j = test::run_cli({"train", "--steps", "1", "--clip-grad-norm", "100", "--json"});
    CHECK(j.out.find("\"grad_norm\"") != std::string::npos);
    for (const char* bad : {"-1", "nan", "inf"}) {
      CAPTURE(bad);
      const test::CliResult e = test::run_cli({"train", "--steps", "1", "--clip-grad-norm", bad});
      CHECK(test::one_sentence_usage_error(e));
      CHECK(e.err.find("--clip-grad-norm") != std::string::npos);
    }
  }

  TEST_CASE("uneven inputs without --join hang in the next all-reduce and the watchdog names the rank") {
    Trainer t(uneven_config(false));
    std::string error;
    try {
      t.run();
    } catch (const std::exception& e) {
      error = e.what();
    }
    CAPTURE(error);
    CHECK(error.find("rank 3") != std::string::npos);
  }

  TEST_CASE("--join: the rank that ran out shadows with zeros, the last step divides by the whole world") {
    // Steps 1 and 2 are plain DDP on 4 ranks; in step 3 ranks 0-2 average (g0 + g1 + g2 + 0) / 4.
    TrainConfig two = uneven_config(false);
    two.uneven_rank = -1;
    two.steps = 2;
    Trainer t2(two);
    t2.run();
    const std::vector<float> p2 = t2.rank_model(0).host_params();
    std::vector<double> g(p2.size(), 0.0);
    for (int r = 0; r < 3; r++) {
      const std::vector<float> gr = rank_gradient(two, t2.dataset(), p2, r, 3);
      for (size_t i = 0; i < g.size(); i++) g[i] += gr[i];
    }
    TrainConfig c = uneven_config(true);
    Trainer t(c);
    const test::Trained run = test::train(t);
    REQUIRE(run.steps.size() == 3);
    CHECK(run.steps[2].samples == 3 * c.batch);  // the joined rank adds no samples
    for (int r = 0; r < 4; r++) {  // DDP's post-hook: every rank ends with the last joiners' model
      CAPTURE(r);
      const std::vector<float> got = t.rank_model(r).host_params();
      double worst = 0;
      for (size_t i = 0; i < g.size(); i++)
        worst = std::max(worst, std::fabs(double(got[i]) - (double(p2[i]) - c.optimizer.lr * g[i] / 4.0)));
      CHECK(worst <= 1e-6);
    }
  }

  TEST_CASE("--join and --uneven-rank are DDP's, and refused with one sentence elsewhere") {
    TrainConfig c = uneven_config(false);
    c.strategy = Strategy::Fsdp;
    CHECK(test::error_of(c).find("--uneven-rank is DDP's") != std::string::npos);
    c.join = true;  // the capability table's rule: FSDP is not Joinable
    CHECK(test::error_of(c) == feature_refusal(c, Feature::Join));
    CHECK(test::error_of(c).rfind("--join with --strategy fsdp: torch's Join shadows the collectives of a Joinable", 0) == 0);
    TrainConfig far = uneven_config(true);
    far.uneven_rank = 4;
    CHECK(test::error_of(far).find("is not a rank of this world") != std::string::npos);
    const test::CliResult r = test::run_cli({"train", "--strategy", "fsdp", "--world", "2", "--steps", "2", "--join"});
    CHECK(test::one_sentence_usage_error(r));
    // The experts' all-to-alls are not DDP's: a joined rank would leave its EP group waiting.
    const test::CliResult e = test::run_cli({"train", "--model", "gpt-tiny", "--moe", "experts=4,top_k=2", "--strategy", "ddp", "--world", "2", "--ep", "2",
                                             "--steps", "2", "--uneven-rank", "1", "--join"});
    CHECK(test::one_sentence_usage_error(e));
    CHECK(e.err.find("--join with --ep: the experts' all-to-alls need a token count from every rank") != std::string::npos);
  }

  TEST_CASE("--join composes: a replica under --tp or --cp runs out whole, and 16-bit gradients and find_unused_parameters are shadowed too") {
    // Under --tp 2 (or --cp 2) on 4 ranks, --uneven-rank 1 is replica 0's rank: ranks 0 and 1 read
    // the same batches, so both run out, and each shadows DDP over its own DP group. Step 3 then
    // averages (0 + g1) / 2: what 2 DDP ranks with --uneven-rank 0 compute.
    // 2 DDP ranks, rank 0 running out, against 4 ranks in 2 replicas of 2 (tp or cp), rank 1 running out.
    auto joined_like_two_ranks = [](TrainConfig ref, int tp, int cp) {
      ref.world_size = 2;
      ref.uneven_rank = 0;
      Trainer r(ref);
      r.run();
      TrainConfig c = ref;
      c.world_size = 4;
      c.tp = tp;
      c.sequence_parallel = tp > 1;
      c.cp = cp;
      c.uneven_rank = 1;
      Trainer t(c);
      const test::Trained run = test::train(t);
      REQUIRE(run.steps.size() == 3);
      CHECK(run.steps[2].samples == c.batch * c.model.rows_per_sample());  // one replica of two trained the last step
      CHECK(test::max_abs_diff(t.result_model().merged_params(), r.result_model().merged_params()) < 1e-5);
    };
    SUBCASE("--tp 2: the replica's TP ranks join together, and end with the last joiners' shards") {
      TrainConfig ref = uneven_config(true);
      ref.model = ModelSpec::parse("mlp:2,32,32,32,32,3");
      joined_like_two_ranks(ref, 2, 1);
    }
    SUBCASE("--cp 2: the CP group's ranks join together (a GPT)") {
      TrainConfig ref = uneven_config(true);
      ref.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      ref.data = "text";
      ref.eval_samples = 256;
      ref.batch = 4;
      joined_like_two_ranks(ref, 1, 2);
    }
    SUBCASE("bf16 and fp16: every rank ends with the last joiners' 16-bit model, within the dtype's rounding of float32's") {
      TrainConfig f32 = uneven_config(true);
      Trainer exact(f32);
      exact.run();
      for (Precision p : {Precision::BF16, Precision::FP16}) {
        CAPTURE(precision_name(p));
        TrainConfig c = uneven_config(true);
        c.precision = p;
        Trainer t(c);
        t.run();
        const std::vector<float> mine = t.rank_model(0).host_params();
        for (int r = 1; r < 4; r++) CHECK(test::max_abs_diff(t.rank_model(r).host_params(), mine) == 0.0);  // the rank that joined early (3) too
        CHECK(test::max_abs_diff(mine, exact.rank_model(0).host_params()) <= (p == Precision::BF16 ? 2e-2 : 2e-3));
      }
    }
    SUBCASE("find_unused_parameters: the joined rank all-reduces a map of zeros after the buckets, and the numbers do not change") {
      Trainer plain(uneven_config(true));
      plain.run();
      TrainConfig c = uneven_config(true);
      c.ddp.find_unused_parameters = true;
      Trainer t(c);
      t.run();
      // (Sized buckets from the start, so each element's ring sum may run in another order: the last bit.)
      for (int r = 0; r < 4; r++) CHECK(test::max_abs_diff(t.rank_model(r).host_params(), plain.rank_model(r).host_params()) <= 1e-7);
      const int64_t P = static_cast<int64_t>(t.model().parameters().size());
      for (int r = 0; r < 4; r++) {
        CAPTURE(r);
        int maps = 0;
        for (const Event& e : t.recorder().events(r))
          maps += e.kind == EventKind::Collective && e.iteration == 2 && e.coll.op == CollectiveOp::AllReduce && e.coll.in_count == P &&
                  e.coll.bytes == 4 * P;
        CHECK(maps == 1);  // rank 3's is the join hook's zeros
      }
    }
  }
}
