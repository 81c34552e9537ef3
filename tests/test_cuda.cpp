// The CUDA device (engine/cuda/cuda_device.h) against the CPU device, llm.c style: every method of the
// device interface on random data on both, each printing its max difference (relative to
// max(1, |cpu|); tolerance 1e-5), a whole training step of the one Model on the GPU, tensors on the
// GPU in the rank's tracker, GPU-timed compute events; the cuda backend against the threads backend:
// every collective bit for bit (same algorithm, same additions in the same order), ring steps in
// NCCL's order, one stepper gate per ring step; and the one Trainer on --device cuda following the
// CPU engine step by step. (tests/test_devices.cpp runs every strategy on both devices.)
//
// Skipping: doctest has no skip decided at run time, so without a device each case prints
// "skipped: no CUDA device (...)" with MESSAGE and returns; CTest turns that line into a skipped test
// (SKIP_REGULAR_EXPRESSION in CMakeLists.txt). Built without CUDA, one case says
// "skipped: built without CUDA".
#include <doctest/doctest.h>

#if !DTLAB_HAVE_CUDA

TEST_CASE("cuda: skipped: built without CUDA" * doctest::test_suite("cuda")) {
  MESSAGE("skipped: built without CUDA (configure with the CUDA Toolkit, DTLAB_CUDA=AUTO or ON)");
}

#else

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/comm/plan.h"
#include "engine/core/device.h"
#include "engine/core/model.h"
#include "engine/core/ops.h"
#include "engine/core/optim.h"
#include "engine/core/tensor.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/rank_device.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/platform.h"
#include "engine/trace/context.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/event.h"
#include "engine/train/train.h"

using namespace dtlab;
using cuda::CudaDevice;
using cuda::RankDevice;

// Every GPU case starts with this: the reason is visible in doctest's output and in CTest's.
#define DTLAB_REQUIRE_CUDA_DEVICE()                                     \
  do {                                                                  \
    if (!cuda::cuda_available()) {                                      \
      MESSAGE(("skipped: " + cuda::unavailable_reason()));              \
      return;                                                           \
    }                                                                   \
  } while (0)

