// DistributedDataParallel (engine/parallel/ddp): torch's bucket assignment, equivalence with one rank
// on the combined batch (with and without accumulation), the unused-parameter stall and its
// diagnosis, memory arithmetic, the reducer's events, and the construction-time checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/comm/threads_backend.h"
#include "engine/core/check.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/ddp.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

using Buckets = std::vector<std::vector<int>>;

// mlp:2,64,64,3 as torch lays it out: 0.weight 512 B, 0.bias 256 B, 2.weight 16384 B, 2.bias 256 B,
// 4.weight 768 B, 4.bias 12 B (18188 B in all).
const std::vector<int64_t> kMlpBytes = {512, 256, 16384, 256, 768, 12};

TrainConfig ddp_config(int world, int64_t batch, int64_t steps) {
  TrainConfig c = test::demo_config("ddp", world, batch, steps);
  c.seed = 3;
  // Small caps so the 18 KB model spreads over several buckets and their all-reduces overlap.
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
  c.timeout_s = 20;
  return c;
}

using test::for_each_reference_case;
using test::max_abs_diff;
using test::single_like;
using test::train;
using test::Trained;

}  // namespace

TEST_SUITE("ddp") {
  TEST_CASE("bucket assignment follows torch's compute_bucket_assignment_by_size") {
    SUBCASE("the 1 MiB first bucket takes the first parameters, then bucket 0 holds the last") {
      // Walk 0..5 against {1 MiB, 25 MiB}: nothing reaches 1 MiB, so one bucket of everything.
      BucketAssignment a = initial_bucket_assignment(kMlpBytes, kDefaultFirstBucketBytes, kDefaultBucketBytesCap);
      CHECK(a.buckets == Buckets{{0, 1, 2, 3, 4, 5}});
      CHECK(a.size_limits == std::vector<int64_t>{kDefaultFirstBucketBytes});
    }
    SUBCASE("torch 1.13, find_unused_parameters=True, first bucket 600 B, cap 0.01 MB") {
      // Measured with Debian torch 1.13 (bucket_sizes "1036, 16384, 768"): walk 512+256 = 768 >= 600
      // closes {0,1}; 16384 >= 10485 closes {2}; {3,4,5} is left over. Reversed: bucket 0 = {3,4,5}.
      BucketAssignment a = initial_bucket_assignment(kMlpBytes, 600, 10485);
      CHECK(a.buckets == Buckets{{3, 4, 5}, {2}, {0, 1}});
      CHECK(a.size_limits == std::vector<int64_t>{10485, 10485, 600});
    }
    SUBCASE("the rebuild walks the gradient-ready order and keeps it (torch 1.13: '5 4, 3 2, 1 0')") {
      BucketAssignment a = rebuilt_bucket_assignment(kMlpBytes, {5, 4, 3, 2, 1, 0}, 600, 10485);
      CHECK(a.buckets == Buckets{{5, 4}, {3, 2}, {1, 0}});  // 780, 16640 and 768 bytes
      CHECK(a.size_limits == std::vector<int64_t>{600, 10485, 10485});
    }
    SUBCASE("construction: torch's one bucket unless find_unused_parameters (or the lab's sized option)") {
      DdpOptions o;  // find_unused_parameters=False: bucket_size_limits = [sys.maxsize]
      BucketAssignment one = construction_bucket_assignment(kMlpBytes, o);
      CHECK(one.buckets == Buckets{{0, 1, 2, 3, 4, 5}});
      REQUIRE(one.size_limits.size() == 1);
      CHECK(is_unlimited_bucket(one.size_limits[0]));
      o.first_bucket_bytes = 600;
      o.bucket_cap_bytes = 10485;
      for (int variant = 0; variant < 2; variant++) {
        DdpOptions v = o;
        (variant == 0 ? v.find_unused_parameters : v.sized_first_iteration) = true;
        CAPTURE(variant);
        CHECK(construction_bucket_assignment(kMlpBytes, v).buckets == Buckets{{3, 4, 5}, {2}, {0, 1}});
      }
    }
    SUBCASE("an oversized tensor joins the open bucket, which then closes") {
      // Walk: 100 | 5000 >= 1000 closes {0,1}; 5000 >= 4000 closes {2}; 10 + 3000 + 2000 closes
      // {3,4,5}; {6} is left over. 5000 B went into the bucket 100 B had opened: no bucket of its own.
      std::vector<int64_t> bytes = {100, 5000, 5000, 10, 3000, 2000, 8};
      BucketAssignment a = compute_bucket_assignment_by_size(bytes, {1000, 4000});
      CHECK(a.buckets == Buckets{{0, 1}, {2}, {3, 4, 5}, {6}});
      CHECK(a.size_limits == std::vector<int64_t>{1000, 4000, 4000, 4000});
      BucketAssignment r = initial_bucket_assignment(bytes, 1000, 4000);
      CHECK(r.buckets == Buckets{{6}, {3, 4, 5}, {2}, {0, 1}});
    }
    SUBCASE("the limit is reached with >=, and the last limit repeats") {
      BucketAssignment a = compute_bucket_assignment_by_size({4, 4, 4, 4, 4}, {4, 8});
      CHECK(a.buckets == Buckets{{0}, {1, 2}, {3, 4}});
    }
    SUBCASE("an explicit order is not re-sorted") {
      BucketAssignment a = compute_bucket_assignment_by_size({8, 8, 8}, {8}, {2, 0, 1});
      CHECK(a.buckets == Buckets{{2}, {0}, {1}});
    }
  }

  TEST_CASE("bucket all-reduces per iteration equal torch's, measured with Debian's torch 1.13") {
    // tests/ddp_buckets_torch.py measured these with a comm hook on 2 gloo ranks (and re-measures
    // them when torch is installed): mlp:2,512,512,512,3, bytes of each bucket all-reduce.
    using Sizes = std::vector<std::vector<int64_t>>;
    struct Case {
      const char* name;
      bool find_unused;
      int64_t first, cap;
      Sizes want;
    };
    const int64_t MiB = 1 << 20;
    const Case cases[] = {
        // One bucket of every gradient, then the rebuild: {6.b 6.w 4.b 4.w} reaches 1 MiB.
        {"find_unused_parameters=False", false, MiB, 25 * MiB, {{2113548}, {1056780, 1056768}, {1056780, 1056768}}},
        // Sized from the start in reversed model order, never rebuilt.
        {"find_unused_parameters=True", true, MiB, 25 * MiB, {{1058828, 1054720}, {1058828, 1054720}, {1058828, 1054720}}},
        // bucket_cap_mb=1 given: the first bucket is as large as the others.
        {"bucket_cap_mb=1", false, MiB, MiB, {{2113548}, {1056780, 1050624, 6144}, {1056780, 1050624, 6144}}},
    };
    for (const Case& k : cases) {
      CAPTURE(k.name);
      TrainConfig c = ddp_config(2, 16, 3);
      c.model = ModelSpec::parse("mlp:2,512,512,512,3");
      c.ddp = DdpOptions{};
      c.ddp.find_unused_parameters = k.find_unused;
      c.ddp.first_bucket_bytes = k.first;
      c.ddp.bucket_cap_bytes = k.cap;
      Trainer t(c);
      train(t);
      Sizes got(3);
      for (const Event& e : t.recorder().events(0))
        if (e.kind == EventKind::BucketAllReduce && e.iteration >= 0 && e.iteration < 3)
          got[static_cast<size_t>(e.iteration)].push_back(e.bucket.bytes);
      CHECK(got == k.want);
    }
  }

  TEST_CASE("DDP on N ranks equals one rank on the combined batch") {
    for_each_reference_case([](int world) { return ddp_config(world, 16, 20); }, [](const TrainConfig& d, int world, int64_t accum) {
      Trainer ddp(d);
      Trained got = train(ddp);
      // One rank sees the union of the ranks' (micro-)batches: rank r's sampler takes every
      // N-th index of the same permutation, so N x b x A consecutive indices per step.
      Trainer one(single_like(d, 16 * world * accum));
      Trained want = train(one);
      // SGD's update is linear in the gradient: the sums' different order stays rounding-sized. AdamW
      // divides by sqrt(v): a gradient entry that is rounding-sized itself (near zero) can take its
      // step of ~lr in either direction, and once one has, the two runs drift apart by up to about lr
      // (on one machine's -O1 build of world 4 x accum 2: 1.2e-3, in 12% of the parameters; its -O2
      // build stays within 1e-5). So AdamW is held to 4 lr, and its losses to 1e-4.
      const bool adamw = d.optimizer.kind == OptimizerKind::AdamW;
      const std::vector<float> ref = one.model().host_params();
      for (int r = 0; r < world; r++) {
        CAPTURE(r);
        if (!adamw) {
          CHECK(max_abs_diff(ddp.rank_model(r), one.model()) <= 1e-5);
          continue;
        }
        CHECK(max_abs_diff(ddp.rank_model(r).host_params(), ref) <= 4 * d.optimizer.lr);
      }
      REQUIRE(got.steps.size() == want.steps.size());
      for (size_t s = 0; s < got.steps.size(); s++) {
        CHECK(got.steps[s].samples == 16 * world * accum);
        CHECK(got.steps[s].loss == doctest::Approx(want.steps[s].loss).epsilon(adamw ? 1e-4 : 1e-5));
        CHECK(got.steps[s].accuracy == doctest::Approx(want.steps[s].accuracy));
      }
      CHECK(got.summary.effective_batch == 16 * world * accum);
    });
  }

  TEST_CASE("the README's DDP demo reaches 95% on spiral") {
    // dtlab-cli train --strategy ddp --world 4 --model mlp:2,64,64,3 --data spiral --steps 300
    TrainConfig c = ddp_config(4, 64, 300);
    c.seed = 0;
    c.ddp = DdpOptions{};  // torch's default caps
    Trainer t(c);
    TrainSummary s = t.run();
    CHECK(s.eval_accuracy >= 0.95);
    CHECK(s.effective_batch == 256);
  }

  TEST_CASE("gradient_as_bucket_view and static buckets change memory and layout, not the result") {
    TrainConfig base = ddp_config(2, 16, 12);
    Trainer ref(base);
    train(ref);
    for (int variant = 0; variant < 2; variant++) {
      TrainConfig c = base;
      if (variant == 0) c.ddp.gradient_as_bucket_view = true;
      else c.ddp.rebuild_buckets = false;
      CAPTURE(variant);
      Trainer t(c);
      Trained r = train(t);
      CHECK(max_abs_diff(t.model(), ref.model()) <= 1e-6);
      CHECK(r.summary.buckets_rebuilt == (variant == 0));
    }
  }

  TEST_CASE("comm hooks: fp16 and bf16 buckets move half the bytes, and compose with bucket views, 16 bits, accumulation and Join") {
    // tests/comm_hook_torch.py holds the values to torch's fp16_compress_hook; here the bytes, and the
    // options a hook must not break: each variant equals the hook's plain run (or, where rounding
    // differs, the plain fp32 run within the 16-bit format's rounding).
    TrainConfig plain = ddp_config(2, 16, 6);
    plain.optimizer = default_optimizer_config(OptimizerKind::SGD);  // linear in the gradient: rounding stays rounding-sized
    plain.optimizer.lr = 0.1;
    plain.optimizer.momentum = 0.9;
    for (CommHook hook : {CommHook::Fp16, CommHook::Bf16}) {
      CAPTURE(comm_hook_name(hook));
      TrainConfig c = plain;
      c.ddp.comm_hook.kind = hook;
      Trainer t(c);
      train(t);
      // Every bucket all-reduce of iteration 2 (after the rebuild) moves 2 bytes per gradient.
      int64_t moved = 0, buckets = 0;
      for (const Event& e : t.recorder().events(0)) {
        if (e.kind != EventKind::BucketAllReduce || e.iteration != 2) continue;
        moved += e.bucket.bytes;
        buckets++;
        CHECK(e.bucket.bytes % 2 == 0);
      }
      CHECK(buckets >= 2);
      CHECK(moved == 2 * 4547);
      // The dtype on the wire: the collectives of those all-reduces are 16-bit.
      int sixteen = 0;
      for (const Event& e : t.recorder().events(0))
        if (e.kind == EventKind::Collective && e.iteration == 2) sixteen += e.coll.dtype == (hook == CommHook::Fp16 ? DType::F16 : DType::BF16);
      CHECK(sixteen == buckets);
      Trainer ref(plain);
      train(ref);
      const double apart = max_abs_diff(t.model(), ref.model());
      MESSAGE(std::string(comm_hook_name(hook)) << ": " << apart << " from the plain run");
      CHECK(apart > 0);  // the casts round
      CHECK(apart < (hook == CommHook::Fp16 ? 2e-4 : 2e-3));  // 11 and 8 significant bits
      // gradient_as_bucket_view: the hook casts from the gradients in place, the same values.
      TrainConfig v = c;
      v.ddp.gradient_as_bucket_view = true;
      Trainer tv(v);
      train(tv);
      CHECK(max_abs_diff(tv.model(), t.model()) == 0.0);
      // A bf16 model: its 16-bit buckets cast to the hook's dtype (fp16's: one more rounding).
      TrainConfig h = c;
      h.precision = Precision::BF16;
      Trainer th(h);
      CHECK(std::isfinite(train(th).summary.eval_loss));
    }
    // Top-k: each bucket's all-gathers carry ceil(ratio n) float32 values and int64 indices per rank,
    // and a Join's shadow matches them.
    TrainConfig k = plain;
    k.ddp.comm_hook = parse_comm_hook("topk:ratio=0.05");
    CHECK(comm_hook_text(k.ddp.comm_hook) == "topk:ratio=0.05");
    {
      Trainer t(k);
      train(t);
      int checked = 0;
      std::vector<int64_t> numel;  // per bucket of the latest assignment (float32 gradients)
      for (const Event& e : t.recorder().events(0)) {
        if (e.kind == EventKind::BucketAssigned) {
          if (e.bucket.bucket == 0) numel.clear();
          numel.push_back(e.bucket.bytes / 4);
        }
        if (e.kind != EventKind::BucketAllReduce || e.iteration != 2) continue;
        REQUIRE(e.bucket.bucket < static_cast<int>(numel.size()));
        const double n = static_cast<double>(numel[static_cast<size_t>(e.bucket.bucket)]);
        CHECK(e.bucket.bytes == static_cast<int64_t>(std::ceil(0.05 * n)) * 12);
        checked++;
      }
      for (const Event& e : t.recorder().events(0))
        if (e.kind == EventKind::BucketLaunch) CHECK(e.bucket.collectives == 2);  // values, then indices
      CHECK(checked >= 2);
    }
    CHECK_THROWS_WITH_AS(parse_comm_hook("topk:ratio=0"),
                         "--comm-hook topk:ratio=0: write topk:ratio=F[,error_feedback=false] with F in (0, 1], the share of each bucket's entries a rank "
                         "sends, e.g. topk:ratio=0.01",
                         Error);
    // PowerSGD (rank 1 from iteration 2; values held to torch's powerSGD_hook by tests/comm_hook_torch.py):
    // mlp:2,64,64,3's weights are 64 x 2 (too thin: (64 + 2) x 2 >= 128, sent whole), 64 x 64 and 3 x 64
    // (sent as P and Q: (64 + 64) and (3 + 64) floats), its biases whole. Before iteration 2 every bucket
    // is a plain average of its float32 gradients.
    TrainConfig q = plain;
    q.ddp.comm_hook = parse_comm_hook("powersgd:rank=1,start=2");
    CHECK(comm_hook_text(q.ddp.comm_hook) == "powersgd:rank=1,start=2");
    CHECK(comm_hook_text(parse_comm_hook("powersgd")) == "powersgd:rank=1,start=1000");  // PowerSGDState's defaults
    {
      Trainer t(q);
      train(t);
      int64_t before = 0, after = 0;
      std::vector<int64_t> counts;  // iteration 2's float32 all-reduces, in order
      for (const Event& e : t.recorder().events(0)) {
        if (e.kind == EventKind::BucketAllReduce && e.iteration == 1) before += e.bucket.bytes;
        if (e.kind == EventKind::BucketAllReduce && e.iteration == 2) after += e.bucket.bytes;
        if (e.kind == EventKind::Collective && e.iteration == 2 && e.coll.op == CollectiveOp::AllReduce) counts.push_back(e.coll.in_count);
      }
      CHECK(before == 4 * 4547);
      CHECK(after == 4 * (64 * 2 + 64 + 64 + 3 + (64 + 64) + (3 + 64)));
      // Each launch says how many collectives follow it (the Buckets view lists them): one plain
      // all-reduce before iteration 2, then the whole tensors', P's and Q's.
      for (const Event& e : t.recorder().events(0))
        if (e.kind == EventKind::BucketLaunch) CHECK(e.bucket.collectives == (e.iteration >= 2 ? 3 : 1));
      // The rebuilt buckets (this config's small caps) are {4.weight, 4.bias, 2.bias}, {2.weight} and
      // {0.weight, 0.bias}; each all-reduces its uncompressed tensors, then P, then Q (empty ones too,
      // as torch's hook does), and the step's figures follow (4 floats).
      const std::vector<int64_t> want{3 + 64, 3, 64, 0, 64, 64, 64 * 2 + 64, 0, 0, 4};
      std::string got;
      for (int64_t n : counts) got += std::to_string(n) + " ";
      CAPTURE(got);
      CHECK(counts == want);
      Trainer ref(plain);
      train(ref);
      CHECK(max_abs_diff(t.model(), ref.model()) > 1e-4);  // the low-rank average is not the average
    }
    CHECK_THROWS_WITH_AS(parse_comm_hook("powersgd:rank=1,start=1"),
                         "--comm-hook powersgd:rank=1,start=1: write powersgd:rank=R[,start=S][,error_feedback=false] with R >= 1 (matrix_approximation_rank) "
                         "and S >= 2 (start_powerSGD_iter: torch needs two plain iterations first), e.g. powersgd:rank=1,start=2",
                         Error);
    // Join (uneven inputs): the joined rank's shadow collectives match the hook's.
    for (const char* hook : {"fp16", "topk:ratio=0.05", "powersgd:rank=1,start=2"}) {
    CAPTURE(hook);
    TrainConfig j = plain;
    j.world_size = 4;
    j.optimizer = default_optimizer_config(OptimizerKind::SGD);
    j.optimizer.lr = 0.1;
    j.uneven_rank = 3;
    j.join = true;
    j.steps = 3;
    j.ddp.comm_hook = parse_comm_hook(hook);
    Trainer tj(j);
    CHECK(std::isfinite(train(tj).summary.eval_loss));
    }
  }

  TEST_CASE("comm hooks without error feedback: parsed and printed, no error buffer, and top-k sends the gradient's own largest entries") {
    // --comm-hook's text: error_feedback=false is kept, the default is left out, anything else refused.
    CHECK(comm_hook_text(parse_comm_hook("powersgd:rank=1,start=2,error_feedback=false")) == "powersgd:rank=1,start=2,error_feedback=false");
    CHECK(comm_hook_text(parse_comm_hook("topk:ratio=0.05,error_feedback=false")) == "topk:ratio=0.05,error_feedback=false");
    CHECK(comm_hook_text(parse_comm_hook("topk:ratio=0.05,error_feedback=true")) == "topk:ratio=0.05");
    CHECK(comm_hook_text(parse_comm_hook("topk:error_feedback=false")) == "topk:ratio=0.01,error_feedback=false");
    CHECK_FALSE(parse_comm_hook("powersgd:error_feedback=false,rank=2").error_feedback);
    CHECK(parse_comm_hook("powersgd:error_feedback=false,rank=2").powersgd_rank == 2);
    CHECK_THROWS_WITH_AS(parse_comm_hook("powersgd:rank=1,error_feedback=off"),
                         "--comm-hook powersgd:rank=1,error_feedback=off: error_feedback takes true or false (false: nothing that was "
                         "not sent is remembered, torch's use_error_feedback=False), e.g. powersgd:rank=1,start=2,error_feedback=false",
                         Error);
    CHECK_THROWS_AS(parse_comm_hook("topk:ratio=0.1,error_feedback="), Error);
    CHECK_THROWS_AS(parse_comm_hook("topk:ratio=0.1,"), Error);
    CHECK_THROWS_AS(parse_comm_hook("fp16:error_feedback=false"), Error);  // a cast hook keeps no error

    SUBCASE("memory: the error feedback's float32 buffer per gradient, and nothing without it") {
      // mlp:2,64,64,3: 4547 gradients. The error is CommBuffers, beside the buckets (and top-k's
      // values and indices, the same in both runs).
      for (const char* hook : {"topk:ratio=0.05", "powersgd:rank=1,start=2"}) {
        CAPTURE(hook);
        TrainConfig on = ddp_config(2, 16, 4);
        on.ddp.comm_hook = parse_comm_hook(hook);
        TrainConfig off = on;
        off.ddp.comm_hook.error_feedback = false;
        Trainer a(on), b(off);
        const TrainSummary sa = a.run(), sb = b.run();
        REQUIRE(sa.rank_memory.size() == 2);
        REQUIRE(sb.rank_memory.size() == 2);
        for (size_t r = 0; r < 2; r++) {
          CAPTURE(r);
          const int64_t with = sa.rank_memory[r].current_of(MemCategory::CommBuffers), without = sb.rank_memory[r].current_of(MemCategory::CommBuffers);
          CHECK(with - without == 4547 * 4);
          CHECK(without >= 4547 * 4);  // the buckets themselves stay
        }
        CHECK(max_abs_diff(a.model(), b.model()) > 1e-5);  // the remembered error changed the steps
      }
    }

    SUBCASE("top-k: what each rank sends is the top-k of its gradient alone, pass after pass (with feedback: of gradient + error)") {
      // mlp:3,8,2 (50 gradients, one bucket in the first passes), ratio 0.1: 5 entries a rank. Each rank's
      // gradients are set by hand, the same in both passes, and the hook's buffers read back.
      for (bool feedback : {false, true}) {
        CAPTURE(feedback);
        ThreadsWorld w(2);
        std::vector<std::unique_ptr<Model>> models;
        for (int r = 0; r < 2; r++) models.push_back(std::make_unique<Model>(ModelSpec::parse("mlp:3,8,2"), &w.memory(r), 1));
        DdpOptions opt;
        opt.comm_hook = parse_comm_hook("topk:ratio=0.1");
        opt.comm_hook.error_feedback = feedback;
        std::vector<std::vector<std::vector<int64_t>>> sent_idx(2);  // per rank, per pass
        std::vector<std::vector<std::vector<float>>> sent_val(2), want_val(2);
        std::vector<std::vector<std::vector<int64_t>>> want_idx(2);
        w.run([&](int r, Communicator& comm, RankContext& ctx) {
          Model& m = *models[static_cast<size_t>(r)];
          DistributedDataParallel ddp(m, comm, &ctx, opt);
          // (No doctest assertion on a rank's thread: a throw ends the world and reaches the test.)
          if (ddp.buckets().size() != 1 || ddp.buckets()[0].numel != 50 || ddp.buckets()[0].topk != 5)
            throw Error("expected one bucket of 50 gradients, 5 of them sent");
          const DdpBucket& bk = ddp.buckets()[0];
          const int64_t n = bk.numel, k = bk.topk;
          std::vector<float> error(static_cast<size_t>(n), 0.0f);  // the test's own memory, in bucket order
          for (int pass = 0; pass < 2; pass++) {
            std::vector<float> g(static_cast<size_t>(n));  // in bucket order
            for (size_t s = 0; s < bk.params.size(); s++) {
              Parameter& p = m.parameters()[static_cast<size_t>(bk.params[s])];
              for (int64_t i = 0; i < p.numel; i++) {
                const int64_t at = bk.offsets[s] + i;
                p.grad[i] = std::sin(1.37f * static_cast<float>(at) + 0.5f * static_cast<float>(r));
                g[static_cast<size_t>(at)] = p.grad[i];
              }
            }
            // The reference: the k largest magnitudes of the gradient (+ the error), lower index first on a tie.
            std::vector<float> acc = g;
            if (feedback)
              for (int64_t i = 0; i < n; i++) acc[static_cast<size_t>(i)] += error[static_cast<size_t>(i)];
            std::vector<int64_t> order(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; i++) order[static_cast<size_t>(i)] = i;
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return std::fabs(acc[static_cast<size_t>(a)]) > std::fabs(acc[static_cast<size_t>(b)]); });
            std::vector<int64_t> idx(order.begin(), order.begin() + k);
            std::sort(idx.begin(), idx.end());
            std::vector<float> val;
            for (int64_t i : idx) val.push_back(acc[static_cast<size_t>(i)]);
            error = acc;
            for (int64_t i : idx) error[static_cast<size_t>(i)] = 0.0f;
            want_idx[static_cast<size_t>(r)].push_back(idx);
            want_val[static_cast<size_t>(r)].push_back(val);

            ddp.prepare_for_backward();
            for (int p = static_cast<int>(m.parameters().size()) - 1; p >= 0; p--) ddp.grad_ready_hook()(p);
            ddp.finalize_backward();
            std::vector<int64_t> got_idx(static_cast<size_t>(k));
            std::vector<float> got_val(static_cast<size_t>(k));
            std::memcpy(got_idx.data(), bk.topk_indices.raw(), static_cast<size_t>(k) * sizeof(int64_t));
            std::memcpy(got_val.data(), bk.topk_values.raw(), static_cast<size_t>(k) * sizeof(float));
            sent_idx[static_cast<size_t>(r)].push_back(got_idx);
            sent_val[static_cast<size_t>(r)].push_back(got_val);
          }
        });
        for (size_t r = 0; r < 2; r++) {
          CAPTURE(r);
          for (size_t pass = 0; pass < 2; pass++) {
            CAPTURE(pass);
            CHECK(sent_idx[r][pass] == want_idx[r][pass]);
            CHECK(sent_val[r][pass] == want_val[r][pass]);  // exactly: the same float adds
          }
          // Without feedback the same gradient sends the same entries again; with it, what was held back
          // comes through the second time.
          CHECK((sent_idx[r][1] == sent_idx[r][0]) == !feedback);
        }
      }
    }
  }

  TEST_CASE("memory per rank matches the arithmetic") {
    // mlp:2,64,64,3: P = 4547 floats. Batch 16: activations are each layer's output
    // (16 x (64+64+64+64+3)), two gradient ping-pong buffers (16 x 64 each), and the loss's
    // probabilities and logit gradients (16 x 3 each).
    const int64_t P = 4547 * 4;
    const int64_t acts = (16 * (64 * 4 + 3) + 2 * 16 * 64 + 2 * 16 * 3) * 4;
    for (bool view : {false, true}) {
      CAPTURE(view);
      TrainConfig c = ddp_config(3, 16, 4);
      c.ddp.gradient_as_bucket_view = view;
      Trainer t(c);
      TrainSummary s = t.run();
      REQUIRE(s.rank_memory.size() == 3);
      for (const MemoryStats& m : s.rank_memory) {
        CHECK(m.current_of(MemCategory::Parameters) == P);
        CHECK(m.current_of(MemCategory::Gradients) == (view ? 0 : P));  // the view saves a copy
        CHECK(m.current_of(MemCategory::OptimizerState) == 2 * P);      // AdamW: exp_avg, exp_avg_sq
        CHECK(m.current_of(MemCategory::CommBuffers) == P);             // the buckets
        CHECK(m.current_of(MemCategory::Activations) == acts);
        // The last iteration allocates nothing new: its peak is what it holds.
        CHECK(m.total_peak == m.total_current);
        CHECK(m.total_current == (view ? 4 : 5) * P + acts);
      }
    }
  }

  TEST_CASE("a parameter the forward skips: torch's error at the next forward, a hang across branches, trained with the flag") {
    TrainConfig c = ddp_config(2, 16, 6);
    c.model = ModelSpec::parse("mlp:2,32,32,32,3");
    c.skip_layer = 2;
    c.skip_every = 2;  // steps 2, 4, 6 bypass Linear 2
    c.timeout_s = 5;
    auto failure = [](Trainer& t) {
      std::string msg;
      try {
        t.run();
      } catch (const std::exception& e) {
        msg = e.what();
      }
      return msg;
    };
    SUBCASE("skipped on every rank: backward ends, the next forward raises, naming the parameters") {
      // After the rebuild (ready order 6.b 6.w 4.b 4.w | 2.b 2.w | 0.b 0.w) bucket 1 holds layer 2.
      Trainer t(c);
      const std::string msg = failure(t);
      INFO(msg);
      CHECK(msg.find("DDP expected to have finished reduction in the prior iteration before starting a new one (torch's error)") != std::string::npos);
      CHECK(msg.find("in iteration 1 parameters 2.bias, 2.weight received no gradient") != std::string::npos);
      CHECK(msg.find("bucket 1 of 3 (2.bias, 2.weight) and bucket 2 after it never launched its all-reduce") != std::string::npos);
      CHECK(msg.find("--find-unused-parameters") != std::string::npos);
      CHECK(msg.find("watchdog") == std::string::npos);  // nobody waited: every rank skipped alike
    }
    SUBCASE("skipped on rank 1 only: the ranks' next collectives pair up wrongly") {
      // Rank 0 used layer 2 and launched bucket 1 (2.b, 2.w: 1056 floats) as all-reduce #6; rank 1
      // never launched it, finished its step, and issued the step's 4-float loss all-reduce as #6.
      // NCCL would match the two by order and mix them; the threads backend checks and names both.
      c.skip_ranks = {1};
      Trainer t(c);
      const std::string msg = failure(t);
      INFO(msg);
      CHECK(msg.find("desync: collective #6 differs across ranks") == 0);
      CHECK(msg.find("rank 1 called #6 allreduce of 4 float32") != std::string::npos);
      CHECK(msg.find("rank 0 called #6 allreduce of 1056 float32") != std::string::npos);
    }
    SUBCASE("--skip-ranks is checked against the world") {
      c.skip_ranks = {2};
      CHECK_THROWS_WITH_AS(Trainer{c}, "--skip-ranks names rank 2, but the world has ranks 0 to 1; pick ranks in that range", Error);
    }
    SUBCASE("with find_unused_parameters every step completes") {
      c.ddp.find_unused_parameters = true;
      c.steps = 40;
      Trainer t(c);
      Trained r = train(t);
      REQUIRE(r.steps.size() == 40);
      CHECK(r.steps[1].branch_taken);
      CHECK_FALSE(r.steps[2].branch_taken);
      CHECK_FALSE(r.summary.buckets_rebuilt);  // torch does not rebuild with find_unused_parameters
      CHECK(r.steps.back().loss < r.steps.front().loss);
      for (int k = 1; k < 2; k++) CHECK(max_abs_diff(t.rank_model(k), t.model()) == 0.0);
    }
    SUBCASE("with find_unused_parameters the local-used map is all-reduced after the last bucket") {
      // torch's Reducer::all_reduce_local_used_map: one all-reduce of a 4-byte count per parameter
      // (int32 there, carried in float32 here) once every bucket has launched, each synchronised
      // backward; a parameter no rank used keeps its .grad untouched.
      c.ddp.find_unused_parameters = true;
      c.steps = 3;
      Trainer t(c);
      t.run();
      const int64_t P = static_cast<int64_t>(t.model().parameters().size());
      for (int rank = 0; rank < 2; rank++) {
        CAPTURE(rank);
        int64_t buckets = 0, maps = 0, after_last_bucket = 0;
        uint64_t last_bucket_seq = 0;
        for (const Event& e : t.recorder().events(rank)) {
          if (e.iteration != 2) continue;
          if (e.kind == EventKind::BucketAllReduce) {
            buckets++;
            last_bucket_seq = std::max(last_bucket_seq, e.bucket.seq);
          }
        }
        for (const Event& e : t.recorder().events(rank)) {
          if (e.iteration != 2 || e.kind != EventKind::Collective || e.coll.op != CollectiveOp::AllReduce) continue;
          if (e.coll.in_count == P && e.coll.bytes == 4 * P) {
            maps++;
            after_last_bucket += e.coll.seq == last_bucket_seq + 1;
          }
        }
        CHECK(buckets >= 2);
        CHECK(maps == 1);
        CHECK(after_last_bucket == 1);
      }
    }
  }

  TEST_CASE("reducer events: gradients ready in backward order, buckets launched in index order") {
    TrainConfig c = ddp_config(2, 16, 3);
    c.accum = 2;  // the first micro-batch of each step runs under no_sync: no bucket traffic
    Trainer t(c);
    TrainSummary s = t.run();
    TraceRecorder& rec = t.recorder();
    for (int rank = 0; rank < 2; rank++) {
      CAPTURE(rank);
      std::vector<Event> ev = rec.events(rank);
      std::vector<int> ready_iter2;
      std::vector<int> launches_iter2;
      int assigned_gen0 = 0, assigned_gen1 = 0, launches = 0, allreduces = 0;
      int64_t allreduced_bytes_iter2 = 0;
      for (const Event& e : ev) {
        if (e.kind == EventKind::BucketAssigned) (e.bucket.generation == 0 ? assigned_gen0 : assigned_gen1)++;
        if (e.kind == EventKind::BucketLaunch) launches++;
        if (e.kind == EventKind::BucketAllReduce) allreduces++;
        if (e.iteration != 2) continue;
        if (e.kind == EventKind::GradReady) {
          ready_iter2.push_back(e.bucket.param);
          CHECK(rec.label(e.bucket.label) == t.model().parameters()[static_cast<size_t>(e.bucket.param)].name);
        }
        if (e.kind == EventKind::BucketLaunch) launches_iter2.push_back(e.bucket.bucket);
        if (e.kind == EventKind::BucketAllReduce) {
          allreduced_bytes_iter2 += e.bucket.bytes;
          CHECK(e.lane == Lane::Comm);
          CHECK(e.model_end >= e.model_begin);
        }
      }
      CHECK(ready_iter2 == std::vector<int>{5, 4, 3, 2, 1, 0});  // once per step, not per micro-batch
      // Rebuilt after iteration 1 with limits {1024, 4096} over the ready order: 12 + 768 + 256
      // reaches 1024; 16384 reaches 4096; 256 + 512 is left over.
      CHECK(launches_iter2 == std::vector<int>{0, 1, 2});
      CHECK(allreduced_bytes_iter2 == 4547 * 4);
      // At construction torch's single bucket (find_unused_parameters=False): every gradient.
      CHECK(assigned_gen0 == 1);
      CHECK(assigned_gen1 == 3);
      CHECK(launches == 1 + 3 + 3);
      CHECK(allreduces == launches);
    }
    CHECK(s.buckets == std::vector<std::string>{"bucket 0: 4.bias, 4.weight, 2.bias (1.0 KiB)",
                                                "bucket 1: 2.weight (16.0 KiB)",
                                                "bucket 2: 0.bias, 0.weight (768 B)"});
    CHECK(s.mean_overlap >= 0.0);
    CHECK(s.mean_overlap <= 1.0);
  }

  TEST_CASE("the reported overlap is what the trace shows, on the modeled clock") {
    // Big enough layers that backward compute is comparable to the all-reduces on nvlink8.
    TrainConfig c = ddp_config(2, 512, 3);
    c.model = ModelSpec::parse("mlp:2,512,512,512,3");
    c.ddp.bucket_cap_bytes = 512 * 1024;
    c.ddp.first_bucket_bytes = 10 * 1024;
    c.profile = "nvlink8";
    Trainer t(c);
    Trained r = train(t);
    for (int32_t iter = 0; iter < 3; iter++) {
      double mean = 0;
      for (int rank = 0; rank < 2; rank++) {
        double b0 = 1e300, b1 = -1e300, comm = 0, hidden = 0;
        std::vector<std::pair<double, double>> spans;
        for (const Event& e : t.recorder().events(rank)) {
          if (e.iteration != iter) continue;
          if (e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward) {
            b0 = std::min(b0, e.model_begin);
            b1 = std::max(b1, e.model_end);
          }
          if (e.kind == EventKind::BucketAllReduce) spans.push_back({e.model_begin, e.model_end});
        }
        for (auto [x0, x1] : spans) {
          comm += x1 - x0;
          hidden += std::max(0.0, std::min(x1, b1) - std::max(x0, b0));
        }
        mean += hidden / comm / 2;
      }
      CAPTURE(iter);
      CHECK(r.steps[static_cast<size_t>(iter)].overlap == doctest::Approx(mean).epsilon(1e-5));
      if (iter == 0) {
        // torch's single first-iteration bucket launches with the last gradient: nothing hides.
        CHECK(r.steps[0].overlap == 0.0);
      } else {
        CHECK(r.steps[static_cast<size_t>(iter)].overlap > 0.05);  // some all-reduce really hides
        CHECK(r.steps[static_cast<size_t>(iter)].overlap < 1.0);   // the last bucket cannot
      }
    }
  }

  TEST_CASE("construction broadcasts rank 0's parameters and rejects different models") {
    SUBCASE("replicas seeded differently end up equal to rank 0's") {
      ThreadsWorld w(3);
      std::vector<std::unique_ptr<Model>> models;
      for (int r = 0; r < 3; r++)
        models.push_back(std::make_unique<Model>(ModelSpec::parse("mlp:3,8,2"), &w.memory(r), 10 + r));
      std::vector<float> rank0(models[0]->params(), models[0]->params() + models[0]->num_params());
      CHECK(max_abs_diff(*models[1], *models[0]) > 0);
      w.run([&](int r, Communicator& comm, RankContext& ctx) {
        DistributedDataParallel ddp(*models[static_cast<size_t>(r)], comm, &ctx, DdpOptions{});
      });
      for (int r = 0; r < 3; r++)
        CHECK(std::memcmp(models[static_cast<size_t>(r)]->params(), rank0.data(), rank0.size() * sizeof(float)) == 0);
    }
    SUBCASE("a rank with other shapes is named") {
      ThreadsWorld w(2);
      Model a(ModelSpec::parse("mlp:3,8,2"), &w.memory(0), 1);
      Model b(ModelSpec::parse("mlp:3,9,2"), &w.memory(1), 1);
      std::string msg;
      try {
        w.run([&](int r, Communicator& comm, RankContext& ctx) {
          DistributedDataParallel ddp(r == 0 ? a : b, comm, &ctx, DdpOptions{});
        });
      } catch (const Error& e) {
        msg = e.what();
      }
      CHECK(msg.find("DDP: rank 1's model has 4 parameters with shapes that differ from rank 0's") != std::string::npos);
      CHECK(msg.find("every rank must wrap the same model") != std::string::npos);
    }
  }

  TEST_CASE("a paused DDP run advances one collective per step command") {
    // What the app does: the world starts paused and the user presses "next collective".
    TrainConfig c = ddp_config(2, 16, 2);
    c.start_paused = true;
    Trainer t(c);
    test::BackgroundRun runner(t);
    Stepper& st = t.world()->stepper();
    int commands = 0;
    bool saw_bucket_in_flight = false;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!runner.done() && commands < 200 && std::chrono::steady_clock::now() < give_up) {
      if (!st.wait_until_settled(std::chrono::milliseconds(50))) continue;
      const PendingItem p = st.state().pending;
      if (!p.valid) {  // every rank's program ended; run() is finishing
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      if (p.gate.coll == CollectiveOp::AllReduce && p.gate.bytes > 1000) saw_bucket_in_flight = true;
      st.step(GateKind::Collective);
      commands++;
    }
    CHECK(runner.finish(std::chrono::seconds(0)));  // ended by the steps, not by the test giving up
    CHECK(runner.error().empty());
    // Construction: all-gather of shapes + parameter broadcast; iteration 0: torch's one bucket +
    // the loss all-reduce; the rebuild's broadcast; iteration 1: 3 buckets + the loss all-reduce.
    CHECK(commands >= 9);
    CHECK(saw_bucket_in_flight);
  }

  TEST_CASE("rank 0 saves the checkpoint and every rank can load it") {
    test::TempDir dir;
    TrainConfig c = ddp_config(2, 16, 5);
    c.save_path = dir.file("ddp.safetensors");
    Trainer t(c);
    t.run();
    CHECK(dir.listing() == std::set<std::string>{"ddp.safetensors"});  // one file, no temp left
    CheckpointInfo info = read_checkpoint_info(c.save_path);
    CHECK(info.step == 5);
    TrainConfig d = ddp_config(3, 16, 1);
    d.init_path = c.save_path;
    Trainer next(d);
    for (int r = 0; r < 3; r++) CHECK(max_abs_diff(next.rank_model(r), t.model()) == 0.0);
  }

  TEST_CASE("configuration errors name the fix") {
    auto message = [](const TrainConfig& c) {
      try {
        Trainer t(c);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    TrainConfig c = ddp_config(2, 16, 1);
    c.accum = 0;
    CHECK(message(c) == "--accum must be at least 1 (got 0)");
    c = ddp_config(2, 16, 1);
    c.skip_layer = 0;  // Linear 0 maps 2 -> 64
    CHECK(message(c).find("bypassing it would change the width") != std::string::npos);
    c = ddp_config(2, 16, 1);
    c.skip_layer = 1;
    CHECK(message(c).find("is a ReLU") != std::string::npos);
    c = ddp_config(2, 16, 1);
    c.strategy = Strategy::Single;
    CHECK(message(c).find("use --strategy ddp") != std::string::npos);
  }
}
