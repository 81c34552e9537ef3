// GPU benchmark, each figure beside a reference measured in the same run:
//  1. a training step of the one Model on a CudaDevice (default: bench_step's model mlp:256,1024,1024,10,
//     batch 256, AdamW) against PyTorch's step on the same GPU (bench/torch_step.py ... cuda; ratio
//     dtlab/torch, first losses compared) and, when the model is small enough, the same Model on the
//     CPU device (speed-up). --gemm switches to a GEMM-bound model (mlp:4096,16384,16384,4096, batch
//     8192) and prints achieved TFLOP/s for both, so cuBLAS against torch is what the ratio measures;
//     --gpt times nanoGPT's GPT-2 small (gpt2-124m, batch 8 x 1024 tokens, fp32) against PyTorch eager
//     running tests/nanogpt_torch.py's GPT on the same GPU (tokens (b T + t) 7 % V, targets the next);
//  2. ring all-reduce of N ranks sharing the GPU (the cuda backend), 1 KiB to 1 GiB, nccl-tests columns
//     (#wrong, algbw, busbw = algbw * 2(n-1)/n) per rank and summed over the ranks, against the device's
//     own device-to-device copy bandwidth measured in the same run.
// Without a CUDA device (or built without CUDA) it prints one line and exits 0.
//  --precision bf16|fp16 runs dtlab's 16-bit layout (16-bit parameters, gradients and activations, fp32 master
//     weights: --precision) against PyTorch's usual 16-bit training on the same GPU, torch.autocast with fp32
//     parameters (and GradScaler's scale for fp16; the two layouts differ, as docs/gpu.md says); the losses then
//     agree to the 16-bit format's rounding only.
// Usage: dtlab-bench-cuda [--gemm | --gpt | --ring] [--model SPEC] [--batch B] [--steps N] [--cpu-steps N] [--world N]
//                         [--precision fp32|bf16|fp16]
//   --gemm is a preset (--model mlp:4096,16384,16384,4096 --batch 8192 --steps 10; explicit flags win);
//   --gpt one too (--model gpt2-124m --batch 8 --steps 10 --world 0);
//   --ring runs the all-reduce alone (no step); --world 0 skips the all-reduce; --cpu-steps 0 skips the CPU reference (skipped by default when a
//   step is over 200 GFLOP of GEMMs).
#include <cstdio>
#include <string>

#if !DTLAB_HAVE_CUDA

int main() {
  std::printf("dtlab-bench-cuda: skipped: built without CUDA (configure with the CUDA Toolkit)\n");
  return 0;
}

#else

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/collective.h"
#include "engine/core/device.h"
#include "engine/core/format.h"
#include "engine/core/model.h"
#include "engine/core/ops.h"
#include "engine/core/optim.h"
#include "engine/core/tensor.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/platform.h"

using namespace dtlab;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// FLOPs of the GEMMs of one training step of an MLP: per Linear of W weights, forward 2BW, backward
// 4BW (input and weight gradients), except the first Linear's input gradient, which nobody needs;
// biases, ReLUs, loss and optimizer are left out. The same count for dtlab and torch.
// A GPT's: its matmuls, forward 2 x (12 L C^2 + C V) per token plus the causal attention's q k^T and
// att v (2 x 2 x T/2 x C per token and layer), backward twice that.
double step_flops(const ModelSpec& spec, int64_t B) {
  if (spec.is_gpt()) {
    const GptSpec& g = spec.gpt;
    const double tokens = double(B) * double(g.ctx), C = double(g.embd);
    return 3.0 * tokens * (2.0 * (12.0 * double(g.layers) * C * C + C * double(g.vocab)) + 2.0 * double(g.layers) * double(g.ctx) * C);
  }
  double flops = 0;
  for (size_t i = 0; i + 1 < spec.dims.size(); i++)
    flops += (i == 0 ? 4.0 : 6.0) * double(B) * double(spec.dims[i]) * double(spec.dims[i + 1]);
  return flops;
}

struct StepTimes {
  std::vector<double> seconds;
  float first_loss = 0;
  int64_t tracked_bytes = 0;  // what the rank's tracker holds at the end
};