namespace {

constexpr double kTol = 1e-5;

using test::random_floats;

// Rank 0's place on GPU 0 as a Device, owning its streams and cuBLAS handle. Declare it before the
// tensors that live on it: they free on its stream.
std::unique_ptr<CudaDevice> gpu0() { return std::make_unique<CudaDevice>(std::make_unique<RankDevice>(0, 0)); }

Tensor on_device(const void* host, Shape shape, Device& dev, DType dt = DType::F32, MemoryTracker* tracker = nullptr,
                 MemCategory category = MemCategory::Other) {
  Tensor t(std::move(shape), category, tracker, dt, dev);
  dev.upload(t.raw(), host, t.nbytes());
  return t;
}
Tensor on_device(const std::vector<float>& v, Device& dev) {
  return on_device(v.data(), {static_cast<int64_t>(v.size())}, dev);
}

std::vector<float> on_host(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  t.device().download(v.data(), t.raw(), t.nbytes());
  return v;
}

// The two doubles a loss leaves on the device (engine/core/device.h): loss x rows, correct rows.
struct LossStats {
  explicit LossStats(Device& dev) : t({kLossStatsDoubles}, MemCategory::Other, nullptr, DType::I64, dev) {}
  double* ptr() { return reinterpret_cast<double*>(t.raw()); }
  std::vector<double> read() {
    std::vector<double> h(kLossStatsDoubles);
    t.device().download(h.data(), t.raw(), t.nbytes());
    return h;
  }
  Tensor t;
};

// Max |gpu - cpu| / max(1, |cpu|), printed like llm.c's checkers.
double max_diff(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); i++)
    worst = std::max(worst, std::fabs(double(gpu[i]) - cpu[i]) / std::max(1.0, std::fabs(double(cpu[i]))));
  char num[32];
  std::snprintf(num, sizeof num, "%.3g", worst);
  MESSAGE((what + ": max difference " + num));
  return worst;
}

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("cuBLAS is loaded on first use, not at start: a CPU run and --help do not map it") {
  // dtlab-cli's own start does not load libcublas (it cost every start 0.45 s of CPU when linked).
  const std::string maps_before = [] {
    std::ifstream in("/proc/self/maps");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  const bool was_loaded = maps_before.find("libcublas.so") != std::string::npos;
  CHECK(dtlab::cuda::cublas_load_error() == "");  // loads it now (no GPU needed)
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");  // cuBLAS's own text, not a load error
  std::ifstream in("/proc/self/maps");
  const std::string maps((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(maps.find("libcublas.so") != std::string::npos);
  if (was_loaded) MESSAGE("libcublas was already loaded by an earlier test");
}

TEST_CASE("without a device: cuda_available() is false with a reason, and every way in says so in one sentence") {
  if (cuda::cuda_available()) {
    CHECK(cuda::device_count() > 0);
    CHECK(cuda::unavailable_reason().empty());
    CHECK(cuda::available());
    MESSAGE(cuda::runtime_summary());
    return;
  }
  CHECK(cuda::device_count() == 0);
  CHECK(!cuda::available());
  CHECK(cuda::unavailable_reason().rfind("no CUDA device", 0) == 0);
  CHECK_THROWS_WITH_AS(CudaWorld(2), doctest::Contains("the cuda backend needs a CUDA device"), Error);
  // The platform's doors (engine/cuda/platform.h), which the trainer and the lab use.
  CHECK_THROWS_WITH_AS(cuda::make_cuda_world(2, {}), doctest::Contains("--backend cuda: no CUDA device"), Error);
  CHECK_THROWS_WITH_AS(cuda::make_device(0, 0), doctest::Contains("--device cuda: no CUDA device"), Error);
  // The CPU device has no device-side memory figure.
  int64_t used = -1, total = -1;
  CHECK(!cpu_device().memory_info(used, total));
  CHECK(cpu_device().make_timer(nullptr).get() == nullptr);
  MESSAGE(("no device here, as expected in CI: " + cuda::runtime_summary()));
}

TEST_CASE("tensors on the GPU: charged to the rank's tracker while alive, the device's own figure beside it") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  CHECK(dev.kind() == DeviceKind::CUDA);
  CHECK(!dev.is_host());
  CHECK(dev.name() == "cuda:0");
  MemoryTracker mem;
  const cuda::DeviceMemory before = cuda::device_memory(0);
  CHECK(before.total_bytes > 0);
  {
    Tensor a({1000, 256}, MemCategory::Parameters, &mem, DType::F32, dev);
    Tensor b({300}, MemCategory::Activations, &mem, DType::I64, dev);
    CHECK(&a.device() == &dev);
    CHECK(mem.stats().current_of(MemCategory::Parameters) == 1000 * 256 * 4);
    CHECK(mem.stats().current_of(MemCategory::Activations) == 300 * 8);
    CHECK(on_host(a) == std::vector<float>(256000, 0.0f));  // zero-filled
    Tensor moved = std::move(a);
    CHECK(a.empty());
    CHECK(&moved.device() == &dev);
    CHECK(mem.stats().current_of(MemCategory::Parameters) == 1000 * 256 * 4);  // moved, not copied
    int64_t used = 0, total = 0;
    REQUIRE(dev.memory_info(used, total));
    CHECK(total == before.total_bytes);
    CHECK(used > 0);
    MESSAGE("device 0: " << used << " of " << total << " bytes used");
  }
  CHECK(mem.stats().total_current == 0);
  CHECK(mem.stats().peak_of(MemCategory::Parameters) == 1000 * 256 * 4);
}

TEST_CASE("device memory: upload, copy, fill_zero and download round-trip, and scale, scale_copy and accumulate equal the CPU device") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  const int64_t n = 100003;
  std::vector<float> v = random_floats(size_t(n), 11);
  std::vector<float> staged = v;
  Tensor a({n}, MemCategory::Other, nullptr, DType::F32, dev), b({n}, MemCategory::Other, nullptr, DType::F32, dev);
  dev.upload(a.raw(), staged.data(), a.nbytes());
  std::fill(staged.begin(), staged.end(), -7.0f);  // the contract: the host buffer may be reused on return
  dev.copy(b.raw(), a.raw(), a.nbytes());
  CHECK(on_host(a) == v);
  CHECK(on_host(b) == v);
  dev.fill_zero(a.raw(), 100 * 4);  // the first 100 elements
  std::vector<float> z = on_host(a);
  CHECK(std::count(z.begin(), z.begin() + 100, 0.0f) == 100);
  CHECK(std::equal(z.begin() + 100, z.end(), v.begin() + 100));

  std::vector<float> want = v, want_copy(static_cast<size_t>(n), 0.0f);
  cpu_device().scale(want.data(), n, 0.37f);
  cpu_device().scale_copy(want_copy.data(), v.data(), n, -1.5f);
  dev.scale(b.f32(), n, 0.37f);
  dev.scale_copy(a.f32(), on_device(v, dev).f32(), n, -1.5f);  // the temporary frees after the kernel, in stream order
  dev.synchronize();
  CHECK(max_diff(on_host(b), want, "scale") == 0);
  CHECK(max_diff(on_host(a), want_copy, "scale_copy") == 0);

  // accumulate: what a process group adds a received partial with (sum, or max).
  const std::vector<float> w = random_floats(size_t(n), 12);
  for (bool max : {false, true}) {
    std::vector<float> acc = v;
    cpu_device().accumulate(acc.data(), w.data(), n, max);
    Tensor g = on_device(v, dev), gw = on_device(w, dev);
    dev.accumulate(g.f32(), gw.f32(), n, max);
    CHECK(max_diff(on_host(g), acc, max ? "accumulate (max)" : "accumulate (sum)") == 0);
  }
  dev.bind_thread();  // another thread's work for this rank starts with it; harmless here
}

TEST_CASE("linear forward and backward match the CPU ops (cuBLAS transposes, bias, accumulation)") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  const int64_t B = 37, C = 53, OC = 29;  // odd sizes: leading dimensions must be right
  auto x = random_floats(B * C, 1), w = random_floats(OC * C, 2), b = random_floats(OC, 3);
  auto dout = random_floats(B * OC, 4);
  std::vector<float> out(B * OC), dx(B * C), dw(OC * C, 0.25f), db(OC, -0.5f);  // grads accumulate
  linear_forward(out.data(), x.data(), w.data(), b.data(), B, C, OC);
  linear_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), B, C, OC);

  Tensor gx = on_device(x, dev), gw = on_device(w, dev), gb = on_device(b, dev), gdout = on_device(dout, dev);
  Tensor gout({B * OC}, MemCategory::Other, nullptr, DType::F32, dev), gdx({B * C}, MemCategory::Other, nullptr, DType::F32, dev);
  Tensor gdw = on_device(std::vector<float>(OC * C, 0.25f), dev), gdb = on_device(std::vector<float>(OC, -0.5f), dev);
  dev.linear_forward(gout.f32(), gx.f32(), gw.f32(), gb.f32(), B, C, OC);
  dev.linear_backward(gdx.f32(), gdw.f32(), gdb.f32(), gdout.f32(), gx.f32(), gw.f32(), B, C, OC);
  CHECK(max_diff(on_host(gout), out, "linear forward") < kTol);
  CHECK(max_diff(on_host(gdx), dx, "linear d input") < kTol);
  CHECK(max_diff(on_host(gdw), dw, "linear d weight (accumulated)") < kTol);
  CHECK(max_diff(on_host(gdb), db, "linear d bias (accumulated)") < kTol);

  // Without bias, and without an input gradient (the first layer).
  linear_forward(out.data(), x.data(), w.data(), nullptr, B, C, OC);
  dev.linear_forward(gout.f32(), gx.f32(), gw.f32(), nullptr, B, C, OC);
  CHECK(max_diff(on_host(gout), out, "linear forward, no bias") < kTol);
  linear_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), B, C, OC);
  dev.linear_backward(nullptr, gdw.f32(), nullptr, gdout.f32(), gx.f32(), gw.f32(), B, C, OC);
  CHECK(max_diff(on_host(gdw), dw, "linear d weight, second accumulation") < kTol);
  // Zero-bubble's halves: the input gradient alone (no input, no weight gradient).
  linear_backward(dx.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), B, C, OC);
  dev.linear_backward(gdx.f32(), nullptr, nullptr, gdout.f32(), nullptr, gw.f32(), B, C, OC);
  CHECK(max_diff(on_host(gdx), dx, "linear d input alone") < kTol);
}

TEST_CASE("relu forward and backward equal the CPU ops exactly") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  const int64_t N = 100003;
  auto x = random_floats(N, 5), dout = random_floats(N, 6);
  std::vector<float> out(N), dx(N);
  relu_forward(out.data(), x.data(), N);
  relu_backward(dx.data(), dout.data(), out.data(), N);
  Tensor gx = on_device(x, dev), gd = on_device(dout, dev);
  Tensor gout({N}, MemCategory::Other, nullptr, DType::F32, dev), gdx({N}, MemCategory::Other, nullptr, DType::F32, dev);
  dev.relu_forward(gout.f32(), gx.f32(), N);
  dev.relu_backward(gdx.f32(), gd.f32(), gout.f32(), N);
  CHECK(max_diff(on_host(gout), out, "relu forward") == 0);
  CHECK(max_diff(on_host(gdx), dx, "relu d input") == 0);
}

