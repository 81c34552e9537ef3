// The planner's memory techniques (issue 17): --precision (the ZeRO paper's Table 1 in bf16, 2 + 2
// + 12 bytes), the course's half-precision accounting (14 + 14 + 28 = 56 GB at 7B), the gradient
// payload per step (28 GB fp32, 14 GB bf16, 14 MB for LoRA's 0.1%), LoRA's count on a Llama-7B
// shape, Korthikanti et al.'s activation formulas with and without recomputation, --json, and
// the one-sentence errors. Sources: docs/course_sources.md §6d.
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/memory_plan.h"
#include "tests/cli_util.h"
#include "tests/train_util.h"

using namespace dtlab;
using nlohmann::json;

namespace {

test::CliResult plan_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "plan");
  return test::run_cli(args);
}

json plan_json(std::vector<std::string> args) {
  args.push_back("--json");
  const test::CliResult r = plan_cli(args);
  INFO("stderr: ", r.err);
  REQUIRE(r.code == 0);
  return json::parse(r.out);
}

MemoryPlan ddp_7b(PlanDType dtype, bool half_state, double lora = 0, OptimizerKind opt = OptimizerKind::AdamW) {
  MemoryPlanInput in;
  in.params = 7e9;
  in.world = 1;
  in.sharding = Sharding::NoShard;
  in.dtype = dtype;
  in.optimizer = opt;
  in.half_optimizer_state = half_state;
  in.lora_params = lora;
  return plan_memory(in);
}

// Exit 2, nothing on stdout, one line on stderr holding `expect`.
void check_usage_error(const std::vector<std::string>& args, const std::string& expect) {
  const test::CliResult r = plan_cli(args);
  INFO("stderr: ", r.err);
  CHECK(test::one_sentence_usage_error(r));
  CHECK(r.err.find(expect) != std::string::npos);
}

}  // namespace