// Steps of the Model on `dev`, the trainer's per-step sequence (zero_grad, forward, loss with its
// stats on the device, backward, optimizer step); each step ends when the device has finished it
// (download of the loss stats, the trainer's one wait per step).
// A GPT reads `tok` (B x T ids; x is empty) and its rows are its positions.
StepTimes time_steps(Device& dev, const ModelSpec& spec, const std::vector<float>& x, const std::vector<int64_t>& y,
                     const std::vector<int64_t>& tok, int64_t B, int64_t warmup, int64_t steps, Precision precision) {
  const int64_t D = spec.in_features(), K = spec.out_features(), R = B * spec.rows_per_sample();
  const bool gpt = spec.is_gpt();
  OptimizerConfig oc;
  oc.kind = OptimizerKind::AdamW;
  oc.lr = 1e-3;
  oc.weight_decay = 0.01;  // torch.optim.AdamW's defaults (torch_step.py)
  MemoryTracker mem;
  Model model(spec, &mem, 0, dev);
  Optimizer opt(oc, model.num_params(), &mem, dev);
  if (is_mixed(precision)) {  // the model's .to(dtype), its fp32 master copy in the optimizer
    model.set_precision(precision);
    opt.init_master(model.params16(), model.half_format());
  }
  // The CPU reads the host vectors where they are; a GPU gets them uploaded once.
  Tensor gx, gy;
  const float* xp = x.data();
  const int64_t* tp = tok.data();
  const int64_t* yp = y.data();
  if (!dev.is_host()) {
    gx = gpt ? Tensor({R}, MemCategory::Activations, &mem, DType::I64, dev) : Tensor({B, D}, MemCategory::Activations, &mem, DType::F32, dev);
    gy = Tensor({R}, MemCategory::Activations, &mem, DType::I64, dev);
    dev.upload(gx.raw(), gpt ? static_cast<const void*>(tok.data()) : x.data(), gx.nbytes());
    dev.upload(gy.raw(), y.data(), gy.nbytes());
    xp = gx.f32();
    tp = gx.i64();
    yp = gy.i64();
  }
  Tensor probs({R, K}, MemCategory::Activations, &mem, DType::F32, dev);
  Tensor dlogits({R, K}, MemCategory::Activations, &mem, DType::F32, dev);
  Tensor stats({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::I64, dev);
  double* const s = reinterpret_cast<double*>(stats.raw());
  StepTimes out;
  for (int64_t i = 0; i < warmup + steps; i++) {
    const auto t0 = Clock::now();
    stats.zero();
    model.zero_grad();
    const float* logits = gpt ? model.forward_tokens(tp, B) : model.forward(xp, B);
    dev.cross_entropy_forward(probs.f32(), s, logits, yp, R, K);
    dev.cross_entropy_backward(dlogits.f32(), probs.f32(), yp, R, K, 1.0f / float(R));
    model.backward(dlogits.f32());
    if (model.mixed()) opt.step_mixed(model.params16(), model.grads16(), 1.0f);
    else opt.step(model.params(), model.grads());
    double h[kLossStatsDoubles];
    dev.download(h, s, sizeof h);  // a step ends when the device has finished it
    const double dt = seconds_since(t0);
    if (i == 0) out.first_loss = static_cast<float>(h[0] / double(R));
    if (i >= warmup) out.seconds.push_back(dt);
  }
  out.tracked_bytes = mem.stats().total_current;
  return out;
}

// PyTorch on the same GPU, same model, init, data and optimizer (bench/torch_step.py cuda).
nlohmann::json torch_step(const ModelSpec& spec, int64_t B, int64_t steps, int64_t warmup, Precision precision) {
  const std::string cmd = "/usr/bin/python3 " DTLAB_SOURCE_DIR "/bench/torch_step.py " + spec.str() + " " + std::to_string(B) +
                          " " + std::to_string(steps) + " " + std::to_string(warmup) + " 1 cuda " + precision_name(precision) +
                          " 2>/dev/null";
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  return nlohmann::json::parse(out, nullptr, false);
}

// 1. One training step: the GPU, PyTorch on the GPU, and the CPU engine when asked or cheap.
void bench_step(const ModelSpec& spec, int64_t B, int64_t steps, int64_t cpu_steps, Precision precision) {
  const double flops = step_flops(spec, B);
  // A GEMM-bound step warms up in two (cuBLAS picks its kernels on the first); small ones take five.
  const int64_t D = spec.in_features(), K = spec.out_features(), warmup = flops > 1e12 ? 2 : 5;
  const bool gpt = spec.is_gpt();
  std::vector<float> x(static_cast<size_t>(gpt ? 0 : B * D));
  std::vector<int64_t> y(static_cast<size_t>(B * spec.rows_per_sample())), tok(static_cast<size_t>(gpt ? B * D : 0));
  for (int64_t b = 0; b < B; b++) {
    if (gpt) {  // bench/torch_step.py's tokens: (b T + t) 7 % V, each position's target the next one
      for (int64_t t = 0; t < D; t++) {
        tok[size_t(b * D + t)] = (b * D + t) * 7 % K;
        y[size_t(b * D + t)] = (b * D + t + 1) * 7 % K;
      }
      continue;
    }
    for (int64_t j = 0; j < D; j++) x[size_t(b * D + j)] = static_cast<float>(std::sin(0.01 * double(b * D + j)));
    y[size_t(b)] = b % K;
  }
  StepTimes g;
  {
    std::unique_ptr<Device> gpu = cuda::make_device(0, 0);
    g = time_steps(*gpu, spec, x, y, tok, B, warmup, steps, precision);
  }  // its memory goes back before PyTorch runs on the same GPU
  const double gs = median(g.seconds);
  std::printf("train step of %s, batch %lld, adamw, %s, median of %lld steps after %lld warm-up (%.1f GFLOP of GEMMs per step)\n",
              spec.str().c_str(), static_cast<long long>(B), precision_name(precision), static_cast<long long>(steps),
              static_cast<long long>(warmup), flops / 1e9);
  std::printf("  gpu   %9.3f ms/step  %10.0f samples/s  %7.2f TFLOP/s  first loss %.6f\n", 1e3 * gs, double(B) / gs,
              flops / gs / 1e12, g.first_loss);
  std::printf("  device memory: %s charged to the rank (parameters, gradients, AdamW state, activations)\n",
              human_bytes(g.tracked_bytes).c_str());

  if (cpu_steps > 0) {
    const StepTimes c = time_steps(cpu_device(), spec, x, y, tok, B, 1, cpu_steps, precision);
    const double cs = median(c.seconds);
    std::printf("  cpu   %9.3f ms/step  %10.0f samples/s  %7.2f TFLOP/s  first loss %.6f  (%d BLAS threads)\n", 1e3 * cs,
                double(B) / cs, flops / cs / 1e12, c.first_loss, compute_threads());
    std::printf("  gpu/cpu speed-up %.1fx; first-loss difference %.2g\n", cs / gs,
                std::fabs(double(g.first_loss) - c.first_loss));
  } else {
    std::printf("  cpu   not measured (%.0f GFLOP per step; --cpu-steps N measures it)\n", flops / 1e9);
  }

  const nlohmann::json j = torch_step(spec, B, steps, warmup, precision);
  if (j.is_discarded() || !j.is_object() || j.contains("error") || !j.contains("median_ms")) {
    std::printf("  pytorch (cuda) not measured: %s\n",
                j.is_object() && j.contains("error") ? j["error"].get<std::string>().c_str() : "/usr/bin/python3 with torch is not available");
    return;
  }
  const double ts = j["median_ms"].get<double>() / 1e3;
  if (is_mixed(precision))
    std::printf("  (pytorch runs forward and loss under torch.autocast(%s): fp32 parameters, 16-bit GEMMs)\n", precision_name(precision));
  std::printf("  pytorch (cuda) %9.3f ms/step  %10.0f samples/s  %7.2f TFLOP/s  first loss %.6f  (torch %s)\n", 1e3 * ts,
              double(B) / ts, flops / ts / 1e12, j["first_loss"].get<double>(), j["torch"].get<std::string>().c_str());
  std::printf("  ratio dtlab/torch on the GPU: %.3f (below 1: dtlab's step is faster); first-loss difference %.2g\n", gs / ts,
              std::fabs(double(g.first_loss) - j["first_loss"].get<double>()));
}

// The device's own copy bandwidth: one stream, device to device, bytes / time (one direction).
double d2d_bandwidth(int64_t bytes) {
  cuda::RankDevice dev(0, 0);
  void *a = nullptr, *b = nullptr;
  DTLAB_CUDA_CHECK(cudaMalloc(&a, size_t(bytes)));
  DTLAB_CUDA_CHECK(cudaMalloc(&b, size_t(bytes)));
  cudaEvent_t e0, e1;
  DTLAB_CUDA_CHECK(cudaEventCreate(&e0));
  DTLAB_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 12; i++) {
    DTLAB_CUDA_CHECK(cudaEventRecord(e0, dev.comm()));
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(b, a, size_t(bytes), cudaMemcpyDeviceToDevice, dev.comm()));
    DTLAB_CUDA_CHECK(cudaEventRecord(e1, dev.comm()));
    DTLAB_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DTLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) t.push_back(ms / 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return double(bytes) / median(t);
}