TEST_CASE("softmax cross-entropy (mean) forward with on-device stats, and backward, match the CPU") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  for (int64_t C : {int64_t{3}, int64_t{10}, int64_t{1000}}) {  // fewer classes than a warp, and many
    CAPTURE(C);
    const int64_t B = 65;
    auto z = random_floats(B * C, 7, 8.0f);
    std::vector<int64_t> y(B);
    for (int64_t i = 0; i < B; i++) y[size_t(i)] = (i * 7) % C;
    z[0] = 1000.0f;  // large logits do not overflow (log-sum-exp with the max subtracted)
    for (int64_t i = 1; i < B; i += 4) z[size_t(i * C + y[size_t(i)])] = 50.0f;  // some rows right, some wrong
    std::vector<float> probs(B * C), dz(B * C);
    const float loss = cross_entropy_forward(probs.data(), z.data(), y.data(), B, C);
    const int64_t correct = count_correct(z.data(), y.data(), B, C);
    cross_entropy_backward(dz.data(), probs.data(), y.data(), B, C, 1.0f / B);
    double cpu_stats[kLossStatsDoubles] = {0, 0};  // the CPU device's stats: what the trainer reads
    std::vector<float> cpu_probs(B * C);
    cpu_device().cross_entropy_forward(cpu_probs.data(), cpu_stats, z.data(), y.data(), B, C);

    Tensor gz = on_device(z, dev), gy = on_device(y.data(), {B}, dev, DType::I64);
    Tensor gp({B * C}, MemCategory::Other, nullptr, DType::F32, dev), gdz({B * C}, MemCategory::Other, nullptr, DType::F32, dev);
    LossStats stats(dev);
    dev.cross_entropy_forward(gp.f32(), stats.ptr(), gz.f32(), gy.i64(), B, C);
    dev.cross_entropy_backward(gdz.f32(), gp.f32(), gy.i64(), B, C, 1.0f / B);
    const std::string c = " (C=" + std::to_string(C) + ")";
    std::vector<double> got = stats.read();
    CHECK(max_diff({static_cast<float>(got[0] / double(B))}, {loss}, "cross-entropy mean loss (stats[0] / B)" + c) < kTol);
    CHECK(max_diff({static_cast<float>(got[0])}, {static_cast<float>(cpu_stats[0])}, "stats[0] vs the CPU device" + c) < kTol);
    CHECK(got[1] == double(correct));  // argmax, lowest index on ties, as torch.argmax
    CHECK(cpu_stats[1] == double(correct));
    CHECK(max_diff(on_host(gp), probs, "softmax" + c) < kTol);
    CHECK(max_diff(on_host(gdz), dz, "cross-entropy d logits" + c) < kTol);
    // The stats accumulate (micro-batches of one step) until zeroed.
    dev.cross_entropy_forward(gp.f32(), stats.ptr(), gz.f32(), gy.i64(), B, C);
    std::vector<double> twice = stats.read();
    CHECK(twice[0] == doctest::Approx(2 * got[0]).epsilon(1e-12));
    CHECK(twice[1] == 2 * double(correct));
    stats.t.zero();
    CHECK((stats.read() == std::vector<double>{0.0, 0.0}));
  }
}

TEST_CASE("SGD (momentum, dampening, weight decay) and AdamW steps of an Optimizer on the GPU match the CPU optimizer") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  const int64_t n = 100000;
  OptimizerConfig sgd = default_optimizer_config(OptimizerKind::SGD);
  sgd.momentum = 0.9, sgd.dampening = 0.1, sgd.weight_decay = 0.01;
  OptimizerConfig plain = default_optimizer_config(OptimizerKind::SGD);
  OptimizerConfig adamw = default_optimizer_config(OptimizerKind::AdamW);
  for (const OptimizerConfig& oc : {sgd, plain, adamw}) {
    CAPTURE(oc.str());
    MemoryTracker cpu_mem, gpu_mem;
    Optimizer cpu(oc, n, &cpu_mem);
    Optimizer on_gpu(oc, n, &gpu_mem, dev);
    std::vector<float> p = random_floats(n, 8);
    Tensor gp = on_device(p, dev);
    for (int t = 0; t < 3; t++) {
      auto g = random_floats(n, 9 + t);
      Tensor gg = on_device(g, dev);
      cpu.step(p.data(), g.data());
      if (t < 2) {
        on_gpu.step(gp.f32(), gg.f32());
      } else {  // DDP's gradient_as_bucket_view: the gradients in two pieces
        const int64_t half = n / 3;
        on_gpu.step({{gp.f32() + half, gg.f32() + half, half, n - half}, {gp.f32(), gg.f32(), 0, half}});
      }
      CHECK(max_diff(on_host(gp), p, oc.str() + " step " + std::to_string(t + 1)) < kTol);
    }
    CHECK(on_gpu.steps_taken() == 3);
    CHECK(gpu_mem.stats().current_of(MemCategory::OptimizerState) ==
          cpu_mem.stats().current_of(MemCategory::OptimizerState));  // lazy state, same size
    if (!on_gpu.exp_avg().empty()) CHECK(&on_gpu.exp_avg().device() == &dev);  // the state lives on the GPU
  }
}

TEST_CASE("a training step of the Model on the GPU matches the Model on the CPU, with GPU-timed compute events") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& dev = *gpu;
  const ModelSpec spec = ModelSpec::parse("mlp:20,64,64,5");
  const int64_t B = 33, D = 20, K = 5;
  auto x = random_floats(B * D, 10);
  std::vector<int64_t> y(B);
  for (int64_t i = 0; i < B; i++) y[size_t(i)] = i % K;
  OptimizerConfig oc = default_optimizer_config(OptimizerKind::AdamW);

  Model cpu(spec, nullptr, 42, cpu_device());
  Optimizer cpu_opt(oc, cpu.num_params(), nullptr, cpu_device());
  std::vector<float> probs(B * K), dlogits(B * K);

  TraceRecorder recorder(1);
  CostModel cost(find_profile("nvlink8"), 1);
  MemoryTracker mem;
  RankContext ctx(0, &recorder, &cost, nullptr, &mem);
  Model model(spec, &mem, 42, dev);
  Optimizer opt(oc, model.num_params(), &mem, dev);
  CHECK(&model.device() == &dev);
  CHECK(model.host_params() == cpu.host_params());  // drawn on the host, uploaded: the same bits
  std::unique_ptr<DeviceTimer> timer = dev.make_timer(&ctx);
  REQUIRE(timer.get() != nullptr);
  model.set_observer(timer.get());
  Tensor gx = on_device(x, dev), gy = on_device(y.data(), {B}, dev, DType::I64);
  Tensor gprobs({B, K}, MemCategory::Activations, &mem, DType::F32, dev);
  Tensor gdlogits({B, K}, MemCategory::Activations, &mem, DType::F32, dev);
  LossStats stats(dev);
  CHECK(mem.stats().current_of(MemCategory::Parameters) == spec.num_params() * 4);
  CHECK(mem.stats().current_of(MemCategory::Gradients) == spec.num_params() * 4);

  for (int step = 0; step < 3; step++) {
    cpu.zero_grad();
    const float* logits = cpu.forward(x.data(), B);
    const float cpu_loss = cross_entropy_forward(probs.data(), logits, y.data(), B, K);
    cross_entropy_backward(dlogits.data(), probs.data(), y.data(), B, K, 1.0f / B);
    cpu.backward(dlogits.data());
    cpu_opt.step(cpu.params(), cpu.grads());

    model.zero_grad();
    stats.t.zero();
    const float* glogits = model.forward(gx.f32(), B);
    dev.cross_entropy_forward(gprobs.f32(), stats.ptr(), glogits, gy.i64(), B, K);
    dev.cross_entropy_backward(gdlogits.f32(), gprobs.f32(), gy.i64(), B, K, 1.0f / B);
    model.backward(gdlogits.f32());
    opt.step(model.params(), model.grads());
    const std::vector<double> s = stats.read();
    CHECK(max_diff({static_cast<float>(s[0] / double(B))}, {cpu_loss}, "model loss, step " + std::to_string(step + 1)) < kTol);
  }
  CHECK(max_diff(model.host_params(), cpu.host_params(), "model parameters after 3 AdamW steps") < kTol);
  // upload_params puts host values back exactly.
  const std::vector<float> back = cpu.host_params();
  model.upload_params(back.data());
  CHECK(model.host_params() == back);

  // 3 steps x (5 layers forward + 5 backward), each a Compute event timed by CUDA events.
  const int flushed = timer->flush();
  CHECK(flushed == 30);
  std::vector<Event> computes;
  for (const Event& e : recorder.events(0))
    if (e.kind == EventKind::Compute) computes.push_back(e);
  REQUIRE(computes.size() == 30);
  CHECK(computes[0].compute.kind == ComputeKind::LayerForward);
  CHECK(computes[0].compute.layer == 0);
  CHECK(computes[5].compute.kind == ComputeKind::LayerBackward);
  CHECK(computes[5].compute.layer == 4);
  for (size_t i = 0; i < computes.size(); i++) {
    CHECK(computes[i].wall_end_ns >= computes[i].wall_begin_ns);
    CHECK(computes[i].model_end > computes[i].model_begin);
    if (i > 0) CHECK(computes[i].wall_begin_ns >= computes[i - 1].wall_end_ns - 1000);  // one stream: in order
  }
  CHECK(ctx.compute_clock() == doctest::Approx(computes.back().model_end));
  model.set_observer(nullptr);
}

