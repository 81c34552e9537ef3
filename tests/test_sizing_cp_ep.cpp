// Context and expert parallelism in the sizing calculator (engine/parallel/context_plan.h, moe_plan.h,
// rank_order.h through sizing.h) and `dtlab-cli plan --cp/--ep/--experts`: bytes per rank worked out by
// hand for a small layout (ring, zigzag, Ulysses; an MoE with experts over ep), the causal imbalance,
// Megatron-core's rank order (its own docstring's example), and the refusals, one sentence and exit 2.
// Sources: docs/course_sources.md §6h.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/sizing.h"
#include "tests/cli_util.h"

// A named namespace: in a unity batch, this file's helpers sit beside the other plan tests'.
namespace dtlab::test::plan_cp_ep {

namespace {

// L = 4, h = 64, a = 8, s = 128, b = 1, bf16 (e = 2), DDP, dp 2 x cp 4 = 8 GPUs: one node of dgx-h100x2.
SizingInput small_cp(CpLayout layout) {
  SizingInput in;
  in.params = 1e6, in.layers = 4, in.hidden = 64, in.heads = 8, in.seq = 128;
  in.global_batch = 2, in.micro_batch = 1, in.dp = 2, in.tp = 1, in.pp = 1, in.cp = 4;
  in.precision = PlanDType::Bf16, in.zero = 0, in.cp_layout = layout;
  return in;
}

// The same shape with 8 experts (top-2) in every other layer, ep 2 inside dp 8: edp = 8/2 = 4.
SizingInput small_moe() {
  SizingInput in = small_cp(CpLayout::Ring);
  in.cp = 1, in.dp = 8, in.global_batch = 8;
  in.moe = MoeConfig{.experts = 8, .top_k = 2, .ep = 2, .capacity_factor = 1.0, .moe_every = 2};
  return in;
}

test::CliResult plan_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return test::run_cli(args);
}

const std::vector<std::string> kShape = {"--params", "1M", "--layers", "4", "--hidden", "64", "--heads", "8", "--seq", "128",
                                         "--precision", "bf16"};

std::vector<std::string> shape_with(std::vector<std::string> extra) {
  std::vector<std::string> v = kShape;
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

}  // namespace

TEST_SUITE("plan_cp_ep") {
  TEST_CASE("plan cp: ring and zigzag pass K/V c-1 times forward, K/V and dK/dV backward, Ulysses 4 all-to-alls each way") {
    // Ring: 2·(c-1)·b·(s/c)·h·e = 2·3·32·64·2 = 24,576 bytes per layer forward, twice that backward.
    const SizingPlan ring = plan_sizing(small_cp(CpLayout::Ring));
    CHECK(ring.world == 8);
    CHECK(ring.cp_bytes == 4 * 3 * 24576.0);
    const SizingPlan zigzag = plan_sizing(small_cp(CpLayout::Zigzag));
    CHECK(zigzag.cp_bytes == ring.cp_bytes);
    // Ulysses: (c-1)/c · b·(s/c)·(2h + 2h)·e = 3/4·32·256·2 = 12,288 per layer forward, as much backward.
    const SizingPlan ulysses = plan_sizing(small_cp(CpLayout::Ulysses));
    CHECK(ulysses.cp_bytes == 4 * 2 * 12288.0);
    // Recomputation runs the forward, and its traffic, once more.
    SizingInput rc = small_cp(CpLayout::Ring);
    rc.recompute = true;
    CHECK(plan_sizing(rc).cp_bytes == 4 * 4 * 24576.0);
    // Grouped-query attention: 2 K/V heads of 8 make the blocks a quarter as wide.
    SizingInput gqa = small_cp(CpLayout::Ring);
    gqa.kv_heads = 2;
    CHECK(plan_sizing(gqa).cp_bytes == ring.cp_bytes / 4);
    // Activations split along the sequence: s·b·h·(34 + 5·a·s/h) = 8192·114 per layer, x 4 layers, / c.
    CHECK(ring.activations == 4 * 8192.0 * 114 / 4);
    // The weights stay replicated over the CP group: the same bytes as without CP.
    SizingInput no_cp = small_cp(CpLayout::Ring);
    no_cp.cp = 1;
    CHECK(ring.params == plan_sizing(no_cp).params);
    // The DDP all-reduce covers dp x cp = 8 ranks: 2·7/8·Ψ·2 bytes.
    CHECK(ring.dp_bytes == doctest::Approx(2.0 * 7 / 8 * 1e6 * 2));
    CHECK(sizing_line(ring, "cp.bytes").formula.find("3·2(c-1) · b·(s/c)·h · e") != std::string::npos);
  }

  TEST_CASE("plan cp: the contiguous ring's last rank does c blocks of causal work, the first 1, zigzag and Ulysses balance") {
    CHECK(cp_causal_imbalance(CpLayout::Ring, 4) == doctest::Approx(4 / 2.5));  // c over the mean (c+1)/2
    CHECK(cp_causal_imbalance(CpLayout::Zigzag, 4) == 1);
    CHECK(cp_causal_imbalance(CpLayout::Ulysses, 4) == 1);
    CHECK(cp_causal_imbalance(CpLayout::Ring, 1) == 1);
    const SizingPlan ring = plan_sizing(small_cp(CpLayout::Ring));
    CHECK(ring.cp_wait_seconds == doctest::Approx(ring.compute_seconds * ring.attention_flops / ring.model_flops * 0.6));
    CHECK(plan_sizing(small_cp(CpLayout::Zigzag)).cp_wait_seconds == 0);
    CHECK(ring.step_seconds == doctest::Approx(ring.compute_seconds + ring.cp_wait_seconds + ring.comm_seconds));
  }

  TEST_CASE("plan ep: experts split E/ep per rank, the rest replicated, 4 all-to-alls per MoE layer, edp = d·c/ep") {
    const SizingPlan p = plan_sizing(small_moe());
    // 2 MoE layers of 8·64² = 32,768 per expert: non-expert 1e6 - 2·32768 + 2·64·8 (routers), expert 2·8·32768.
    CHECK(p.moe.moe_layers == 2);
    CHECK(p.moe.non_expert == 935488);
    CHECK(p.moe.expert == 524288);
    CHECK(p.moe.total == 1459776);
    CHECK(p.moe.active == 935488 + 2 * 2 * 32768);
    CHECK(p.expert_dp == 4);
    CHECK(p.rank_params == 935488 + 524288 / 2);
    // bf16 with AdamW: 2 + 2 + 12 bytes per parameter, nothing sharded (DDP).
    CHECK(p.params == 2.0 * 1197632);
    CHECK(p.optimizer == 12.0 * 1197632);
    // One all-to-all: F·T·k·h·e·(ep-1)/ep = 1·128·2·64·2·1/2 = 16,384; 4 per MoE layer, 2 MoE layers, m = 1.
    CHECK(p.ep_bytes == 2 * 4 * 16384.0);
    // Experts' gradients all-reduced over their 4 replicas, the rest over all 8 DP ranks.
    CHECK(p.edp_bytes == doctest::Approx(2.0 * 3 / 4 * 262144 * 2));
    CHECK(p.dp_bytes == doctest::Approx(2.0 * 7 / 8 * 935488 * 2));
    CHECK(p.dense_flops == 6.0 * p.moe.active * 8 * 128);
    SizingInput padded = small_moe();
    padded.moe.capacity_factor = 1.25;
    CHECK(plan_sizing(padded).ep_bytes == p.ep_bytes * 1.25);
  }

  TEST_CASE("plan placement: Megatron-core's order tp-cp-ep-dp-pp, and which groups cross nodes") {
    // parallel_state.py's own example: 16 GPUs, tp 2, pp 4 (dp 2).
    const MegatronLayout doc{.tp = 2, .cp = 1, .ep = 1, .dp = 2, .pp = 4};
    CHECK(megatron_groups(doc, ParallelGroup::DP)[1] == std::vector<int>{1, 3});
    CHECK(megatron_groups(doc, ParallelGroup::PP)[0] == std::vector<int>{0, 4, 8, 12});
    CHECK(megatron_groups(doc, ParallelGroup::TP)[7] == std::vector<int>{14, 15});
    // CP sits next to TP, EP is carved out of dp x cp with the same stride.
    const MegatronLayout l{.tp = 2, .cp = 2, .ep = 2, .dp = 2, .pp = 2};
    CHECK(megatron_groups(l, ParallelGroup::CP)[0] == std::vector<int>{0, 2});
    CHECK(megatron_groups(l, ParallelGroup::DP)[0] == std::vector<int>{0, 4});
    CHECK(megatron_groups(l, ParallelGroup::DPCP)[0] == std::vector<int>{0, 2, 4, 6});
    CHECK(megatron_groups(l, ParallelGroup::EP)[0] == std::vector<int>{0, 2});
    CHECK(megatron_groups(l, ParallelGroup::EDP)[0] == std::vector<int>{0, 4});
    CHECK(megatron_groups(l, ParallelGroup::PP)[0] == std::vector<int>{0, 8});
    // On 8-GPU nodes: tp, cp and dp stay inside, pp crosses.
    CHECK(place_group(l, ParallelGroup::CP, 8).spanning == 0);
    CHECK(place_group(l, ParallelGroup::PP, 8).spanning == 8);
    // tp 8 fills the node, so a CP group of 2 crosses: the sizing line says so.
    SizingInput in = small_cp(CpLayout::Ring);
    in.tp = 8, in.heads = 8, in.cp = 2, in.dp = 1, in.global_batch = 1;
    const SizingPlan p = plan_sizing(in);
    CHECK(sizing_line(p, "tp.spanning").value == 0);
    CHECK(sizing_line(p, "cp.spanning").value == 8);
    CHECK(sizing_line(p, "cp.spanning").formula == "2 ranks 8 apart: 8 of 8 groups cross nodes (InfiniBand)");
    CHECK(p.cp_seconds == doctest::Approx(p.cp_bytes / 50e9));
  }

  TEST_CASE("plan --cp/--ep: the CLI prints and exports the figures, a spec string carries them to sizing(...)") {
    const test::CliResult r = plan_cli(shape_with({"--global-batch", "2", "--dp", "2", "--cp", "4", "--cp-layout", "zigzag"}));
    INFO("stderr: ", r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("Layout: dp 2 x tp 1 x cp 4 x pp 1 = 8 GPUs") != std::string::npos);
    CHECK(r.out.find("zigzag layout, 32 tokens per rank") != std::string::npos);
    CHECK(r.out.find("294.91 kB  (L/p)·m · 3·2(c-1) · b·(s/c)·h · e") != std::string::npos);
    const test::CliResult j = plan_cli(shape_with({"--global-batch", "8", "--dp", "8", "--experts", "8", "--ep", "2", "--moe-every", "2", "--json"}));
    REQUIRE(j.code == 0);
    const nlohmann::json f = nlohmann::json::parse(j.out)["sizing"]["figures"];
    CHECK(f["ep.bytes"]["value"] == 131072);
    CHECK(f["moe.edp"]["value"] == 4);
    CHECK(f["ep.spanning"]["formula"] == "2 ranks 1 apart: inside a node (NVSwitch)");
    const SizingInput back = parse_sizing_spec(sizing_spec(small_moe()));
    CHECK(plan_sizing(back).ep_bytes == plan_sizing(small_moe()).ep_bytes);
    CHECK(parse_sizing_spec("cp=4 cp_layout=ulysses").cp_layout == CpLayout::Ulysses);
  }

  TEST_CASE("plan --cp/--ep: layouts that describe no run are one sentence, exit 2") {
    struct Refusal {
      std::vector<std::string> flags;
      std::string says;
    };
    const std::vector<Refusal> refusals = {
        {{"--global-batch", "2", "--dp", "2", "--cp", "16", "--cp-layout", "ulysses"},
         "Ulysses gives each of the --cp 16 ranks whole attention heads, but 8 heads do not divide by 16"},
        {{"--global-batch", "2", "--cp-layout", "zigzag"}, "--cp-layout chooses how a context-parallel group splits attention; add --cp 2"},
        {{"--global-batch", "2", "--cp", "3"}, "sequence length 128 does not split into 3 equal chunks for --cp 3"},
        {{"--global-batch", "2", "--cp", "128", "--cp-layout", "zigzag"}, "does not split into 256 equal chunks"},
        {{"--global-batch", "2", "--cp", "2", "--cp-layout", "spiral"}, "--cp-layout 'spiral' is not known; use ring, zigzag or ulysses"},
        {{"--global-batch", "8", "--dp", "8", "--experts", "8", "--ep", "3"}, "--experts 8 do not split evenly over --ep 3"},
        {{"--global-batch", "8", "--dp", "8", "--experts", "8", "--top-k", "9"}, "--top-k 9 routes each token to more experts than the 8"},
        {{"--global-batch", "8", "--dp", "8", "--ep", "2"}, "--ep describes a mixture of experts; add --experts E"},
        {{"--global-batch", "4", "--dp", "4", "--experts", "16", "--ep", "16"}, "--ep 16 does not divide dp x cp = 4"},
        {{"--global-batch", "8", "--dp", "8", "--experts", "8", "--moe-every", "3"}, "--moe-every 3 does not divide the 4 layers"},
    };
    for (const Refusal& refusal : refusals) {
      const test::CliResult r = plan_cli(shape_with(refusal.flags));
      INFO("expected: ", refusal.says, "\nstderr: ", r.err);
      CHECK(test::one_sentence_usage_error(r));
      CHECK(r.err.find(refusal.says) != std::string::npos);
    }
  }
}

}  // namespace dtlab::test::plan_cp_ep
