// The GPT's mixture of experts (--moe) and expert parallelism (--ep): the spec's sentences, the
// parameter table (whole and one EP rank's), the router's ties, capacity and load-balancing loss on a
// case worked by hand, the backward against finite differences, and expert parallelism's all-to-alls
// and results against DDP without it. tests/moe_torch.py holds the layer to a torch model of
// Megatron-core's (init, 12 steps under every strategy, drops, --ep).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/core/gpt.h"
#include "engine/core/ops.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace dtlab {

namespace {

std::string moe_error(const std::string& text) {
  return test::error_sentence([&] { MoeSpec::parse(text); });
}

GptSpec moe_gpt(const std::string& moe, int64_t layers = 2) {
  GptSpec g = GptSpec::parse("gpt:layers=" + std::to_string(layers) + ",heads=2,embd=8,ctx=4,vocab=6");
  g.moe = MoeSpec::parse(moe);
  return g;
}

// Cross-entropy of the GPT's forward plus its MoE blocks' load-balancing losses.
double moe_loss(Model& m, const std::vector<int64_t>& idx, const std::vector<int64_t>& tgt, int64_t B) {
  const int64_t rows = B * m.spec().gpt.ctx, V = m.spec().gpt.vocab;
  std::vector<float> probs(static_cast<size_t>(rows * V));
  const double ce = cross_entropy_forward(probs.data(), m.forward_tokens(idx.data(), B), tgt.data(), rows, V);
  return ce + m.aux_loss();
}

}  // namespace