// ---- the cuda backend ----

namespace {

// Rank-local memory for the shared collective program below: host vectors or device tensors.
struct RankMemory {
  std::function<void*(int64_t bytes)> alloc;                      // zero-filled
  std::function<void(void* dst, const void* host, int64_t bytes)> upload;
  std::function<void(void* host, const void* src, int64_t bytes)> download;
};

// Every collective the backends share, on both float data and int64, each rank's results appended
// (as bytes) to `out`. Inputs are random floats, so an equal result means equal additions in an
// equal order, not just equal sums.
void collective_program(int r, int n, int64_t count, Communicator& c, RankMemory& m, std::vector<uint8_t>& out) {
  auto input = [&](int64_t len, uint32_t salt) { return random_floats(size_t(len), uint32_t(1000 * r + salt)); };
  auto keep = [&](const void* buf, int64_t bytes) {
    std::vector<uint8_t> h(static_cast<size_t>(bytes));
    if (bytes) m.download(h.data(), buf, bytes);
    out.insert(out.end(), h.begin(), h.end());
  };
  auto fresh = [&](int64_t len, uint32_t salt) {
    void* p = m.alloc(len * 4);
    auto v = input(len, salt);
    if (len) m.upload(p, v.data(), len * 4);
    return static_cast<float*>(p);
  };
  const int64_t F = count * 4;
  uint32_t salt = 0;
  for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive, Algorithm::DoubleTree, Algorithm::Hierarchical,
                      Algorithm::InNetwork})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      float* buf = fresh(count, ++salt);
      c.all_reduce(buf, count, DType::F32, op, a)->wait();
      keep(buf, F);
    }
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    float* in = fresh(count * n, ++salt);
    float* o = fresh(count, ++salt);
    c.reduce_scatter(o, in, count, DType::F32, op)->wait();
    keep(o, F);
  }
  {
    float* in = fresh(count, ++salt);
    float* o = fresh(count * n, ++salt);
    c.all_gather(o, in, count, DType::F32)->wait();
    keep(o, F * n);
    float* in2 = fresh(count * n, ++salt);
    float* o2 = fresh(count * n, ++salt);
    c.all_to_all(o2, in2, count, DType::F32)->wait();
    keep(o2, F * n);
  }
  for (int root : {0, n - 1})
    for (Algorithm a : {Algorithm::Tree, Algorithm::Naive}) {
      float* b = fresh(count, ++salt);
      c.broadcast(b, count, DType::F32, root, a)->wait();
      keep(b, F);
      float* d = fresh(count, ++salt);
      c.reduce(d, count, DType::F32, root == 0 ? ReduceOp::Max : ReduceOp::Avg, root, a)->wait();
      keep(d, F);
    }
  {
    std::vector<int64_t> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; i++) v[size_t(i)] = (int64_t{1} << 40) + r * 1000003 + i;
    void* p = m.alloc(count * 8);
    if (count) m.upload(p, v.data(), count * 8);
    c.all_reduce(p, count, DType::I64, ReduceOp::Sum)->wait();
    keep(p, count * 8);
    c.all_reduce(p, count, DType::I64, ReduceOp::Max)->wait();
    keep(p, count * 8);
  }
  if (n > 1) {
    float* s = fresh(count, ++salt);
    float* rcv = fresh(count, ++salt);
    WorkPtr ws = c.send(s, count, DType::F32, (r + 1) % n, 7);
    c.recv(rcv, count, DType::F32, (r - 1 + n) % n, 7)->wait();
    ws->wait();
    keep(rcv, F);
  }
  c.barrier()->wait();
}

WorldOptions quiet_options() {
  WorldOptions o;
  o.timeout_s = 60;
  o.record = false;
  o.trace_capacity = 16;
  return o;
}

// Nodes of 4 ranks with a switch that reduces: every all-reduce algorithm runs on it (hierarchical
// with whole nodes for worlds 8 and 16, as one node up to 4).
WorldOptions every_algorithm_options() {
  WorldOptions o = quiet_options();
  o.hardware = find_profile("ib2x4");
  o.hardware->switch_reduces = true;
  return o;
}

// The same program on any RankWorld: every buffer a Tensor on the rank's device (host memory on the
// CPU, the GPU's on cuda), moved with the device's own upload and download.
std::vector<std::vector<uint8_t>> run_world(RankWorld& w, int64_t count, std::string* backend = nullptr) {
  const int n = w.world_size();
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  w.run([&](int r, Communicator& c, RankContext& ctx, Device& dev) {
    if (backend && r == 0) *backend = c.backend_name();
    std::vector<Tensor> storage;
    RankMemory m{[&](int64_t bytes) {
                   storage.emplace_back(Shape{bytes / 4 + 2}, MemCategory::CommBuffers, ctx.memory(), DType::F32, dev);
                   return storage.back().raw();
                 },
                 [&](void* d, const void* h, int64_t b) { dev.upload(d, h, b); },  // not waited for: stream order
                 [&](void* h, const void* s, int64_t b) { dev.download(h, s, b); }};
    collective_program(r, n, count, c, m, out[size_t(r)]);
  });
  return out;
}

}  // namespace