// 2. Ring all-reduce on the cuda backend, nccl-tests style, inputs checked (#wrong), at 1 KiB to 1 GiB.
// Each ring step is one fused reduce-copy kernel (plan.h's RingStepWork). The ranks share one GPU's
// memory, so beside each rank's busbw the table sums the n ranks' against the device copy measured
// here: a reduce step reads two chunks and writes one, a copy step reads one and writes one, so at
// memcpy's own efficiency the summed busbw is 4/5 of the copy bandwidth (docs/gpu.md).
int64_t bench_allreduce(int n) {  // returns #wrong over all sizes
  const double copy_bw = d2d_bandwidth(int64_t{256} << 20);
  std::printf("\nring all-reduce, cuda backend (fused reduce-copy steps), %d ranks sharing GPU 0 (%s)\n", n,
              cuda::device_info(0).name.c_str());
  std::printf("  device-to-device copy bandwidth (reference, 256 MiB): %.1f GB/s\n", copy_bw / 1e9);
  std::printf("  %12s %12s %10s %10s %12s %12s %8s %9s %9s\n", "size(B)", "count", "time(us)", "algbw", "busbw/rank",
              "busbw summed", "#wrong", "rank/copy", "sum/copy");
  WorldOptions o;
  o.record = false;
  o.trace_capacity = 16;
  o.timeout_s = 300;
  std::unique_ptr<RankWorld> w = cuda::make_cuda_world(n, o);
  int64_t total_wrong = 0;
  double ratio_256m = 0, summed_256m = 0;
  for (int64_t count = int64_t{1} << 8; count <= int64_t{1} << 28; count <<= 2) {  // 1 KiB .. 1 GiB of floats
    const int iters = count >= (int64_t{1} << 26) ? 6 : 12;
    std::vector<double> times;
    std::vector<int64_t> wrong(size_t(n), 0);
    w->run([&](int r, Communicator& c, RankContext& ctx, Device& dev) {
      Tensor init({count}, MemCategory::CommBuffers, ctx.memory(), DType::F32, dev);
      Tensor buf({count}, MemCategory::CommBuffers, ctx.memory(), DType::F32, dev);
      std::vector<float> host(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; i++) host[size_t(i)] = float((r + 1) * ((i % 7) + 1));  // small integers: exact sums
      dev.upload(init.raw(), host.data(), init.nbytes());
      for (int it = 0; it < iters; it++) {
        dev.copy(buf.raw(), init.raw(), buf.nbytes());  // every iteration sums the same inputs
        dev.synchronize();  // the reset is not part of the timed collective
        c.barrier()->wait();
        const auto t0 = Clock::now();
        c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
        const double t = seconds_since(t0);
        if (r == 0 && it >= 2) times.push_back(t);
      }
      dev.download(host.data(), buf.raw(), buf.nbytes());
      for (int64_t i = 0; i < count; i++) wrong[size_t(r)] += host[size_t(i)] != float(n * (n + 1) / 2 * ((i % 7) + 1));
    });
    int64_t bad = 0;
    for (int64_t v : wrong) bad += v;
    total_wrong += bad;
    const double t = median(times), bytes = double(count) * 4;
    const double algbw = bytes / t, busbw = algbw * bus_bandwidth_factor(CollectiveOp::AllReduce, n);
    std::printf("  %12.0f %12lld %10.1f %10.2f %12.2f %12.2f %8lld %9.3f %9.3f\n", bytes, static_cast<long long>(count),
                t * 1e6, algbw / 1e9, busbw / 1e9, n * busbw / 1e9, static_cast<long long>(bad), busbw / copy_bw,
                n * busbw / copy_bw);
    if (count == int64_t{1} << 26) ratio_256m = n * busbw / copy_bw, summed_256m = n * busbw;
  }
  std::printf("  busbw = algbw * %s (nccl-tests); each step one fused reduce-copy kernel plus a host\n"
              "  synchronization, so small sizes measure the stepping, large ones the memory; summed: the %d\n"
              "  ranks share one GPU's memory, so one rank's busbw cannot pass 1/%d of what they reach together\n",
              collective_traits(CollectiveOp::AllReduce).busbw_formula(), n, n);
  std::printf("fused ring at 256 MiB: summed busbw %.1f GB/s = %.3f x the device copy (%.1f GB/s); at memcpy's efficiency 0.8\n",
              summed_256m / 1e9, ratio_256m, copy_bw / 1e9);
  return total_wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_text;
  int64_t B = 0, steps = 0, cpu_steps = -1;  // 0 / empty: the preset's; cpu_steps -1: 20 when cheap, else 0
  int world = -1;  // -1: the preset's (4, or 0 under --gpt)
  bool gemm = false, gpt = false, ring_only = false;
  Precision precision = Precision::FP32;
  for (int i = 1; i < argc; i++) {
    const std::string k = argv[i];
    if (k == "--gemm" || k == "--gpt") {
      (k == "--gemm" ? gemm : gpt) = true;
      continue;
    }
    if (k == "--ring") {
      ring_only = true;
      continue;
    }
    if (k != "--model" && k != "--batch" && k != "--steps" && k != "--cpu-steps" && k != "--world" && k != "--precision") {
      std::fprintf(stderr,
                   "dtlab-bench-cuda: unknown flag %s; flags are --gemm --gpt --ring --model --batch --steps --cpu-steps --world --precision\n",
                   k.c_str());
      return 2;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "dtlab-bench-cuda: %s needs a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    if (k == "--precision") {
      if (v != "fp32" && v != "bf16" && v != "fp16") {
        std::fprintf(stderr, "dtlab-bench-cuda: --precision %s is not a precision; use fp32, bf16 or fp16\n", v.c_str());
        return 2;
      }
      precision = parse_precision(v.c_str());
      continue;
    }
    const int64_t n = std::strtoll(v.c_str(), &end, 10);  // every flag but --model and --precision takes a whole number
    if (k != "--model" && (v.empty() || *end != '\0')) {
      std::fprintf(stderr, "dtlab-bench-cuda: %s %s is not a whole number\n", k.c_str(), v.c_str());
      return 2;
    }
    if (k == "--model") spec_text = v;
    else if (k == "--batch") B = n;
    else if (k == "--steps") steps = n;
    else if (k == "--cpu-steps") cpu_steps = n;
    else world = static_cast<int>(n);
  }
  // The presets: bench_step's model, or a GEMM-bound one where the GPU's FP32 peak, not its launch
  // latency, decides (explicit flags win over either).
  if (gemm && gpt) {
    std::fprintf(stderr, "dtlab-bench-cuda: --gemm and --gpt are two presets; give one\n");
    return 2;
  }
  if (spec_text.empty()) spec_text = gpt ? "gpt2-124m" : gemm ? "mlp:4096,16384,16384,4096" : "mlp:256,1024,1024,10";
  if (B < 1) B = gpt ? 8 : gemm ? 8192 : 256;
  if (steps < 1) steps = gpt || gemm ? 10 : 50;
  if (world < 0) world = gpt ? 0 : 4;  // the ring is the other presets' second half
  if (!cuda::cuda_available()) {
    std::printf("dtlab-bench-cuda: skipped: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  try {
    ModelSpec spec = ModelSpec::parse(spec_text);
    if (spec.is_gpt() && spec.gpt.vocab == 0) spec.gpt.vocab = 65;  // shakespeare_char's, as dtlab-bench-step
    if (cpu_steps < 0) cpu_steps = step_flops(spec, B) <= 200e9 ? 20 : 0;
    std::printf("%s\n", cuda::runtime_summary().c_str());
    if (!ring_only) bench_step(spec, B, steps, cpu_steps, precision);
    if (world > 0 && bench_allreduce(world) > 0) {
      std::fprintf(stderr, "dtlab-bench-cuda: the all-reduce gave wrong values (#wrong above)\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dtlab-bench-cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}

#endif  // DTLAB_HAVE_CUDA