TEST_SUITE("plan_precision") {

TEST_CASE("plan --precision bf16: the ZeRO paper's Table 1 (7.5B, N_d = 64: 120, 31.4, 16.6, 1.88 GB)") {
  for (const char* precision : {"bf16", "fp16"}) {
    const json j = plan_json({"--params", "7.5B", "--world", "64", "--precision", precision});
    CHECK(j["precision"] == precision);
    CHECK(j["dtype"] == "mixed");
    CHECK(j["bytes_per_param"]["parameters"] == 2);
    CHECK(j["bytes_per_param"]["gradients"] == 2);
    CHECK(j["bytes_per_param"]["optimizer_state"] == 12);  // the paper's K
    CHECK(j["bytes_per_param"]["master_weights"] == 4);
    const std::vector<int64_t> totals = {120000000000LL, 31406250000LL, 16640625000LL, 1875000000LL};
    for (size_t i = 0; i < totals.size(); i++) CHECK(j["strategies"][i]["total"] == totals[i]);
  }
  // --dtype mixed stays the paper's fp16; bf16 and fp16 cost the same bytes.
  CHECK(parse_plan_dtype("mixed") == PlanDType::Fp16);
  CHECK(plan_json({"--params", "7.5B", "--world", "64", "--dtype", "mixed"})["precision"] == "fp16");
  const test::CliResult r = plan_cli({"--params", "7.5B", "--world", "64", "--precision", "bf16"});
  CHECK(r.out.find("mixed precision (bf16)") != std::string::npos);
  CHECK(r.out.find("parameters 2 (bf16), gradients 2 (bf16), optimizer state 12 (fp32 master copy, m, v)") != std::string::npos);
}

TEST_CASE("plan: gradients per step at 7B are 28 GB in fp32, 14 GB in bf16, 14 MB for LoRA's 0.1%") {
  CHECK(ddp_7b(PlanDType::Fp32, false).grad_payload == 28e9);
  CHECK(ddp_7b(PlanDType::Bf16, false).grad_payload == 14e9);
  CHECK(ddp_7b(PlanDType::Fp16, false, 7e6).grad_payload == 14e6);  // 0.1% of 7B trainable
  CHECK(plan_json({"--params", "7B", "--world", "8"})["grad_payload"] == 28000000000LL);
  CHECK(plan_json({"--params", "7B", "--world", "8", "--precision", "fp16"})["grad_payload"] == 14000000000LL);
  const test::CliResult r = plan_cli({"--params", "7B", "--world", "8", "--precision", "bf16", "--lora-params", "7M"});
  CHECK(r.out.find("Gradients per step: 14.00 MB (Ψ_L x 2 bytes") != std::string::npos);
  CHECK(r.out.find("Ψ_L = 7,000,000 trainable parameters (0.1% of Ψ)") != std::string::npos);
  // The other 16-bit layout beside this one: torch.autocast (train --amp) keeps fp32 gradients.
  const test::CliResult amp = plan_cli({"--params", "7B", "--world", "8", "--precision", "bf16"});
  CHECK(amp.out.find("torch.autocast instead (--amp bf16): parameters 4, gradients 4, optimizer state 8 (fp32, no master copy: 16 "
                     "bytes in all); gradients per step 28.00 GB (Ψ x 4, fp32 .grad, unless a comm hook casts it)") != std::string::npos);
  CHECK(r.out.find("torch.autocast instead") == std::string::npos);  // LoRA's run: not this comparison
}

TEST_CASE("plan: the course's 56 GB full fine-tuning against LoRA, and the paper's 16 bytes beside it") {
  // The course: model 14 + gradients 14 + optimizer 28 GB, i.e. AdamW's m and v in 2 bytes, no master.
  const MemoryPlan course = ddp_7b(PlanDType::Bf16, true);
  CHECK(course.parameters == 14e9);
  CHECK(course.gradients == 14e9);
  CHECK(course.optimizer_state == 28e9);
  CHECK(course.total == 56e9);
  CHECK(course.formula == "(2+2+4)Ψ");
  // LoRA at 0.1%: the frozen base (14 GB) plus 7M adapters at 2 + 2 + 4 bytes: 14.056 GB, not the
  // course's "~16 GB" (its remaining ~2 GB are not itemized by any of these parts).
  const MemoryPlan course_lora = ddp_7b(PlanDType::Bf16, true, 7e6);
  CHECK(course_lora.parameters == 2 * 7.007e9);
  CHECK(course_lora.gradients == 14e6);
  CHECK(course_lora.optimizer_state == 28e6);
  CHECK(course_lora.total == 14.056e9);
  CHECK(course_lora.formula == "2(Ψ+Ψ_L) + (2+4)Ψ_L");
  // The paper's layout: 16 bytes full, 2 bytes frozen + 16 per adapter parameter.
  CHECK(ddp_7b(PlanDType::Bf16, false).total == 112e9);
  CHECK(ddp_7b(PlanDType::Bf16, false, 7e6).total == 14.014e9 + 16 * 7e6 - 2 * 7e6);
  // SGD with momentum in the course's layout: 2 + 2 + 2.
  MemoryPlanInput sgd;
  sgd.params = 100;
  sgd.dtype = PlanDType::Fp16;
  sgd.optimizer = OptimizerKind::SGD;
  sgd.sgd_momentum = true;
  sgd.half_optimizer_state = true;
  sgd.sharding = Sharding::NoShard;
  CHECK(plan_memory(sgd).total == 600);
  const json j = plan_json({"--params", "7B", "--world", "1", "--strategy", "no-shard", "--precision", "bf16", "--optimizer-dtype", "half"});
  CHECK(j["optimizer_dtype"] == "half");
  CHECK(j["strategies"][0]["total"] == 56000000000LL);
  CHECK(j["bytes_per_param"]["master_weights"] == 0);
}

TEST_CASE("plan --lora-rank: adapters on a Llama-7B shape, payload and sharding of Ψ_L only") {
  // L = 32, h = 4096, r = 8: q, k, v, o give 32·4·8·8192; peft's Llama default (q, v) half that.
  CHECK(lora_param_count(32, 4096, 8, 4) == 8388608);
  CHECK(lora_param_count(32, 4096, 8, 2) == 4194304);  // 8.39 MB of bf16 gradients: the course's "~8 MB"
  const std::vector<std::string> args = {"--params", "7B", "--world", "4", "--precision", "bf16", "--lora-rank", "8",
                                         "--layers", "32", "--hidden", "4096"};
  const json j = plan_json(args);
  CHECK(j["lora"]["rank"] == 8);
  CHECK(j["lora"]["modules"] == 4);
  CHECK(j["lora"]["params"] == 8388608);
  CHECK(j["grad_payload"] == 2 * 8388608);
  CHECK(j.contains("mesh") == false);  // the shape sizes the adapters here, not a mesh
  const json& ddp = j["strategies"][0];
  CHECK(ddp["parameters"] == 2 * (7000000000LL + 8388608));
  CHECK(ddp["gradients"] == 2 * 8388608);
  CHECK(ddp["optimizer_state"] == 12 * 8388608);
  CHECK(ddp["comm_bytes"] == 2 * 3 * 2 * 8388608 / 4);  // 2(N-1)/N Ψ_L x 2 bytes
  CHECK(ddp["comm_formula"] == "2Ψ_L");
  const json& full = j["strategies"][3];
  CHECK(full["parameters"] == 2 * (7000000000LL + 8388608) / 4);
  CHECK(full["optimizer_state"] == 12 * 8388608 / 4);
  CHECK(full["formula"] == "2(Ψ+Ψ_L)/N_d + (2+12)Ψ_L/N_d");
  CHECK(full["comm_formula"] == "2(Ψ+Ψ_L) + Ψ_L");
  const test::CliResult r = plan_cli(args);
  CHECK(r.out.find("LoRA: r = 8 on 4 h x h projections in each of 32 layers (h = 4096): Ψ_L = L·n·r·2h = 8,388,608") != std::string::npos);
  CHECK(plan_json({"--params", "7B", "--world", "4", "--lora-rank", "8", "--lora-modules", "2", "--layers", "32", "--hidden", "4096"})
            ["lora"]["params"] == 4194304);
  // On a mesh the adapters split over t·p like the base: DP all-reduces Ψ_L/(t·p) in bf16.
  const json m = plan_json({"--params", "7B", "--world", "64", "--tp", "4", "--stages", "4", "--layers", "32", "--hidden", "4096",
                            "--seq", "2048", "--micro-batch", "1", "--micro-batches", "8", "--precision", "bf16", "--lora-rank", "8",
                            "--strategy", "no-shard"});
  const json& dp = m["mesh"]["traffic"][0];
  CHECK(dp["dim"] == "dp");
  CHECK(dp["bytes"] == 2 * 3 * (8388608 / 16) * 2 / 4);
  CHECK(dp["formula"] == "2(d-1)/d · Ψ_L/(t·p) · g");
}

TEST_CASE("plan --activation-checkpointing: Korthikanti et al.'s s·b·h·(34 + 5as/h) against 2·s·b·h") {
  // Llama-7B-like: s = 2048, b = 1, h = 4096, a = 32, L = 32.
  const ActivationPlan a = plan_activations(32, 4096, 2048, 1, 32);
  const double sbh = 2048.0 * 4096;
  CHECK(a.per_layer == sbh * (34 + 5.0 * 32 * 2048 / 4096));
  CHECK(a.per_layer == 956301312);
  CHECK(a.per_layer_checkpointed == 2 * sbh);
  CHECK(a.total == 32 * 956301312.0);
  CHECK(a.total_checkpointed == 32 * 2 * sbh);
  CHECK(a.saved == a.total - a.total_checkpointed);
  const std::vector<std::string> args = {"--params", "7B", "--world", "1", "--strategy", "no-shard", "--activation-checkpointing",
                                         "--layers", "32", "--hidden", "4096", "--seq", "2048", "--micro-batch", "1", "--heads", "32"};
  const json j = plan_json(args);
  CHECK(j["activations"]["per_layer"] == 956301312);
  CHECK(j["activations"]["total_checkpointed"] == 536870912);
  CHECK(j["activations"]["saved"] == 32LL * 956301312 - 536870912);
  CHECK(j.contains("mesh") == false);
  const test::CliResult r = plan_cli(args);
  CHECK(r.out.find("kept for backward   956.30 MB    30.60 GB") != std::string::npos);
  CHECK(r.out.find("with checkpointing   16.78 MB   536.87 MB") != std::string::npos);
}

TEST_CASE("plan: bad combinations of the memory flags are one sentence, exit 2") {
  const std::vector<std::string> ok = {"--params", "7B", "--world", "8"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = ok;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  check_usage_error(with({"--precision", "bf17"}), "precision 'bf17' is not known; use fp32 (dtlab's engine), bf16 or fp16");
  check_usage_error(with({"--precision", "bf16", "--dtype", "mixed"}), "give the precision once");
  check_usage_error(with({"--optimizer-dtype", "half"}), "--optimizer-dtype half keeps the optimizer state in the training dtype; add --precision bf16 or fp16");
  check_usage_error(with({"--optimizer-dtype", "fp8"}), "--optimizer-dtype 'fp8' is not known");
  check_usage_error(with({"--lora-rank", "8"}), "--lora-rank 8 counts adapters on each layer's h x h projections; add --layers, --hidden");
  check_usage_error(with({"--lora-rank", "8", "--layers", "2", "--hidden", "64", "--lora-params", "7M"}), "give LoRA's size once");
  check_usage_error(with({"--lora-modules", "2"}), "--lora-modules says how many projections per layer get adapters; add --lora-rank");
  check_usage_error(with({"--lora-rank", "128", "--layers", "2", "--hidden", "64"}), "LoRA rank 128 is larger than the hidden size 64");
  check_usage_error(with({"--lora-params", "8B"}), "LoRA's trainable parameters must be a whole number below the model's");
  check_usage_error(with({"--lora-params", "7M", "--unit-params", "1B"}), "the gathered unit is not modelled with LoRA");
  check_usage_error(with({"--heads", "32"}), "--heads sizes the attention's activations; add --activation-checkpointing");
  check_usage_error(with({"--activation-checkpointing", "--layers", "32", "--hidden", "4096"}),
                    "--activation-checkpointing counts activations of s x b x h per layer (Korthikanti et al.); add --seq, --micro-batch, --heads");
  check_usage_error(with({"--activation-checkpointing", "--tp", "2", "--layers", "32", "--hidden", "4096", "--seq", "8", "--micro-batch", "1", "--heads", "4"}),
                    "--activation-checkpointing plans one rank's full stack of layers; leave out --tp and --stages");
  CHECK_THROWS_WITH_AS(plan_activations(0, 1, 1, 1, 1), doctest::Contains("at least 1"), Error);
}

TEST_CASE("the lab's \"this run\" against the planner: DDP and single runs hold exactly the planned bytes") {
  // The memory view puts each rank's tracker beside plan_memory() for the running config; for
  // replicas (NO_SHARD) the two must agree to the byte, in fp32 with AdamW and with plain SGD.
  for (const char* strategy : {"ddp", "single"}) {
    for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::SGD}) {
      CAPTURE(strategy);
      CAPTURE(optimizer_name(kind));
      TrainConfig c = test::demo_config(strategy, std::string(strategy) == "ddp" ? 4 : 1, 32, 2);
      c.optimizer.kind = kind;
      Trainer t(c);
      const TrainSummary s = t.run();
      MemoryPlanInput in;
      in.params = 4547;
      in.world = c.world_size;
      in.sharding = Sharding::NoShard;
      in.optimizer = kind;
      const MemoryPlan p = plan_memory(in);
      for (const MemoryStats& m : s.rank_memory) {
        CHECK(m.peak_of(MemCategory::Parameters) == p.parameters);
        CHECK(m.peak_of(MemCategory::Gradients) == p.gradients);
        CHECK(m.peak_of(MemCategory::OptimizerState) == p.optimizer_state);
      }
    }
  }
}

}  // TEST_SUITE