TEST_CASE("cuda backend: every collective equals the threads backend bit for bit, world 1 to 16 on one GPU") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  for (int n : {1, 2, 3, 4, 8, 16}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(1 << 18) + 3}}) {
      CAPTURE(n);
      CAPTURE(count);
      std::string backend;
      auto want = run_world(*make_threads_world(n, every_algorithm_options()), count);
      auto got = run_world(*cuda::make_cuda_world(n, every_algorithm_options()), count, &backend);
      CHECK(backend == "cuda");
      int64_t wrong = 0;
      for (int r = 0; r < n; r++) {
        REQUIRE(got[size_t(r)].size() == want[size_t(r)].size());
        for (size_t i = 0; i < want[size_t(r)].size(); i += 4)
          wrong += std::memcmp(&got[size_t(r)][i], &want[size_t(r)][i], 4) != 0;
      }
      MESSAGE("world " << n << ", count " << count << ": #wrong " << wrong);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("cuda backend: ring all-reduce steps in NCCL's chunk order, one stepper gate per step") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  const int n = 4, steps = 2 * (n - 1);
  const int64_t count = 1001;
  WorldOptions o = quiet_options();
  o.record = true;
  o.trace_capacity = 1 << 12;
  o.start_paused = true;
  std::unique_ptr<RankWorld> w = cuda::make_cuda_world(n, o);
  CHECK(std::string(w->backend()) == "cuda");
  std::string error;
  std::thread runner([&] {
    try {
      w->run([&](int r, Communicator& c, RankContext& ctx, Device& dev) {
        CHECK(dev.kind() == DeviceKind::CUDA);
        Tensor buf({count}, MemCategory::CommBuffers, ctx.memory(), DType::F32, dev);
        c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto ring_steps = [&](int r) {
    std::vector<Event> v;
    for (const Event& e : w->threads().recorder().events(r))
      if (e.kind == EventKind::RingStep) v.push_back(e);
    return v;
  };
  Stepper& st = w->threads().stepper();
  const auto patience = std::chrono::milliseconds(20000);
  REQUIRE(st.wait_until_settled(patience));  // every rank at collective #0's gate
  st.step(GateKind::RingStep);                       // up to the gate of ring step 0
  REQUIRE(st.wait_until_settled(patience));
  for (int s = 0; s + 1 < steps; s++) {
    CAPTURE(s);
    st.step(GateKind::RingStep);
    REQUIRE(st.wait_until_settled(patience));
    for (int r = 0; r < n; r++) CHECK(ring_steps(r).size() == size_t(s + 1));
    WorldStatus ws = w->threads().status();
    REQUIRE(ws.in_flight.size() == 1);
    CHECK(ws.in_flight[0].steps_done == s + 1);
  }
  st.run();
  runner.join();
  CHECK(error == "");
  for (int r = 0; r < n; r++) {
    std::vector<Event> v = ring_steps(r);
    REQUIRE(v.size() == size_t(steps));
    for (int s = 0; s < steps; s++) {
      const std::vector<StepTransfer> plan = algorithm_step_plan(CollectiveOp::AllReduce, Algorithm::Ring, n, 0, s);
      auto mine = std::find_if(plan.begin(), plan.end(), [&](const StepTransfer& t) { return t.dst == r; });
      REQUIRE(mine != plan.end());
      CHECK(v[size_t(s)].step.chunk == mine->chunk);
      CHECK(v[size_t(s)].step.src == mine->src);
    }
  }
}

TEST_CASE("cuda backend: compute enqueued before a call is finished before the collective reads it") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  const int n = 2;
  const int64_t count = 1 << 20;
  std::unique_ptr<RankWorld> w = cuda::make_cuda_world(n, quiet_options());
  std::vector<std::vector<float>> out(n);
  w->run([&](int r, Communicator& c, RankContext& ctx, Device& dev) {
    Tensor x({count}, MemCategory::Activations, ctx.memory(), DType::F32, dev);
    Tensor buf({count}, MemCategory::Gradients, ctx.memory(), DType::F32, dev);
    std::vector<float> ones(size_t(count), 1.0f + r);
    dev.upload(x.raw(), ones.data(), x.nbytes());
    // Enqueued, not waited for: the all-reduce must still see its result.
    for (int k = 0; k < 20; k++) dev.relu_forward(buf.f32(), x.f32(), count);
    c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum)->wait();
    out[size_t(r)] = on_host(buf);
  });
  for (int r = 0; r < n; r++) CHECK(std::count(out[size_t(r)].begin(), out[size_t(r)].end(), 3.0f) == count);
}

TEST_CASE("cuda backend: world size limits and bad devices are one-sentence errors") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  CHECK_THROWS_WITH_AS(CudaWorld(17), doctest::Contains("use 1 to 16"), Error);
  CHECK_THROWS_WITH_AS(CudaWorld(2, quiet_options(), {cuda::device_count()}), doctest::Contains("does not exist"), Error);
  CHECK_THROWS_WITH_AS(cuda::make_device(0, cuda::device_count()), doctest::Contains("start fewer ranks per node"), Error);
}

// ---- the one Trainer on the GPU (engine/train/train.h, --device cuda) ----

namespace {

// Per-step losses and the final training-set loss of one run.
struct RunLosses {
  std::vector<float> steps;
  float eval = 0;
};

RunLosses train_losses(const TrainConfig& c) {
  Trainer t(c);
  RunLosses out;
  const TrainSummary s = t.run([&](const StepReport& r) { out.steps.push_back(r.loss); });
  out.eval = s.eval_loss;
  return out;
}

void check_follows_cpu(TrainConfig c, const std::string& backend, const std::string& what) {
  c.device = "cpu";
  c.backend = "threads";
  const RunLosses cpu = train_losses(c);
  c.device = "cuda";
  c.backend = backend;
  const RunLosses gpu = train_losses(c);
  REQUIRE(gpu.steps.size() == cpu.steps.size());
  CHECK(max_diff(gpu.steps, cpu.steps, what + ": loss of every step") < 1e-4);
  CHECK(max_diff({gpu.eval}, {cpu.eval}, what + ": training-set loss after the last step") < 1e-4);
}

}  // namespace

TEST_CASE("16-bit tensors on the GPU: widen, narrow, round, add and the finite check equal half.h bit for bit") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& cpu = cpu_device();
  // Random values over many binades, and the cases rounding gets wrong: ties, fp16's overflow edge,
  // subnormals, the smallest values, infinities and NaN.
  std::vector<float> x = random_floats(20000, 21, 4.0f);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = std::ldexp(x[i], static_cast<int>(i % 61) - 40);
  for (float v : {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 65504.0f, 65519.0f, 65520.0f, -65536.0f, 5.96e-8f, 2.98e-8f,
                  2.99e-8f, 1e-45f, 6.1e-5f, 3.4e38f, INFINITY, -INFINITY, NAN})
    x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  for (HalfFormat f : {HalfFormat::BF16, HalfFormat::FP16}) {
    CAPTURE(half_format_name(f));
    std::vector<uint16_t> want(x.size()), got(x.size());
    half_from_floats(want.data(), x.data(), n, f);
    Tensor gx = on_device(x, *gpu);
    Tensor gh({n}, MemCategory::Other, nullptr, DType::BF16, *gpu);
    gpu->narrow_half(gh.u16(), gx.f32(), n, f);
    gpu->download(got.data(), gh.raw(), gh.nbytes());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * 2) == 0);  // narrow: every bit, NaN's pattern too
    std::vector<float> wide(x.size()), gwide;
    half_to_floats(wide.data(), want.data(), n, f);
    Tensor gw = on_device(x, *gpu);
    gpu->widen_half(gw.f32(), gh.u16(), n, f);
    gwide = on_host(gw);
    CHECK(std::memcmp(gwide.data(), wide.data(), wide.size() * 4) == 0);  // widen: exact
    Tensor gr = on_device(x, *gpu);
    gpu->round_half(gr.f32(), n, f);
    std::vector<float> rounded = x;
    cpu.round_half(rounded.data(), n, f);
    CHECK(std::memcmp(on_host(gr).data(), rounded.data(), rounded.size() * 4) == 0);
    // acc + x and max(acc, x) in float, rounded once.
    for (bool max : {false, true}) {
      std::vector<uint16_t> acc(want.rbegin(), want.rend()), gacc(acc.size());
      Tensor ga = on_device(acc.data(), {n}, *gpu, DType::BF16);
      cpu.accumulate_half(acc.data(), want.data(), n, max, f);
      gpu->accumulate_half(ga.u16(), gh.u16(), n, max, f);
      gpu->download(gacc.data(), ga.raw(), ga.nbytes());
      CHECK_MESSAGE(std::memcmp(gacc.data(), acc.data(), acc.size() * 2) == 0, (max ? "max" : "sum"));
    }
    CHECK_FALSE(gpu->half_all_finite(gh.u16(), n, f));      // holds inf and NaN
    CHECK(gpu->half_all_finite(gh.u16(), n - 3, f) == cpu.half_all_finite(want.data(), n - 3, f));
    CHECK(gpu->half_all_finite(gh.u16(), 0, f));
  }
}