TEST_SUITE("moe") {
  TEST_CASE("moe with tensor and context parallelism: each rank routes its own positions, and the run equals ddp without them") {
    // Megatron-core trains an MoE layer tensor-parallel only with sequence parallelism: each TP rank
    // routes its own positions to whole experts, whose gradients (and the router's) are summed over
    // the TP group; under CP each rank routes its positions too. The aux loss's counts are the TP and
    // CP group's (tokens_per_expert over tp_cp). Dropless, with a large aux coefficient so that its
    // gradient weighs in the router's; SGD with momentum, every parameter within 1e-5 of DDP's.
    auto config = [](const char* strategy, int world) {
      TrainConfig c = test::demo_config(strategy, world, 4, 3);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
      c.moe = MoeSpec::parse("experts=4,top_k=2,aux=0.5");
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.lr = 0.05;
      c.optimizer.momentum = 0.9;
      return c;
    };
    Trainer ref(config("ddp", 2));  // two replicas of 4 samples a step
    const TrainSummary rs = ref.run();
    struct Case {
      const char* strategy;
      int world, tp, cp, ep;
    };
    std::vector<Case> cases = {{"ddp", 4, 2, 1, 1}, {"ddp", 4, 1, 2, 1}};
    if (!test::quick()) cases.insert(cases.end(), {{"fsdp", 4, 2, 1, 1}, {"ddp", 4, 1, 2, 2}, {"ddp", 8, 2, 2, 1}});
    for (const Case& k : cases) {
      const std::string strategy = k.strategy;
      CAPTURE(strategy);
      CAPTURE(k.tp);
      CAPTURE(k.cp);
      CAPTURE(k.ep);
      TrainConfig c = config(k.strategy, k.world);
      c.tp = k.tp;
      c.sequence_parallel = k.tp > 1;
      c.cp = k.cp;
      c.ep = k.ep;
      Trainer t(c);
      const TrainSummary s = t.run();
      CHECK(s.steps == 3);
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
      CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-5);
    }
    // Every TP collective of an iteration, in order and with its bytes (one replica of 2 ranks, its
    // blocks recomputed): an MoE block's forward sums the router's counts and probabilities (2E floats)
    // instead of gathering ln_2's positions; its backward sums each expert's gradients and the router's.
    TrainConfig c = config("ddp", 2);
    c.tp = 2;
    c.sequence_parallel = true;
    c.activation_checkpointing = true;
    c.moe = MoeSpec::parse("experts=4,top_k=2,every=2");
    Trainer t(c);
    t.run();
    const GptSpec& g = t.model().spec().gpt;
    const std::vector<TpCollective> want = gpt_tp_collectives(g, GptRange::all(g), TensorParallelSpec{2, 0, true}, c.batch, true);
    CHECK(std::count_if(want.begin(), want.end(), [](const TpCollective& w) { return w.bytes == 2 * 4 * 4; }) == 2);  // forward, recompute
    for (int rank = 0; rank < 2; rank++) {
      CAPTURE(rank);
      const std::vector<Event> events = t.recorder().events(rank);
      std::vector<const Event*> got;
      for (const Event& e : events)
        if (e.kind == EventKind::Collective && e.iteration == 1 && e.coll.dtype == DType::F32) got.push_back(&e);
      REQUIRE(got.size() == want.size() + 1);  // then the step's 4 figures
      for (size_t i = 0; i < want.size(); i++) {
        CAPTURE(i);
        CAPTURE(want[i].what);
        CHECK(got[i]->coll.op == want[i].op);
        CHECK(got[i]->coll.bytes == want[i].bytes);
      }
      // Each TP rank routed its own half of the 4 x 8 positions.
      const GptCore::MoeRouting* r = t.rank_model(rank).gpt()->moe_routing(0);
      REQUIRE(r != nullptr);
      CHECK(r->tokens == 16);
    }
    // Megatron's refusal, and the fix it names.
    c.sequence_parallel = false;
    CHECK(test::error_of(c) ==
          "--moe with --tp and no --sequence-parallel: Megatron-core's MoELayer refuses to train tensor-parallel without sequence "
          "parallelism (each TP rank routes its own positions to whole experts); add --sequence-parallel");
  }

  TEST_CASE("expert parallelism with tensor parallelism: EP groups take the TP ranks first, and the run equals one without EP") {
    // Megatron's MoE parallel folding with expert TP 1: each TP rank routes its own positions (sequence
    // parallel) and holds whole experts, and an EP group is a run of --ep ranks, TP ranks first. With
    // tp 2 on 4 ranks, --ep 2 makes each TP group an EP group (the experts' gradients summed over the
    // replicas holding them, ranks 0,2 and 1,3) and --ep 4 puts every expert on one rank. Dropless SGD
    // with momentum and a large aux coefficient, then clipping: every parameter within 1e-5.
    auto config = [](int world) {
      TrainConfig c = test::demo_config("ddp", world, 4, 3);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;
      c.moe = MoeSpec::parse("experts=4,top_k=2,aux=0.5");
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.lr = 0.05;
      c.optimizer.momentum = 0.9;
      c.tp = 2;
      c.sequence_parallel = true;
      return c;
    };
    for (double clip : {0.0, 0.05}) {
      TrainConfig c = config(4);
      c.clip_grad_norm = clip;
      Trainer ref(c);  // two replicas of a TP pair, every expert on every rank
      std::vector<double> ref_norms, norms;
      const TrainSummary rs = ref.run([&](const StepReport& r) { ref_norms.push_back(r.grad_norm); });
      for (int ep : {2, 4}) {
        if (clip > 0 && ep == 4) continue;
        CAPTURE(clip);
        CAPTURE(ep);
        c.ep = ep;
        Trainer t(c);
        norms.clear();
        const TrainSummary s = t.run([&](const StepReport& r) { norms.push_back(r.grad_norm); });
        CHECK(s.steps == 3);
        CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
        CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-5);
        REQUIRE(norms.size() == ref_norms.size());  // the whole model's norm (-1 unclipped)
        for (size_t i = 0; i < norms.size(); i++) CHECK(std::abs(norms[i] - ref_norms[i]) < 1e-5);
        if (ep != 2 || clip > 0) continue;
        // The all-to-alls run on the TP pairs; each rank routed its 16 positions of 4 x 8.
        for (int rank = 0; rank < 4; rank++) {
          CAPTURE(rank);
          std::map<std::string, int> groups;
          for (const Event& e : t.recorder().events(rank))
            if (e.kind == EventKind::Collective && e.iteration == 2 && e.coll.op == CollectiveOp::AllToAll)
              groups[t.recorder().label(e.coll.group - 1)]++;
          CHECK(groups == std::map<std::string, int>{{rank < 2 ? "ep0: 0,1" : "ep1: 2,3", 2 * 5}});
          const GptCore::MoeRouting* r = t.rank_model(rank).gpt()->moe_routing(0);
          REQUIRE(r != nullptr);
          CHECK(r->tokens == 16);
        }
      }
    }
    if (!test::quick()) {  // with context parallelism too: 2 replicas x cp 2 x tp 2, an EP group of 4
      TrainConfig c = config(8);
      c.cp = 2;
      Trainer ref(c);
      ref.run();
      c.ep = 4;
      Trainer t(c);
      t.run();
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
    }
  }

  TEST_CASE("moe specs: Megatron's options in one flag, and one sentence for each mistake") {
    const MoeSpec m = MoeSpec::parse("experts=8,top_k=2,capacity=1.25,every=2,aux=0.001");
    CHECK(m.experts == 8);
    CHECK(m.top_k == 2);
    CHECK(m.capacity == 1.25);
    CHECK(m.every == 2);
    CHECK(m.str() == "experts=8,top_k=2,capacity=1.25,every=2,aux=0.001");
    CHECK(MoeSpec::parse(m.str()).str() == m.str());
    CHECK(m.in_block(0));
    CHECK(!m.in_block(1));
    CHECK(m.in_block(2));
    CHECK(moe_error("experts=4") ==
          "--moe 'experts=4' does not give top_k; write it as experts=E,top_k=K[,capacity=F][,every=N][,aux=A] (e.g. --moe "
          "experts=4,top_k=2,capacity=1.25)");
    CHECK(moe_error("experts=4,top_k=5") ==
          "--moe 'experts=4,top_k=5' has top_k=5 with 4 experts; a token picks at most every expert once, so use top_k of at most 4");
    CHECK(moe_error("experts=4,top_k=2,capacity=0") ==
          "--moe 'experts=4,top_k=2,capacity=0' has capacity=0; the capacity factor is above 0 (1.0: an even share) and at most 64");
    CHECK(moe_error("experts=1,top_k=1") == "--moe 'experts=1,top_k=1' has experts=1; use 2 to 256 experts");
    CHECK(moe_error("experts=4,top_k=2,experts=4") == "--moe 'experts=4,top_k=2,experts=4' gives experts twice; give each once");
    CHECK(moe_error("experts=4,top_k=2.5").find("has top_k='2.5', which is not a whole number") != std::string::npos);
    CHECK(moe_error("experts=4,topk=2").find("has 'topk=2' where experts=, top_k=, capacity=, every= or aux= belongs") !=
          std::string::npos);
  }

  TEST_CASE("moe parameters: the router and each expert under nanoGPT's names, counted, and an EP rank's experts alone") {
    const GptSpec g = moe_gpt("experts=4,top_k=2,every=2");  // block 0 MoE, block 1 dense
    const std::vector<Parameter> ps = gpt_parameters(g);
    int64_t total = 0;
    std::vector<std::string> names;
    for (const Parameter& p : ps) {
      total += p.numel;
      names.push_back(p.name);
    }
    CHECK(total == g.num_params());
    const int64_t C = 8;
    CHECK(g.block_params(0) == 4 * C * C + 8 * C + 4 * C + 4 * (8 * C * C + 5 * C));
    CHECK(g.block_params(1) == 12 * C * C + 13 * C);
    CHECK(ps[static_cast<size_t>(GptParamIndex::router(g, 0))].name == "transformer.h.0.mlp.router.weight");
    CHECK(ps[static_cast<size_t>(GptParamIndex::router(g, 0))].shape == Shape{4, C});
    CHECK(ps[static_cast<size_t>(GptParamIndex::expert(g, 0, 3, GptParamIndex::ExProjW))].name == "transformer.h.0.mlp.experts.3.c_proj.weight");
    CHECK(ps[static_cast<size_t>(GptParamIndex::block(g, 1, GptParamIndex::FcW))].name == "transformer.h.1.mlp.c_fc.weight");
    CHECK(ps[static_cast<size_t>(GptParamIndex::ln_f_bias(g))].name == "transformer.ln_f.bias");
    // EP rank 1 of 2 holds experts 2 and 3, under their global numbers.
    GptSpec r1 = g;
    r1.moe.ep = 2;
    r1.moe.ep_rank = 1;
    std::vector<std::string> experts;
    for (const Parameter& p : gpt_parameters(r1))
      if (p.name.find(".experts.") != std::string::npos && p.name.ends_with("c_fc.weight")) experts.push_back(p.name);
    CHECK(experts == std::vector<std::string>{"transformer.h.0.mlp.experts.2.c_fc.weight", "transformer.h.0.mlp.experts.3.c_fc.weight"});
    CHECK(r1.num_params() == g.num_params() - 2 * (8 * C * C + 5 * C));
  }

  TEST_CASE("moe routing on equal logits: ties to the lower experts, capacity ceil(T K / E x F) in token order, Switch's loss") {
    // A zero router: every logit is 0, so every token picks experts 0 and 1 (the lower indices) with
    // weight 1/2 each, and the softmax over all experts is uniform.
    for (const double F : {0.0, 1.0, 1.5}) {
      CAPTURE(F);
      GptSpec g = moe_gpt("experts=4,top_k=2,aux=0.01", 1);
      g.moe.capacity = F;
      Model m(ModelSpec{{}, g}, nullptr, 3);
      const Parameter& router = m.parameters()[static_cast<size_t>(GptParamIndex::router(g, 0))];
      std::fill_n(router.data, router.numel, 0.0f);
      const int64_t B = 3, T = 4, BT = B * T;
      const std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
      m.forward_tokens(idx.data(), B);
      const GptCore::MoeRouting* r = m.gpt()->moe_routing(0);
      REQUIRE(r != nullptr);
      CHECK(r->tokens == BT);
      CHECK(r->routed == std::vector<int64_t>{BT, BT, 0, 0});
      const int64_t cap = F > 0 ? static_cast<int64_t>(std::ceil(BT * 2 / 4.0 * F)) : 0;  // 6 and 9
      CHECK(r->capacity == cap);
      const int64_t kept = cap > 0 ? std::min(cap, BT) : BT;
      CHECK(r->kept == std::vector<int64_t>{kept, kept, 0, 0});
      CHECK(r->dropped == 2 * (BT - kept));
      // E A / (K T^2) x sum_e (T / E) f_e = A x (f_0 + f_1) / (K T) = A: the loss of an even router.
      CHECK(r->aux_loss == doctest::Approx(0.01).epsilon(1e-6));
    }
  }

  TEST_CASE("moe backward equals finite differences of the loss plus the load-balancing loss, with drops") {
    GptSpec g = moe_gpt("experts=3,top_k=2,capacity=0.6,aux=0.5");  // capacity 4 of 16 pairs over 3 experts: drops
    Model m(ModelSpec{{}, g}, nullptr, 7);
    // A decisive router: nanoGPT's 0.02-wide initial router leaves logits so close that a step of h
    // anywhere below can change a token's experts, a jump finite differences cannot follow.
    for (int l : {0, 1}) {
      const Parameter& r = m.parameters()[static_cast<size_t>(GptParamIndex::router(g, l))];
      for (int64_t i = 0; i < r.numel; i++) r.data[i] *= 100.0f;
    }
    const int64_t B = 2, T = 4, V = 6;
    const std::vector<int64_t> idx = {0, 3, 5, 1, 2, 2, 4, 0}, tgt = {3, 5, 1, 2, 2, 4, 0, 1};
    m.zero_grad();
    std::vector<float> probs(static_cast<size_t>(B * T * V)), dlogits(probs.size());
    cross_entropy_forward(probs.data(), m.forward_tokens(idx.data(), B), tgt.data(), B * T, V);
    REQUIRE(m.gpt()->moe_routing(0)->dropped > 0);  // the case covers dropped pairs
    cross_entropy_backward(dlogits.data(), probs.data(), tgt.data(), B * T, V, 1.0f / static_cast<float>(B * T));
    m.set_aux_grad_scale(1.0f);
    std::vector<int> order;
    m.backward(dlogits.data(), [&](int p) { order.push_back(p); });
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    CHECK(order.size() == m.parameters().size());  // every parameter reported once, the experts and the router too
    const std::vector<float> grads(m.grads(), m.grads() + m.num_params());
    const test::FiniteDifferenceCheck fd = test::finite_differences(m, grads, [&] { return moe_loss(m, idx, tgt, B); });
    MESSAGE(fd.checked << " gradients checked, worst relative difference " << fd.worst << " at " << fd.at);
    CHECK(fd.worst < 2e-2);
  }

  TEST_CASE("expert parallelism: tokens cross by all-to-alls of the routed rows, and the run equals ddp without it") {
    TrainConfig c = test::demo_config("ddp", 4, 4, 3);
    c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
    c.data = "text";
    c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
    c.moe = MoeSpec::parse("experts=4,top_k=2,capacity=1.25,every=2");
    c.optimizer.kind = OptimizerKind::AdamW;
    Trainer ref(c);
    ref.run();
    c.ep = 2;
    Trainer t(c);
    t.run();
    // The whole model (rank 0 gathers every expert) equals DDP's.
    CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
    // Per rank and iteration: one MoE block (block 0) makes the counts' all-to-all, the dispatch and
    // the combine forward, and two all-to-alls backward, all on its EP group. The dispatch sends each
    // kept (token, expert) pair whose expert is on the other rank: its row of 16 floats.
    for (int rank = 0; rank < 4; rank++) {
      CAPTURE(rank);
      std::map<std::string, int> groups;
      std::vector<int64_t> bytes;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind != EventKind::Collective || e.iteration != 2 || e.coll.op != CollectiveOp::AllToAll) continue;
        groups[t.recorder().label(e.coll.group - 1)]++;
        bytes.push_back(e.coll.bytes);
      }
      CHECK(groups == std::map<std::string, int>{{rank < 2 ? "ep0: 0,1" : "ep1: 2,3", 5}});
      REQUIRE(bytes.size() == 5);
      CHECK(bytes[0] == 4 * 8);  // the counts: 2 int64 to each of the 2 ranks (nccl-tests' all-to-all size, count x ranks)
      // The last forward's routing on this rank: the pairs its other EP rank's experts take.
      const GptCore::MoeRouting* r = t.rank_model(rank).gpt()->moe_routing(0);
      REQUIRE(r != nullptr);
      const int other = 1 - rank % 2;
      const int64_t rows = r->kept[static_cast<size_t>(2 * other)] + r->kept[static_cast<size_t>(2 * other + 1)];
      CHECK(bytes[1] == rows * 16 * 4);  // dispatch
      CHECK(bytes[4] == bytes[2]);       // backward: the input gradients go back as the outputs did
      CHECK(rows > 0);
    }
    // clip_grad_norm_ over the whole model: the dense gradients once, every rank's experts once.
    c.clip_grad_norm = 0.05;
    c.ep = 1;
    Trainer clipped_ref(c);
    const TrainSummary cr = clipped_ref.run();
    c.ep = 2;
    Trainer clipped(c);
    const TrainSummary cs = clipped.run();
    CHECK(cs.steps == 3);
    CHECK(std::abs(cs.eval_loss - cr.eval_loss) < 1e-5);
    CHECK(test::max_abs_diff(clipped.result_model(), clipped_ref.result_model()) < 1e-5);
    c.clip_grad_norm = 0;
    // Refusals that name what to do instead.
    TrainConfig odd = c;
    odd.ep = 3;
    CHECK(test::error_of(odd) ==
          "--ep 3 does not divide --world 4; expert-parallel groups are runs of --ep consecutive ranks, so pick an --ep that divides the world");
    TrainConfig no_moe = c;
    no_moe.moe = {};
    CHECK(test::error_of(no_moe) == "--ep 2 splits the MoE blocks' experts over ranks; add --moe experts=E,top_k=K");
    TrainConfig hsdp_tp = c;
    hsdp_tp.world_size = 8;
    hsdp_tp.strategy = Strategy::Fsdp;
    hsdp_tp.fsdp.sharding = Sharding::Hybrid;
    hsdp_tp.fsdp.node_size = 4;
    hsdp_tp.tp = 2;
    hsdp_tp.sequence_parallel = true;
    CHECK(test::error_of(hsdp_tp).empty());  // a node: 4 data-parallel ranks x tp 2, two EP groups inside it
    hsdp_tp.fsdp.node_size = 1;
    hsdp_tp.ep = 4;
    CHECK(test::error_of(hsdp_tp) ==
          "--ep 4 with --sharding hybrid: an expert-parallel group of 4 consecutive ranks must lie inside a node of 2 ranks "
          "(--node-size 1 x --tp 2); use a --node-size that makes it a multiple of --ep");
    TrainConfig hybrid = c;
    hybrid.strategy = Strategy::Fsdp;
    hybrid.fsdp.sharding = Sharding::Hybrid;
    hybrid.fsdp.node_size = 1;
    CHECK(test::error_of(hybrid) ==
          "--ep 2 with --sharding hybrid: an expert-parallel group of 2 consecutive ranks must lie inside a node of --node-size 1 "
          "ranks; use a --node-size that makes it a multiple of --ep");
    TrainConfig whole = c;
    whole.strategy = Strategy::Fsdp;
    whole.fsdp.wrap_layers = false;
    CHECK(test::error_of(whole).rfind("--ep with --strategy fsdp --wrap model: each block's experts are a unit of their own", 0) == 0);
  }

  TEST_CASE("expert parallelism under fsdp: each block's experts a unit sharded over their expert-data-parallel group, and the run equals ddp") {
    // torchtitan's layout: an MoE block's experts are an FSDP unit of their own, beside the block's,
    // sharded over the ranks that hold the same experts (world / ep of them; one when ep = world) and
    // averaged over the data-parallel world, so the run is DDP's with --ep, which equals DDP without it.
    // FSDP1 FULL_SHARD, SHARD_GRAD_OP and NO_SHARD (the experts' unit all-reduced over its group), fully_shard
    // (FSDP2) with forward prefetch, HSDP (the experts sharded inside a node and replicated across nodes,
    // as the rest), clipping (the norm's pieces: the
    // dense shards once, every expert's once), --tp with --sequence-parallel, and --save-sharded (each
    // expert written once, by the rank owning its shard).
    test::TempDir dir("dtlab_moe_fsdp");
    struct Case {
      int world, tp, ep, api;
      Sharding sharding;
      double clip;
      int node = 0;  // HYBRID_SHARD's node size
    };
    std::vector<Case> cases = {{4, 1, 2, 1, Sharding::FullShard, 0}, {2, 1, 2, 1, Sharding::ShardGradOp, 0.05},
                               {4, 1, 2, 2, Sharding::Hybrid, 0, 2}, {4, 1, 2, 1, Sharding::NoShard, 0.05},
                               {4, 1, 2, 1, Sharding::Zero1, 0.05}};
    if (!test::quick()) {
      cases.push_back({4, 1, 2, 2, Sharding::FullShard, 0.05});
      cases.push_back({4, 2, 2, 1, Sharding::FullShard, 0});
      cases.push_back({8, 1, 2, 1, Sharding::Hybrid, 0.05, 4});
      cases.push_back({8, 2, 2, 1, Sharding::Hybrid, 0.05, 2});  // a node: 2 data-parallel ranks x tp 2
    }
    for (const Case& k : cases) {
      CAPTURE(k.world);
      CAPTURE(k.tp);
      CAPTURE(k.api);
      TrainConfig c = test::demo_config("ddp", k.world, 4, 3);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;
      c.moe = MoeSpec::parse("experts=4,top_k=2,capacity=1.25,every=2");
      c.optimizer.kind = OptimizerKind::AdamW;
      c.clip_grad_norm = k.clip;
      c.tp = k.tp;
      c.sequence_parallel = k.tp > 1;
      std::vector<double> ref_norms, norms;
      Trainer ref(c);
      const TrainSummary rs = ref.run([&](const StepReport& r) { ref_norms.push_back(r.grad_norm); });
      c.strategy = Strategy::Fsdp;
      c.fsdp.sharding = k.sharding;
      c.fsdp.node_size = k.node;
      c.fsdp.api = k.api;
      c.fsdp.forward_prefetch = k.api == 2;
      c.ep = k.ep;
      c.save_path = dir.file("whole.safetensors");
      c.save_sharded_path = dir.file("sharded");
      Trainer t(c);
      const TrainSummary s = t.run([&](const StepReport& r) { norms.push_back(r.grad_norm); });
      CHECK(s.steps == 3);
      CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-5);
      // Clipped, each step's norm (the dense shards' and every expert's pieces summed over the world) is
      // DDP's; AdamW then turns the last bits of a clipped gradient into a larger parameter difference.
      REQUIRE(norms.size() == ref_norms.size());
      for (size_t i = 0; i < norms.size(); i++) CHECK(norms[i] == doctest::Approx(ref_norms[i]).epsilon(1e-5));
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < (k.clip > 0 ? 5e-5 : 1e-5));
      const ModelSpec whole{{}, t.result_model().spec().gpt.whole()};
      Model saved(whole, nullptr, 7), sharded(whole, nullptr, 8);
      load_model_checkpoint(c.save_path, saved);
      load_model_checkpoint(c.save_sharded_path, sharded);
      CHECK(test::max_abs_diff(sharded, saved) == 0);
      // Units: the root, block 0's and its experts', block 1's (dense). The experts' unit is split over
      // the expert-data-parallel group, gathered and reduced on it (FULL_SHARD: twice and once an
      // iteration), its shard world / ep ranks wide; under HSDP the node's share of them (node / ep),
      // the reduced shard then all-reduced over the nodes.
      const int dense = k.node ? k.node : k.world / k.tp, edp = k.node ? k.node * k.tp / k.ep : k.world / k.ep;
      for (int rank = 0; rank < k.world; rank++) {
        CAPTURE(rank);
        std::map<int, int> shard_world;
        int gathers = 0, reduces = 0, replicas = 0;
        for (const Event& e : t.recorder().events(rank)) {
          if (e.kind == EventKind::FsdpUnit && e.fsdp.verb == FsdpVerb::Layout) shard_world[e.fsdp.unit] = e.fsdp.shard_world;
          if (e.kind != EventKind::Collective || e.iteration != 1 || e.coll.group == 0) continue;
          const std::string g = t.recorder().label(e.coll.group - 1);
          if (g.rfind(k.node ? "eshard" : "edp", 0) == 0) {
            gathers += e.coll.op == CollectiveOp::AllGather;
            const bool whole = k.sharding == Sharding::NoShard || k.sharding == Sharding::Zero1;
            reduces += e.coll.op == (whole ? CollectiveOp::AllReduce : CollectiveOp::ReduceScatter);
          }
          if (g.rfind("ereplicate", 0) == 0) replicas += e.coll.op == CollectiveOp::AllReduce;
        }
        CHECK(shard_world == std::map<int, int>{{0, dense}, {1, dense}, {2, edp}, {3, dense}});
        // (ZeRO-1: the step's all-gather of the experts' slices, over the same group.)
        CHECK(gathers == (k.sharding == Sharding::NoShard ? 0 : k.sharding == Sharding::ShardGradOp || k.sharding == Sharding::Zero1 ? 1 : 2));
        CHECK(reduces == 1);
        CHECK(replicas == (k.node ? 1 : 0));
      }
    }
  }

  TEST_CASE("expert parallelism with LoRA: the result is the whole frozen base with the adapters, and --merge-lora writes it merged") {
    // LoRA freezes every expert (its adapters are on c_attn): rank 0's result is the one-rank base (the
    // seed's, every expert) with its adapters. It hung before: rank 0 evaluated its expert-parallel
    // shard alone, its all-to-alls waiting for a rank that had moved on. Without and with --tp.
    test::TempDir dir("dtlab_moe_lora");
    auto run = [&](int world, int tp, int ep, const std::string& file) {
      TrainConfig c = test::demo_config("ddp", world, 4, 2);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;
      c.moe = MoeSpec::parse("experts=4,top_k=2");
      c.lora.rank = 4;
      c.tp = tp;
      c.sequence_parallel = tp > 1;
      c.ep = ep;
      c.save_path = dir.file(file);
      c.merge_lora = true;
      Trainer t(c);
      const TrainSummary s = t.run();
      Model merged(ModelSpec{{}, t.result_model().spec().gpt.whole()}, nullptr, 99);
      load_checkpoint(c.save_path, merged);
      return std::make_pair(s.eval_loss, merged.host_params());
    };
    const auto [ref_loss, ref] = run(2, 1, 1, "ref.safetensors");
    std::vector<std::array<int, 3>> cases = {{2, 1, 2}};
    if (!test::quick()) cases.push_back({4, 2, 2});
    for (const auto& k : cases) {
      CAPTURE(k[1]);
      const auto [loss, got] = run(k[0], k[1], k[2], "ep.safetensors");
      CHECK(std::abs(loss - ref_loss) < 1e-5);
      CHECK(test::max_abs_diff(got, ref) < 1e-5);
    }
  }

  TEST_CASE("expert parallelism and --save-sharded: each expert written once, by one of the ranks holding it") {
    // The dense parameters are deduped over the replicas as without --ep; an expert over the ranks
    // holding it (its expert-data-parallel group; under --tp the TP ranks may hold different experts, so
    // the TP rule "a whole piece is written by the lowest TP rank" does not apply to it). The index
    // then covers every element once (the loader checks) and loads into the one-rank model equal to
    // the run's --save. ddp, ddp with --tp, and a pipeline with --tp.
    test::TempDir dir("dtlab_moe_sharded");
    struct Case {
      const char* strategy;
      int world, tp, ep;
    };
    std::vector<Case> cases = {{"ddp", 4, 1, 2}, {"ddp", 4, 2, 2}};
    if (!test::quick()) cases.push_back({"pipeline", 8, 2, 4});
    for (const Case& k : cases) {
      CAPTURE(std::string(k.strategy));
      CAPTURE(k.tp);
      TrainConfig c = test::demo_config(k.strategy, k.world, 4, 2);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;
      c.moe = MoeSpec::parse("experts=4,top_k=2");
      c.tp = k.tp;
      c.sequence_parallel = k.tp > 1;
      c.ep = k.ep;
      if (c.strategy == Strategy::Pipeline) {
        c.pipeline.stages = 2;
        c.pipeline.dp = k.world / 2 / k.tp;
      }
      c.save_path = dir.file("whole.safetensors");
      c.save_sharded_path = dir.file("sharded");
      Trainer t(c);
      t.run();
      const ModelSpec whole{{}, t.result_model().spec().gpt.whole()};
      Model saved(whole, nullptr, 7), sharded(whole, nullptr, 8);
      load_model_checkpoint(c.save_path, saved);
      load_model_checkpoint(c.save_sharded_path, sharded);
      CHECK(test::max_abs_diff(sharded, saved) == 0);
      CHECK(test::max_abs_diff(saved, t.result_model()) == 0);
    }
  }

  TEST_CASE("expert parallelism under a pipeline: an EP group inside each stage, and the run equals the pipeline without it") {
    // p 2 stages x dp replicas; --ep 2 splits each stage's experts over pairs of replicas. Every MoE
    // block (every=1) routes over its stage's EP group; the dense gradients are summed over the
    // stage's replicas, the experts' over the replicas holding them. SGD with momentum and a large aux
    // coefficient, 1F1B and ZB-H1 (the experts' weight gradients in W), clipping, and dp 4 (an
    // expert-data-parallel group of 2): every parameter of the gathered model within 1e-5.
    auto config = [](int dp, const char* schedule) {
      TrainConfig c = test::demo_config("pipeline", 2 * dp, 4, 4);
      c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;
      c.moe = MoeSpec::parse("experts=4,top_k=2,capacity=1.25,aux=0.5");
      c.pipeline.stages = 2;
      c.pipeline.dp = dp;
      c.pipeline.microbatches = 2;
      c.pipeline.schedule = parse_schedule_kind(schedule);
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.lr = 0.05;
      c.optimizer.momentum = 0.9;
      return c;
    };
    auto check = [](TrainConfig c, int ep = 2) {
      Trainer ref(c);
      const TrainSummary rs = ref.run();
      c.ep = ep;
      Trainer t(c);
      const TrainSummary ts = t.run();
      CHECK(ts.steps == c.steps);
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
      CHECK(std::abs(ts.eval_loss - rs.eval_loss) < 1e-5);
    };
    for (const char* schedule : {"1f1b", "zb-h1"}) {
      CAPTURE(std::string(schedule));
      check(config(2, schedule));
    }
    TrainConfig clipped = config(2, "1f1b");
    clipped.clip_grad_norm = 0.05;
    check(clipped);
    if (!test::quick()) check(config(4, "1f1b"));
    // With --tp 2 (sequence parallel): a stage's EP groups take its TP ranks first, as under ddp.
    for (int ep : {2, 4}) {
      CAPTURE(ep);
      TrainConfig c = config(2, "1f1b");
      c.world_size = 8;
      c.tp = 2;
      c.sequence_parallel = true;
      c.clip_grad_norm = ep == 4 ? 0.05 : 0;
      check(c, ep);
    }
    // Each stage's all-to-alls run on its own EP group: ranks (replica, stage) = 2 x replica + stage.
    TrainConfig c = config(2, "1f1b");
    c.ep = 2;
    Trainer t(c);
    t.run();
    for (int rank = 0; rank < 4; rank++) {
      CAPTURE(rank);
      std::map<std::string, int> groups;
      for (const Event& e : t.recorder().events(rank))
        if (e.kind == EventKind::Collective && e.iteration == 2 && e.coll.op == CollectiveOp::AllToAll) groups[t.recorder().label(e.coll.group - 1)]++;
      // Its stage's one MoE block, per micro-batch: 3 all-to-alls forward and 2 backward.
      CHECK(groups == std::map<std::string, int>{{rank % 2 == 0 ? "ep0: 0,2" : "ep1: 1,3", 2 * 5}});
    }
    // An EP group of a stage is --ep of its replicas.
    TrainConfig odd = config(3, "1f1b");
    odd.ep = 2;
    CHECK(test::error_of(odd) ==
          "--ep 2 does not divide the 3 ranks of a stage (--world / --stages); a stage's expert-parallel groups are runs "
          "of --ep of them, so pick an --ep that divides 3 (--dp)");
  }
}

}  // namespace dtlab
