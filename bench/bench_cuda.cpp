// GPU benchmark, each figure beside a reference measured in the same run:
//  1. the training step of bench_step's model (mlp:256,1024,1024,10, batch 256, AdamW) on the GPU,
//     against the CPU engine's step (ratio = speed-up) with the first-step losses compared;
//  2. ring all-reduce of N ranks sharing the GPU (the cuda backend), nccl-tests columns (#wrong, algbw,
//     busbw = algbw * 2(n-1)/n), against the device's own device-to-device copy bandwidth.
// Without a CUDA device (or built without CUDA) it prints one line and exits 0.
// Usage: dtlab-bench-cuda [--model SPEC] [--batch B] [--steps N] [--world N]
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
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/comm/cuda_backend.h"
#include "engine/core/format.h"
#include "engine/core/model.h"
#include "engine/core/ops.h"
#include "engine/core/optim.h"
#include "engine/cuda/device.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/ops.h"
#include "engine/cuda/optim.h"

using namespace dtlab;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// 1. One training step, GPU and CPU, same model, weights and data.
void bench_step(const ModelSpec& spec, int64_t B, int64_t steps) {
  const int64_t D = spec.in_features(), K = spec.out_features(), warmup = 5;
  std::vector<float> x(static_cast<size_t>(B * D));
  std::vector<int64_t> y(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; b++) {
    for (int64_t j = 0; j < D; j++) x[size_t(b * D + j)] = static_cast<float>(std::sin(0.01 * double(b * D + j)));
    y[size_t(b)] = b % K;
  }
  OptimizerConfig oc;
  oc.kind = OptimizerKind::AdamW;
  oc.lr = 1e-3;
  oc.weight_decay = 0.01;

  cuda::RankDevice dev(0, 0);
  MemoryTracker mem;
  Model host(spec, nullptr, 0);
  cuda::DeviceModel model(host, &mem, dev);
  cuda::DeviceOptimizer opt(oc, model.num_params(), &mem, dev);
  cuda::DeviceTensor gx({B, D}, MemCategory::Activations, &mem, 0), gy({B}, MemCategory::Activations, &mem, 0, DType::I64);
  cuda::upload(gx, x.data(), dev.compute());
  cuda::upload(gy, y.data(), dev.compute());
  cuda::DeviceTensor probs({B, K}, MemCategory::Activations, &mem, 0), dlogits({B, K}, MemCategory::Activations, &mem, 0);
  cuda::DeviceTensor losses({B}, MemCategory::Activations, &mem, 0), loss({1}, MemCategory::Activations, &mem, 0);
  auto gpu_step = [&] {
    const auto t0 = Clock::now();
    model.zero_grad();
    const float* logits = model.forward(gx.f32(), B);
    cuda::cross_entropy_forward(dev, probs.f32(), losses.f32(), loss.f32(), logits, gy.i64(), B, K);
    cuda::cross_entropy_backward(dev, dlogits.f32(), probs.f32(), gy.i64(), B, K, 1.0f / float(B));
    model.backward(dlogits.f32());
    opt.step(model.params(), model.grads());
    dev.sync_compute();  // a step ends when the GPU has finished it
    return seconds_since(t0);
  };
  float gpu_first_loss = 0;
  for (int64_t i = 0; i < warmup; i++) {
    gpu_step();
    if (i == 0) cuda::download(&gpu_first_loss, loss, dev.compute());
  }
  std::vector<double> gpu_times;
  for (int64_t i = 0; i < steps; i++) gpu_times.push_back(gpu_step());

  Model cpu(spec, nullptr, 0);
  Optimizer cpu_opt(oc, cpu.num_params(), nullptr);
  std::vector<float> cprobs(size_t(B * K)), cdl(size_t(B * K));
  float cpu_first_loss = 0;
  auto cpu_step = [&](float* loss_out) {
    const auto t0 = Clock::now();
    cpu.zero_grad();
    const float* logits = cpu.forward(x.data(), B);
    const float l = cross_entropy_forward(cprobs.data(), logits, y.data(), B, K);
    if (loss_out) *loss_out = l;
    cross_entropy_backward(cdl.data(), cprobs.data(), y.data(), B, K, 1.0f / float(B));
    cpu.backward(cdl.data());
    cpu_opt.step(cpu.params(), cpu.grads());
    return seconds_since(t0);
  };
  cpu_step(&cpu_first_loss);
  std::vector<double> cpu_times;
  for (int64_t i = 0; i < std::min<int64_t>(steps, 20); i++) cpu_times.push_back(cpu_step(nullptr));

  const double g = 1e3 * median(gpu_times), c = 1e3 * median(cpu_times);
  std::printf("train step of %s, batch %lld, adamw, median of %lld GPU / %zu CPU steps\n", spec.str().c_str(),
              static_cast<long long>(B), static_cast<long long>(steps), cpu_times.size());
  std::printf("  gpu   %8.3f ms/step  %10.0f samples/s  first loss %.6f\n", g, double(B) / (g / 1e3), gpu_first_loss);
  std::printf("  cpu   %8.3f ms/step  %10.0f samples/s  first loss %.6f  (%d BLAS threads)\n", c, double(B) / (c / 1e3),
              cpu_first_loss, compute_threads());
  std::printf("  gpu/cpu speed-up %.1fx; first-loss difference %.2g\n", c / g, std::fabs(double(gpu_first_loss) - cpu_first_loss));
  std::printf("  device memory: %s charged to the rank (parameters, gradients, AdamW state, activations)\n",
              human_bytes(mem.stats().total_current).c_str());
  // PyTorch on the same GPU, same model, init, data and optimizer (bench/torch_step.py cuda).
  const std::string cmd = "/usr/bin/python3 " DTLAB_SOURCE_DIR "/bench/torch_step.py " + spec.str() + " " + std::to_string(B) +
                          " " + std::to_string(steps) + " " + std::to_string(warmup) + " 1 cuda 2>/dev/null";
  std::string out;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f)) out += buf;
    pclose(f);
  }
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || j.contains("error") || !j.contains("median_ms")) {
    std::printf("  pytorch (cuda) not measured: %s\n",
                j.is_object() && j.contains("error") ? j["error"].get<std::string>().c_str() : "/usr/bin/python3 with torch is not available");
    return;
  }
  const double t = j["median_ms"].get<double>();
  std::printf("  pytorch (cuda) %8.3f ms/step  %10.0f samples/s  first loss %.6f  (torch %s)\n", t, double(B) / (t / 1e3),
              j["first_loss"].get<double>(), j["torch"].get<std::string>().c_str());
  std::printf("  ratio dtlab/torch on the GPU: %.3f (below 1: dtlab's step is faster); first-loss difference %.2g\n", g / t,
              std::fabs(double(gpu_first_loss) - j["first_loss"].get<double>()));
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