TEST_CASE("cuda backend: bf16 and fp16 all-reduces equal the threads backend bit for bit (each sum in float, rounded once)") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  for (DType dt : {DType::BF16, DType::F16}) {
    const HalfFormat f = dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16;
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      const int64_t count = 5000;
      auto program = [&](RankWorld& w) {
        std::vector<std::vector<uint16_t>> out(static_cast<size_t>(n));
        w.run([&](int r, Communicator& c, RankContext&, Device& dev) {
          std::vector<float> v = random_floats(static_cast<size_t>(count), 40 + r, 3.0f);
          std::vector<uint16_t> h(v.size());
          half_from_floats(h.data(), v.data(), count, f);
          Tensor t({count}, MemCategory::CommBuffers, nullptr, dt, dev);
          dev.upload(t.raw(), h.data(), t.nbytes());
          c.all_reduce(t.raw(), count, dt, ReduceOp::Sum)->wait();
          dev.download(h.data(), t.raw(), t.nbytes());
          out[static_cast<size_t>(r)] = h;
        });
        return out;
      };
      const auto want = program(*make_threads_world(n, quiet_options()));
      const auto got = program(*cuda::make_cuda_world(n, quiet_options()));
      for (int r = 0; r < n; r++) CHECK(got[size_t(r)] == want[size_t(r)]);
    }
  }
}

TEST_CASE("train --device cuda: one rank, and DDP of 4 ranks sharing the GPU, follow the CPU engine step by step") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.steps = 8;
  c.batch = 16;
  check_follows_cpu(c, "cuda", "single");
  c.strategy = Strategy::Ddp;
  c.world_size = 4;
  check_follows_cpu(c, "cuda", "ddp, cuda backend, 4 ranks");
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.momentum = 0.9;
  c.accum = 2;
  check_follows_cpu(c, "cuda", "ddp, SGD with momentum, accumulation 2");
  c.accum = 1;
  c.ddp.gradient_as_bucket_view = true;
  check_follows_cpu(c, "cuda", "ddp, gradient_as_bucket_view");
}

TEST_CASE("train --device cuda: DataParallel and tensor parallelism (ranks sharing the GPU) follow the CPU engine step by step") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.model = ModelSpec::parse("mlp:2,32,32,32,32,3");
  c.steps = 6;
  c.batch = 16;
  c.strategy = Strategy::Dp;
  c.world_size = 4;
  check_follows_cpu(c, "cuda", "dp, 4 replicas");
  c.lora.rank = 4;
  check_follows_cpu(c, "cuda", "dp, LoRA");
  c.lora.rank = 0;
  c.strategy = Strategy::Ddp;
  c.tp = 2;
  check_follows_cpu(c, "cuda", "ddp 2 x tp 2");
  c.sequence_parallel = true;
  c.activation_checkpointing = true;
  check_follows_cpu(c, "cuda", "ddp 2 x tp 2, sequence parallel, recompute");
  c.sequence_parallel = c.activation_checkpointing = false;
  c.strategy = Strategy::Fsdp;
  check_follows_cpu(c, "cuda", "fsdp 2 x tp 2");
  c.strategy = Strategy::Pipeline;
  c.world_size = 4;
  c.pipeline.stages = 2;
  c.pipeline.microbatches = 4;
  check_follows_cpu(c, "cuda", "pipeline 2 x tp 2 (1F1B)");
}

namespace {

// A 16-bit run on the GPU against the same run on the CPU engine: every step's loss within
// torch.testing.assert_close's tolerance for the dtype (bf16 rtol 1.6e-2, fp16 1e-3; the GEMMs sum in
// another order, and a 16-bit rounding can then land one unit apart), and the fp16 loss scaler's
// skips on the same steps.
void check_follows_cpu16(TrainConfig c, const std::string& what) {
  const double rtol = c.precision == Precision::BF16 ? 1.6e-2 : 1e-3;
  auto run = [&](const std::string& device) {
    c.device = device;
    c.backend = device == "cuda" ? "cuda" : "threads";
    std::vector<StepReport> steps;
    Trainer t(c);
    t.run([&](const StepReport& r) { steps.push_back(r); });
    return steps;
  };
  const std::vector<StepReport> cpu = run("cpu"), gpu = run("cuda");
  REQUIRE(gpu.size() == cpu.size());
  for (size_t i = 0; i < cpu.size(); i++) {
    CAPTURE(what);
    CAPTURE(i + 1);
    CHECK(std::isfinite(gpu[i].loss) == std::isfinite(cpu[i].loss));
    if (std::isfinite(cpu[i].loss)) CHECK(std::fabs(gpu[i].loss - cpu[i].loss) <= 1e-5 + rtol * std::fabs(cpu[i].loss));
    CHECK(gpu[i].step_skipped == cpu[i].step_skipped);
    CHECK(gpu[i].loss_scale == cpu[i].loss_scale);
  }
}

}  // namespace

