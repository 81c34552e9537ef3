// The roofline's inputs (engine/core/op_cost.h, engine/trace/roofline.h): every layer's compute span
// carries the FLOPs and bytes of the textbook formulas, written out again here; the roof, a span's
// fraction of it, the peak table's lookups and PaLM's model FLOPs for MFU. A one-step CPU run each.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "engine/core/gpt.h"
#include "engine/train/train.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// Rank 0's compute spans of the first iteration, by (kind, layer).
std::map<std::pair<ComputeKind, int>, ComputeInfo> first_iteration_spans(Trainer& t) {
  std::map<std::pair<ComputeKind, int>, ComputeInfo> out;
  for (const Event& e : t.recorder().events(0))
    if (e.kind == EventKind::Compute && e.iteration == 0) out[{e.compute.kind, e.compute.layer}] = e.compute;
  return out;
}

}  // namespace

TEST_SUITE("roofline") {
  TEST_CASE("an MLP's layers carry 2 B in out FLOPs forward and twice that backward, and the bytes they move") {
    TrainConfig c = test::demo_config("single", 1, 16, 1);
    c.model = ModelSpec::parse("mlp:2,64,32,3");  // Sequential: 0 Linear(2,64) 1 ReLU 2 Linear(64,32) 3 ReLU 4 Linear(32,3)
    Trainer t(c);
    t.run();
    const auto spans = first_iteration_spans(t);
    const double B = 16;
    const struct { int layer; double in, out; } linears[] = {{0, 2, 64}, {2, 64, 32}, {4, 32, 3}};
    for (const auto& L : linears) {
      CAPTURE(L.layer);
      const ComputeInfo f = spans.at({ComputeKind::LayerForward, L.layer});
      CHECK(f.flops == 2 * B * L.in * L.out + B * L.out);  // the GEMM and the bias add
      CHECK(f.bytes == 4 * (B * L.in + L.in * L.out + L.out + B * L.out));  // x, W, b read; y written (fp32)
      const ComputeInfo b = spans.at({ComputeKind::LayerBackward, L.layer});
      // The weight gradient's GEMM always, the input gradient's except for the first layer (no dx).
      const double gemms = L.layer == 0 ? 1 : 2;
      CHECK(b.flops == gemms * 2 * B * L.in * L.out + B * L.out);
      const double weight_bytes = 4 * (B * L.out + B * L.in + 2 * L.in * L.out + 2 * L.out);  // dy, x; dW, db read and written
      CHECK(b.bytes == (L.layer == 0 ? weight_bytes : weight_bytes + 4 * (L.in * L.out + B * L.in)));  // W read, dx written
    }
    for (const auto& ln : {std::pair{1, 64.0}, std::pair{3, 32.0}}) {
      const int layer = ln.first;  // (not a structured binding: clang 14 refuses one inside CAPTURE's lambda)
      const double n = ln.second;
      CAPTURE(layer);
      CHECK(spans.at({ComputeKind::LayerForward, layer}).flops == B * n);
      CHECK(spans.at({ComputeKind::LayerForward, layer}).bytes == 4 * 2 * B * n);
      CHECK(spans.at({ComputeKind::LayerBackward, layer}).bytes == 4 * 3 * B * n);
    }
    CHECK(spans.at({ComputeKind::Loss, -1}).flops == 5 * B * 3);
    const double params = 2 * 64 + 64 + 64 * 32 + 32 + 32 * 3 + 3;
    CHECK(spans.at({ComputeKind::OptimizerStep, -1}).flops == 10 * params);
    CHECK(spans.at({ComputeKind::OptimizerStep, -1}).bytes == 4 * 7 * params);  // AdamW: p, g, m, v in; p, m, v out
  }

  TEST_CASE("a transformer block's span: 24 B T C^2 + 2 B T^2 C + 16 B T C FLOPs forward, twice that backward") {
    TrainConfig c = test::demo_config("single", 1, 4, 1);
    c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
    c.data = "text";
    Trainer t(c);
    t.run();
    const auto spans = first_iteration_spans(t);
    const double B = 4, T = 8, C = 16, BT = B * T, V = static_cast<double>(t.config().model.gpt.vocab);
    for (int layer : {1, 2}) {  // the blocks (0 is the embedding, 3 the head)
      CAPTURE(layer);
      // c_attn 3C^2, attention's projection C^2, the MLP's 4C^2 twice; q.k and a.v over the causal half.
      const double flops = 2 * BT * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + 2 * 2 * B * T * (T / 2) * C + 16 * BT * C;
      CHECK(spans.at({ComputeKind::LayerForward, layer}).flops == doctest::Approx(flops));
      CHECK(spans.at({ComputeKind::LayerBackward, layer}).flops == doctest::Approx(2 * flops));
      // Its weights are read once (12 C^2), the 2 heads' T x T scores four times.
      const ComputeInfo f = spans.at({ComputeKind::LayerForward, layer});
      CHECK(f.bytes == doctest::Approx(4 * (BT * C * 38 + 12 * C * C + 4 * B * 2 * T * T)));
    }
    CHECK(spans.at({ComputeKind::LayerForward, 3}).flops == doctest::Approx(2 * BT * C * V + 8 * BT * C));  // lm_head and ln_f
    // PaLM's model FLOPs per token: 6 N + 12 L C T, over every position of the step.
    const double N = static_cast<double>(t.config().model.num_params());
    CHECK(t.model_flops(BT) == doctest::Approx((6 * N + 12 * 2 * C * T) * BT));
    // An MoE block runs top_k of its experts a token: the model FLOPs count those (4 experts, top 2:
    // each block's 2 idle experts, 8 C^2 + 5 C each, left out), not every expert.
    TrainConfig moe = t.config();
    moe.moe = MoeSpec::parse("experts=4,top_k=2");
    moe.steps = 1;
    Trainer m(moe);
    const double all = static_cast<double>(m.config().model.num_params());
    CHECK(m.model_flops(BT) == doctest::Approx((6 * (all - 2 * 2 * (8 * C * C + 5 * C)) + 12 * 2 * C * T) * BT));
  }

  TEST_CASE("the roof: min(ceiling, intensity x bandwidth), a span's fraction of it, the datasheet table") {
    Roof roof;
    roof.flops_per_s = 100e9, roof.bytes_per_s = 10e9;
    CHECK(roof.ridge() == 10);
    CHECK(roof.attainable(1) == 10e9);
    CHECK(roof.attainable(100) == 100e9);
    RooflinePoint gemm{"forward 0", RooflineKind::Gemm, 50e9, 1e9, 1.0};  // intensity 50: compute-bound
    CHECK(fraction_of_roof(gemm, roof) == doctest::Approx(0.5));
    RooflinePoint relu{"forward 1", RooflineKind::Elementwise, 1e9, 8e9, 1.0};  // intensity 1/8: memory-bound
    CHECK(fraction_of_roof(relu, roof) == doctest::Approx(0.8));  // 8 GB/s of 10
    RooflinePoint copy{"allgather #1", RooflineKind::Collective, 0, 5e9, 1.0};
    CHECK(fraction_of_roof(copy, roof) == doctest::Approx(0.5));
    CHECK(fraction_of_roof(gemm, Roof{}) == 0);

    CHECK(std::string(find_gpu_peak("NVIDIA H200")->name) == "NVIDIA H200 SXM");
    CHECK(find_gpu_peak("NVIDIA H100 80GB HBM3")->hbm_bytes_per_s == 3.35e12);
    CHECK(std::string(find_gpu_peak("NVIDIA A100-SXM4-40GB")->name) == "NVIDIA A100 SXM 40GB");  // the longer match wins
    CHECK(find_gpu_peak("NVIDIA A100-SXM4-80GB")->fp32 == 19.5e12);
    CHECK(find_gpu_peak("NVIDIA GeForce RTX 4090") == nullptr);
    CHECK(gpu_roof("NVIDIA GeForce RTX 4090").valid() == false);
    CHECK(gpu_roof("NVIDIA H200").flops_per_s == 67e12);

    HardwareProfile p;
    p.sgemm_flops_per_thread = 40e9;
    p.intra.beta = 1 / 8e9;  // memcpy at 8 GB/s moves 16 GB/s of reads and writes
    const Roof cpu = cpu_roof(p, 2);
    CHECK(cpu.flops_per_s == 80e9);
    CHECK(cpu.bytes_per_s == doctest::Approx(16e9));
  }

  TEST_CASE("a collective's bytes are its busbw bytes, and the run's MFU divides by the measured CPU peak") {
    CollectiveInfo ar{};
    ar.op = CollectiveOp::AllReduce, ar.group_size = 4, ar.bytes = 4000, ar.in_count = ar.out_count = 1000;
    const OpCost c = collective_cost(ar);
    CHECK(c.bytes == doctest::Approx(4000 * 2.0 * 3 / 4));
    CHECK(c.flops == doctest::Approx(1000 * 3.0 / 4));
    CollectiveInfo ag = ar;
    ag.op = CollectiveOp::AllGather;
    CHECK(collective_cost(ag).flops == 0);

    TrainConfig cfg = test::demo_config("ddp", 2, 8, 1);
    Trainer t(cfg);
    CHECK(t.roof().flops_per_s == this_machine_profile().sgemm_flops_per_thread);  // one BLAS thread per rank
    CHECK(t.peak_flops() >= t.roof().flops_per_s);
    CHECK(t.model_flops(16) == 6.0 * static_cast<double>(cfg.model.num_params()) * 16);
    CHECK(mfu(t.model_flops(16), 0.5, 1e9) == doctest::Approx(t.model_flops(16) / 0.5 / 1e9));
  }

  TEST_CASE("MFU's peak is the whole world's hardware, launched or not: the step's model FLOPs are every rank's") {
    TrainConfig c = test::demo_config("ddp", 8, 8, 1);
    c.device = "cuda";
    c.backend = "nccl";
    CHECK(world_peak_flops(c, false, 1e15, 0, 16, 1) == 8e15);
    CHECK(world_peak_flops(c, true, 1e15, 0, 16, 1) == 8e15);  // one process a rank, a GPU each (it once read 1e15)
    c.backend = "cuda";                                          // every rank on device 0
    CHECK(world_peak_flops(c, false, 1e15, 0, 16, 1) == 1e15);
    c.device = "cpu";
    c.backend = "threads";  // 8 ranks of 1 thread on one 2-core machine
    CHECK(world_peak_flops(c, false, 0, 1e9, 2, 1) == 2e9);
    c.backend = "socket";  // launched: 2 machines of 4 processes, 2 cores each
    c.socket.local_world_size = 4;
    CHECK(world_peak_flops(c, true, 0, 1e9, 2, 1) == 4e9);
    c.socket.local_world_size = 1;  // a process a machine, 2 threads each
    CHECK(world_peak_flops(c, true, 0, 1e9, 2, 2) == 16e9);
  }
}