// 2. Ring all-reduce on the cuda backend, nccl-tests style, inputs checked (#wrong).
int64_t bench_allreduce(int n) {  // returns #wrong over all sizes
  const double copy_bw = d2d_bandwidth(int64_t{256} << 20);
  std::printf("\nring all-reduce, cuda backend, %d ranks sharing GPU 0 (%s)\n", n, cuda::device_info(0).name.c_str());
  std::printf("  device-to-device copy bandwidth (reference): %.1f GB/s\n", copy_bw / 1e9);
  std::printf("  %12s %12s %6s %6s %10s %10s %10s %8s %7s\n", "size(B)", "count", "type", "redop", "time(us)",
              "algbw", "busbw", "#wrong", "/copy");
  WorldOptions o;
  o.record = false;
  o.trace_capacity = 16;
  o.timeout_s = 120;
  CudaWorld w(n, o);
  int64_t total_wrong = 0;
  for (int64_t count : {int64_t{1} << 18, int64_t{1} << 22, int64_t{1} << 24}) {
    std::vector<double> times;
    std::vector<int64_t> wrong(size_t(n), 0);
    w.run([&](int r, Communicator& c, RankContext& ctx, cuda::RankDevice& dev) {
      cuda::DeviceTensor buf({count}, MemCategory::CommBuffers, ctx.memory(), dev.device());
      std::vector<float> host(static_cast<size_t>(count));
      for (int it = 0; it < 12; it++) {
        for (int64_t i = 0; i < count; i++) host[size_t(i)] = float((r + 1) * ((i % 7) + 1));  // small integers: exact sums
        cuda::upload(buf, host.data(), dev.compute());
        c.barrier()->wait();
        const auto t0 = Clock::now();
        c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
        const double t = seconds_since(t0);
        if (r == 0 && it >= 2) times.push_back(t);
        if (it == 11) {
          cuda::download(host.data(), buf, dev.compute());
          for (int64_t i = 0; i < count; i++)
            wrong[size_t(r)] += host[size_t(i)] != float(n * (n + 1) / 2 * ((i % 7) + 1));
        }
      }
    });
    int64_t bad = 0;
    for (int64_t v : wrong) bad += v;
    total_wrong += bad;
    const double t = median(times), bytes = double(count) * 4;
    const double algbw = bytes / t, busbw = algbw * 2.0 * (n - 1) / n;
    std::printf("  %12.0f %12lld %6s %6s %10.1f %10.2f %10.2f %8lld %6.0f%%\n", bytes, static_cast<long long>(count),
                "float", "sum", t * 1e6, algbw / 1e9, busbw / 1e9, static_cast<long long>(bad), 100.0 * busbw / copy_bw);
  }
  std::printf("  busbw = algbw * 2(n-1)/n (nccl-tests); every step is a device copy or a reduction kernel\n"
              "  plus a host synchronization, so small sizes measure the stepping, large ones the memory\n");
  return total_wrong;
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_text = "mlp:256,1024,1024,10";
  int64_t B = 256, steps = 50;
  int world = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") spec_text = v;
    else if (k == "--batch") B = std::stoll(v);
    else if (k == "--steps") steps = std::stoll(v);
    else if (k == "--world") world = std::stoi(v);
    else {
      std::fprintf(stderr, "dtlab-bench-cuda: unknown flag %s; flags are --model --batch --steps --world\n", k.c_str());
      return 2;
    }
  }
  if (!cuda::cuda_available()) {
    std::printf("dtlab-bench-cuda: skipped: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  try {
    std::printf("%s\n", cuda::runtime_summary().c_str());
    bench_step(ModelSpec::parse(spec_text), B, steps);
    if (bench_allreduce(world) > 0) {
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