TEST_CASE("train --precision bf16/fp16 --device cuda: every strategy (+LoRA, recompute, TP, the fp16 scalers) follows the CPU engine") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.model = ModelSpec::parse("mlp:2,32,32,32,32,3");
  c.steps = 8;
  c.batch = 16;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  for (Precision p : {Precision::BF16, Precision::FP16}) {
    c.precision = p;
    const std::string dt = precision_name(p);
    c.strategy = Strategy::Single;
    c.world_size = 1;
    check_follows_cpu16(c, dt + " single");
    c.strategy = Strategy::Ddp;
    c.world_size = 2;
    check_follows_cpu16(c, dt + " ddp 2");
    c.activation_checkpointing = true;
    c.lora.rank = 4;
    check_follows_cpu16(c, dt + " ddp 2, LoRA, recompute");
    c.activation_checkpointing = false;
    c.lora.rank = 0;
    c.world_size = 4;
    c.tp = 2;
    check_follows_cpu16(c, dt + " ddp 2 x tp 2");
    c.sequence_parallel = true;
    check_follows_cpu16(c, dt + " ddp 2 x tp 2, sequence parallel");
    c.sequence_parallel = false;
    c.tp = 1;
    c.world_size = 2;
    c.strategy = Strategy::Dp;
    check_follows_cpu16(c, dt + " dp 2");
    c.strategy = Strategy::Fsdp;
    for (Sharding sh : {Sharding::FullShard, Sharding::NoShard, Sharding::Zero1}) {
      c.fsdp.sharding = sh;
      check_follows_cpu16(c, dt + " fsdp 2, " + sharding_flag(sh));
    }
    c.fsdp.sharding = Sharding::FullShard;
    c.strategy = Strategy::Pipeline;
    c.pipeline.stages = 2;
    c.pipeline.microbatches = 4;
    for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
      c.pipeline.schedule = k;
      check_follows_cpu16(c, dt + " pipeline 2 stages, " + schedule_kind_flag(k));
    }
    c.strategy = Strategy::Ddp;
  }
  c.precision = Precision::FP16;  // an overflow the scalers must skip, on both devices
  c.strategy = Strategy::Fsdp;
  c.inject_overflow_steps = {3};
  check_follows_cpu16(c, "fp16 fsdp 2 (ShardedGradScaler), overflow at step 3");
  c.strategy = Strategy::Ddp;
  c.inject_overflow_steps = {3};
  check_follows_cpu16(c, "fp16 ddp 2, overflow at step 3");
  c.inject_overflow_steps.clear();
  c.ddp.gradient_as_bucket_view = true;
  check_follows_cpu16(c, "fp16 ddp 2, gradient_as_bucket_view");
  c.ddp.gradient_as_bucket_view = false;

  c = TrainConfig();  // the GPT: every op widened, run in float32 and rounded once, on the GPU
  c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=32,ctx=16");
  c.data = "text";
  c.steps = 6;
  c.batch = 8;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  c.precision = Precision::BF16;
  check_follows_cpu16(c, "gpt bf16 single");
  c.strategy = Strategy::Ddp;
  c.world_size = 2;
  c.lora.rank = 4;
  check_follows_cpu16(c, "gpt bf16 ddp 2, LoRA");
  c.lora.rank = 0;
  c.world_size = 4;
  c.tp = 2;
  c.sequence_parallel = true;
  check_follows_cpu16(c, "gpt bf16 ddp 2 x tp 2, sequence parallel");
  c.sequence_parallel = false;
  c.tp = 1;
  c.world_size = 2;
  c.strategy = Strategy::Fsdp;
  check_follows_cpu16(c, "gpt bf16 fsdp 2");
  c.strategy = Strategy::Pipeline;
  c.pipeline.stages = 2;
  c.pipeline.microbatches = 4;
  c.pipeline.schedule = ScheduleKind::ZBH1;
  check_follows_cpu16(c, "gpt bf16 pipeline 2 stages, zb-h1 (the tied embedding's 16-bit sum)");
}

TEST_CASE("the transformer's ops (LayerNorm, GELU, causal attention, embeddings, adds) match the CPU device") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  auto gpu = gpu0();
  Device& cpu = cpu_device();
  // Widths that are not multiples of a warp, and more positions than a warp holds.
  const int64_t B = 2, T = 40, NH = 3, C = 48, N = B * T, V = 11;
  auto both = [&](const std::vector<float>& host) { return on_device(host, *gpu); };
  std::vector<float> x = random_floats(static_cast<size_t>(N * C), 1, 2.0f), w = random_floats(static_cast<size_t>(C), 2),
                     b = random_floats(static_cast<size_t>(C), 3), dy = random_floats(static_cast<size_t>(N * C), 4);
  {  // LayerNorm
    std::vector<float> out(x.size()), mean(N), rstd(N);
    cpu.layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    Tensor gx = both(x), gw = both(w), gb = both(b), gout = both(out), gmean = both(mean), grstd = both(rstd);
    gpu->layernorm_forward(gout.f32(), gmean.f32(), grstd.f32(), gx.f32(), gw.f32(), gb.f32(), N, C);
    CHECK(max_diff(on_host(gout), out, "layernorm forward") < kTol);
    CHECK(max_diff(on_host(grstd), rstd, "layernorm forward: rstd") < kTol);
    std::vector<float> dx = random_floats(x.size(), 5), dw = random_floats(static_cast<size_t>(C), 6), db = dw;  // += into these
    Tensor gdy = both(dy), gdx = both(dx), gdw = both(dw), gdb = both(db);
    cpu.layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    gpu->layernorm_backward(gdx.f32(), gdw.f32(), gdb.f32(), gdy.f32(), gx.f32(), gw.f32(), gmean.f32(), grstd.f32(), N, C);
    CHECK(max_diff(on_host(gdx), dx, "layernorm backward: input (accumulated)") < kTol);
    CHECK(max_diff(on_host(gdw), dw, "layernorm backward: weight (accumulated)") < kTol);
    CHECK(max_diff(on_host(gdb), db, "layernorm backward: bias (accumulated)") < kTol);
  }
  {  // GELU
    std::vector<float> out(x.size()), d(x.size());
    cpu.gelu_forward(out.data(), x.data(), N * C);
    cpu.gelu_backward(d.data(), dy.data(), x.data(), N * C);
    Tensor gx = both(x), gdy = both(dy), gout = both(out);
    gpu->gelu_forward(gout.f32(), gx.f32(), N * C);
    gpu->gelu_backward(gdy.f32(), gdy.f32(), gx.f32(), N * C);  // in place, as the GPT calls it
    CHECK(max_diff(on_host(gout), out, "gelu forward") < kTol);
    CHECK(max_diff(on_host(gdy), d, "gelu backward") < kTol);
  }
  {  // causal self-attention on a fused qkv
    const std::vector<float> qkv = random_floats(static_cast<size_t>(N * 3 * C), 7);
    std::vector<float> out(static_cast<size_t>(N * C)), att(static_cast<size_t>(B * NH * T * T)), datt(static_cast<size_t>(T * T));
    std::vector<float> dqkv(qkv.size());
    cpu.attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, nullptr);
    cpu.attention_backward(dqkv.data(), datt.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH, nullptr);
    Tensor gqkv = both(qkv), gout = both(out), gatt = both(att), gdqkv = both(dqkv), gdatt = both(datt), gdy = both(dy);
    gpu->attention_forward(gout.f32(), gatt.f32(), gqkv.f32(), B, T, C, NH, nullptr);
    gpu->attention_backward(gdqkv.f32(), gdatt.f32(), gdy.f32(), gqkv.f32(), gatt.f32(), B, T, C, NH, nullptr);
    CHECK(max_diff(on_host(gatt), att, "attention forward: softmax (zeros above the diagonal)") < kTol);
    CHECK(max_diff(on_host(gout), out, "attention forward: output") < kTol);
    CHECK(max_diff(on_host(gdqkv), dqkv, "attention backward: dq, dk, dv") < kTol);
  }
  {  // embeddings, whole rows and a sequence-parallel slice (positions 20..39 of each sample)
    const std::vector<float> wte = random_floats(static_cast<size_t>(V * C), 8), wpe = random_floats(static_cast<size_t>(T * C), 9);
    std::vector<int64_t> idx(static_cast<size_t>(N));
    for (size_t i = 0; i < idx.size(); i++) idx[i] = static_cast<int64_t>((i * 7 + i / 5) % V);
    Tensor gidx = on_device(idx.data(), {N}, *gpu, DType::I64), gwte = both(wte), gwpe = both(wpe);
    for (const int64_t Tl : {T, T / 2}) {
      CAPTURE(Tl);
      const int64_t R = B * Tl, t0 = T - Tl;
      std::vector<float> xo(static_cast<size_t>(R * C)), dwte = random_floats(wte.size(), 10), dwpe = random_floats(wpe.size(), 11);
      const std::vector<float> dx = random_floats(xo.size(), 12);
      Tensor gxo = both(xo), gdwte = both(dwte), gdwpe = both(dwpe), gdx = both(dx);
      cpu.embedding_forward(xo.data(), wte.data(), wpe.data(), idx.data(), R, Tl, T, t0, C);
      cpu.embedding_backward(dwte.data(), dwpe.data(), dx.data(), idx.data(), R, Tl, T, t0, C);
      gpu->embedding_forward(gxo.f32(), gwte.f32(), gwpe.f32(), gidx.i64(), R, Tl, T, t0, C);
      gpu->embedding_backward(gdwte.f32(), gdwpe.f32(), gdx.f32(), gidx.i64(), R, Tl, T, t0, C);
      CHECK(max_diff(on_host(gxo), xo, "embedding forward") == 0);
      CHECK(max_diff(on_host(gdwte), dwte, "embedding backward: wte (rows in order)") == 0);
      CHECK(max_diff(on_host(gdwpe), dwpe, "embedding backward: wpe") == 0);
    }
  }
  {  // residual add, a bias added to rows, column sums
    std::vector<float> out(x.size()), y = x, acc = b;
    cpu.add(out.data(), x.data(), dy.data(), N * C);
    cpu.add_rows(y.data(), b.data(), N, C);
    cpu.sum_rows(acc.data(), dy.data(), N, C);
    Tensor gx = both(x), gdy = both(dy), gout = both(out), gy = both(x), gacc = both(b), gb = both(b);
    gpu->add(gout.f32(), gx.f32(), gdy.f32(), N * C);
    gpu->add_rows(gy.f32(), gb.f32(), N, C);
    gpu->sum_rows(gacc.f32(), gdy.f32(), N, C);
    CHECK(max_diff(on_host(gout), out, "add") == 0);
    CHECK(max_diff(on_host(gy), y, "add_rows") == 0);
    CHECK(max_diff(on_host(gacc), acc, "sum_rows (rows in order)") == 0);
  }
}

TEST_CASE("train --model gpt --device cuda: single, DDP (recomputed, LoRA), DP, TP (+SP), FSDP, pipelines and the 3-D mesh follow the CPU engine step by step") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=32,ctx=16");
  c.data = "text";
  c.steps = 6;
  c.batch = 8;
  c.optimizer.lr = 1e-3;
  check_follows_cpu(c, "cuda", "gpt single");
  c.strategy = Strategy::Ddp;
  c.world_size = 2;
  check_follows_cpu(c, "cuda", "gpt ddp, 2 ranks");
  c.activation_checkpointing = true;
  check_follows_cpu(c, "cuda", "gpt ddp, activation checkpointing");
  c.activation_checkpointing = false;
  c.lora.rank = 4;
  check_follows_cpu(c, "cuda", "gpt ddp, LoRA on c_attn");
  c.lora.rank = 0;
  c.strategy = Strategy::Dp;
  check_follows_cpu(c, "cuda", "gpt dp, 2 replicas");
  c.strategy = Strategy::Ddp;
  c.world_size = 4;
  c.tp = 2;
  check_follows_cpu(c, "cuda", "gpt ddp 2 x tp 2 (heads and MLP columns)");
  c.sequence_parallel = true;
  check_follows_cpu(c, "cuda", "gpt ddp 2 x tp 2, sequence parallel");
  c.sequence_parallel = false;
  c.tp = 1;
  c.world_size = 2;
  c.strategy = Strategy::Fsdp;
  check_follows_cpu(c, "cuda", "gpt fsdp (full shard), 2 ranks");
  c.strategy = Strategy::Pipeline;
  c.pipeline.stages = 2;
  c.pipeline.microbatches = 4;
  for (ScheduleKind k : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
    c.pipeline.schedule = k;
    check_follows_cpu(c, "cuda", std::string("gpt pipeline ") + schedule_kind_flag(k) + ", 2 stages");
  }
  c.world_size = 8;  // the 3-D mesh: dp 2 x pp 2 x tp 2
  c.pipeline.dp = 2;
  c.tp = 2;
  c.pipeline.schedule = ScheduleKind::OneFOneB;
  check_follows_cpu(c, "cuda", "gpt mesh dp 2 x pp 2 x tp 2");
}

TEST_CASE("train --device cuda: every rank's tensors on its GPU, charged to its tracker, and the placement said") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.strategy = Strategy::Ddp;
  c.world_size = 2;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.steps = 2;
  c.batch = 16;
  c.device = "cuda";
  c.backend = "cuda";
  Trainer t(c);
  for (int r = 0; r < 2; r++) {
    CAPTURE(r);
    CHECK(t.device(r).kind() == DeviceKind::CUDA);
    CHECK(&t.rank_model(r).device() == &t.device(r));
    int64_t used = 0, total = 0;
    CHECK(t.device_memory(r, used, total));
    CHECK(total > 0);
  }
  CHECK(t.describe_placement().find("sharing device 0") != std::string::npos);
  const TrainSummary s = t.run();
  CHECK(s.memory.peak_of(MemCategory::Parameters) == c.model.num_params() * 4);
  CHECK(s.memory.peak_of(MemCategory::OptimizerState) == c.model.num_params() * 8);  // AdamW's two moments
  MESSAGE(t.describe_placement());
}

#if DTLAB_HAVE_NCCL
TEST_CASE("train --device cuda --backend nccl: DDP with one GPU per rank follows the CPU engine") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  if (cuda::device_count() < 2) {
    MESSAGE("skipped: needs 2 CUDA devices (this machine has " << cuda::device_count() << ")");
    return;
  }
  TrainConfig c;
  c.strategy = Strategy::Ddp;
  c.world_size = 2;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.steps = 8;
  c.batch = 16;
  check_follows_cpu(c, "nccl", "ddp, nccl backend, 2 GPUs");
  c.strategy = Strategy::Fsdp;
  check_follows_cpu(c, "nccl", "fsdp (full shard), nccl backend, 2 GPUs");
}
#endif

}  // TEST_SUITE

#endif  // DTLAB_HAVE_CUDA
