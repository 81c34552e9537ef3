// The CUDA engine against the CPU engine, llm.c style: every op and optimizer on random data on both,
// each printing its max difference (relative to max(1, |cpu|); tolerance 1e-5), a whole training step
// of the model, device memory in the rank's tracker, GPU-timed compute events; and the cuda backend
// against the threads backend: every collective bit for bit (same algorithm, same additions in the
// same order), ring steps in NCCL's order, one stepper gate per ring step.
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
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/cuda_backend.h"
#include "engine/comm/plan.h"
#include "engine/core/model.h"
#include "engine/core/ops.h"
#include "engine/core/optim.h"
#include "engine/cuda/compute_timer.h"
#include "engine/cuda/cuda_train.h"
#include "engine/cuda/device.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/device_tensor.h"
#include "engine/cuda/ops.h"
#include "engine/cuda/optim.h"
#include "engine/trace/event.h"

using namespace dtlab;
using cuda::DeviceTensor;
using cuda::RankDevice;

// Every GPU case starts with this: the reason is visible in doctest's output and in CTest's.
#define DTLAB_REQUIRE_CUDA_DEVICE()                                     \
  do {                                                                  \
    if (!cuda::cuda_available()) {                                      \
      MESSAGE(("skipped: " + cuda::unavailable_reason()));                \
      return;                                                           \
    }                                                                   \
  } while (0)

namespace {

constexpr double kTol = 1e-5;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

DeviceTensor on_device(const void* host, Shape shape, const RankDevice& dev, DType dt = DType::F32,
                       MemoryTracker* tracker = nullptr) {
  DeviceTensor t(std::move(shape), MemCategory::Other, tracker, dev.device(), dt);
  if (t.numel() > 0) cuda::upload(t, host, dev.compute());
  return t;
}
DeviceTensor on_device(const std::vector<float>& v, const RankDevice& dev) {
  return on_device(v.data(), {static_cast<int64_t>(v.size())}, dev);
}

std::vector<float> on_host(const DeviceTensor& t, const RankDevice& dev) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) cuda::download(v.data(), t, dev.compute());
  return v;
}

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

TEST_CASE("without a device: cuda_available() is false with a reason and the backend says so in one sentence") {
  if (cuda::cuda_available()) {
    CHECK(cuda::device_count() > 0);
    CHECK(cuda::unavailable_reason().empty());
    MESSAGE(cuda::runtime_summary());
    return;
  }
  CHECK(cuda::device_count() == 0);
  CHECK(cuda::unavailable_reason().rfind("no CUDA device", 0) == 0);
  CHECK_THROWS_WITH_AS(CudaWorld(2), doctest::Contains("the cuda backend needs a CUDA device"), Error);
  MESSAGE(("no device here, as expected in CI: " + cuda::runtime_summary()));
}

TEST_CASE("device tensors: charged to the rank's tracker while alive, the device's own figure beside it") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  MemoryTracker mem;
  const cuda::DeviceMemory before = cuda::device_memory(0);
  CHECK(before.total_bytes > 0);
  {
    DeviceTensor a({1000, 256}, MemCategory::Parameters, &mem, 0);
    DeviceTensor b({300}, MemCategory::Activations, &mem, 0, DType::I64);
    CHECK(mem.stats().current_of(MemCategory::Parameters) == 1000 * 256 * 4);
    CHECK(mem.stats().current_of(MemCategory::Activations) == 300 * 8);
    CHECK(on_host(a, dev) == std::vector<float>(256000, 0.0f));  // zero-filled
    DeviceTensor moved = std::move(a);
    CHECK(a.empty());
    CHECK(mem.stats().current_of(MemCategory::Parameters) == 1000 * 256 * 4);  // moved, not copied
    const cuda::DeviceMemory during = cuda::device_memory(0);
    MESSAGE("device 0: " << during.free_bytes << " of " << during.total_bytes << " bytes free");
  }
  CHECK(mem.stats().total_current == 0);
  CHECK(mem.stats().peak_of(MemCategory::Parameters) == 1000 * 256 * 4);
}

TEST_CASE("linear forward and backward match the CPU ops (cuBLAS transposes, bias, accumulation)") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  const int64_t B = 37, C = 53, OC = 29;  // odd sizes: leading dimensions must be right
  auto x = random_floats(B * C, 1), w = random_floats(OC * C, 2), b = random_floats(OC, 3);
  auto dout = random_floats(B * OC, 4);
  std::vector<float> out(B * OC), dx(B * C), dw(OC * C, 0.25f), db(OC, -0.5f);  // grads accumulate
  linear_forward(out.data(), x.data(), w.data(), b.data(), B, C, OC);
  linear_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), B, C, OC);

  DeviceTensor gx = on_device(x, dev), gw = on_device(w, dev), gb = on_device(b, dev), gdout = on_device(dout, dev);
  DeviceTensor gout({B * OC}, MemCategory::Other, nullptr, 0), gdx({B * C}, MemCategory::Other, nullptr, 0);
  DeviceTensor gdw = on_device(std::vector<float>(OC * C, 0.25f), dev), gdb = on_device(std::vector<float>(OC, -0.5f), dev);
  cuda::linear_forward(dev, gout.f32(), gx.f32(), gw.f32(), gb.f32(), B, C, OC);
  cuda::linear_backward(dev, gdx.f32(), gdw.f32(), gdb.f32(), gdout.f32(), gx.f32(), gw.f32(), B, C, OC);
  CHECK(max_diff(on_host(gout, dev), out, "linear forward") < kTol);
  CHECK(max_diff(on_host(gdx, dev), dx, "linear d input") < kTol);
  CHECK(max_diff(on_host(gdw, dev), dw, "linear d weight (accumulated)") < kTol);
  CHECK(max_diff(on_host(gdb, dev), db, "linear d bias (accumulated)") < kTol);

  // Without bias, and without an input gradient (the first layer).
  linear_forward(out.data(), x.data(), w.data(), nullptr, B, C, OC);
  cuda::linear_forward(dev, gout.f32(), gx.f32(), gw.f32(), nullptr, B, C, OC);
  CHECK(max_diff(on_host(gout, dev), out, "linear forward, no bias") < kTol);
  linear_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), B, C, OC);
  cuda::linear_backward(dev, nullptr, gdw.f32(), nullptr, gdout.f32(), gx.f32(), gw.f32(), B, C, OC);
  CHECK(max_diff(on_host(gdw, dev), dw, "linear d weight, second accumulation") < kTol);
}

TEST_CASE("relu forward and backward equal the CPU ops exactly") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  const int64_t N = 100003;
  auto x = random_floats(N, 5), dout = random_floats(N, 6);
  std::vector<float> out(N), dx(N);
  relu_forward(out.data(), x.data(), N);
  relu_backward(dx.data(), dout.data(), out.data(), N);
  DeviceTensor gx = on_device(x, dev), gd = on_device(dout, dev);
  DeviceTensor gout({N}, MemCategory::Other, nullptr, 0), gdx({N}, MemCategory::Other, nullptr, 0);
  cuda::relu_forward(dev, gout.f32(), gx.f32(), N);
  cuda::relu_backward(dev, gdx.f32(), gd.f32(), gout.f32(), N);
  CHECK(max_diff(on_host(gout, dev), out, "relu forward") == 0);
  CHECK(max_diff(on_host(gdx, dev), dx, "relu d input") == 0);
}

TEST_CASE("softmax cross-entropy (mean) forward and backward match the CPU ops") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  for (int64_t C : {int64_t{3}, int64_t{10}, int64_t{1000}}) {  // fewer classes than a warp, and many
    CAPTURE(C);
    const int64_t B = 65;
    auto z = random_floats(B * C, 7, 8.0f);
    std::vector<int64_t> y(B);
    for (int64_t i = 0; i < B; i++) y[size_t(i)] = (i * 7) % C;
    z[0] = 1000.0f;  // large logits do not overflow (log-sum-exp with the max subtracted)
    std::vector<float> probs(B * C), dz(B * C);
    const float loss = cross_entropy_forward(probs.data(), z.data(), y.data(), B, C);
    cross_entropy_backward(dz.data(), probs.data(), y.data(), B, C, 1.0f / B);

    DeviceTensor gz = on_device(z, dev), gy = on_device(y.data(), {B}, dev, DType::I64);
    DeviceTensor gp({B * C}, MemCategory::Other, nullptr, 0), gdz({B * C}, MemCategory::Other, nullptr, 0);
    DeviceTensor glosses({B}, MemCategory::Other, nullptr, 0), gloss({1}, MemCategory::Other, nullptr, 0);
    cuda::cross_entropy_forward(dev, gp.f32(), glosses.f32(), gloss.f32(), gz.f32(), gy.i64(), B, C);
    cuda::cross_entropy_backward(dev, gdz.f32(), gp.f32(), gy.i64(), B, C, 1.0f / B);
    const std::string c = " (C=" + std::to_string(C) + ")";
    CHECK(max_diff(on_host(gloss, dev), {loss}, "cross-entropy mean loss" + c) < kTol);
    CHECK(max_diff(on_host(gp, dev), probs, "softmax" + c) < kTol);
    CHECK(max_diff(on_host(gdz, dev), dz, "cross-entropy d logits" + c) < kTol);
  }
}

TEST_CASE("SGD (momentum, dampening, weight decay) and AdamW steps match the CPU optimizer") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  const int64_t n = 100000;
  OptimizerConfig sgd = default_optimizer_config(OptimizerKind::SGD);
  sgd.momentum = 0.9, sgd.dampening = 0.1, sgd.weight_decay = 0.01;
  OptimizerConfig plain = default_optimizer_config(OptimizerKind::SGD);
  OptimizerConfig adamw = default_optimizer_config(OptimizerKind::AdamW);
  for (const OptimizerConfig& oc : {sgd, plain, adamw}) {
    CAPTURE(oc.str());
    MemoryTracker cpu_mem, gpu_mem;
    Optimizer cpu(oc, n, &cpu_mem);
    cuda::DeviceOptimizer gpu(oc, n, &gpu_mem, dev);
    std::vector<float> p = random_floats(n, 8);
    DeviceTensor gp = on_device(p, dev);
    for (int t = 0; t < 3; t++) {
      auto g = random_floats(n, 9 + t);
      DeviceTensor gg = on_device(g, dev);
      cpu.step(p.data(), g.data());
      gpu.step(gp.f32(), gg.f32());
      CHECK(max_diff(on_host(gp, dev), p, oc.str() + " step " + std::to_string(t + 1)) < kTol);
    }
    CHECK(gpu.steps_taken() == 3);
    CHECK(gpu_mem.stats().current_of(MemCategory::OptimizerState) ==
          cpu_mem.stats().current_of(MemCategory::OptimizerState));  // lazy state, same size
  }
}

TEST_CASE("a training step of the model on the GPU matches the CPU model, with GPU-timed compute events") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  RankDevice dev(0, 0);
  const ModelSpec spec = ModelSpec::parse("mlp:20,64,64,5");
  const int64_t B = 33, D = 20, K = 5;
  auto x = random_floats(B * D, 10);
  std::vector<int64_t> y(B);
  for (int64_t i = 0; i < B; i++) y[size_t(i)] = i % K;
  OptimizerConfig oc = default_optimizer_config(OptimizerKind::AdamW);

  Model cpu(spec, nullptr, 42);
  Optimizer cpu_opt(oc, cpu.num_params(), nullptr);
  std::vector<float> probs(B * K), dlogits(B * K);
  float cpu_loss = 0;

  Model host(spec, nullptr, 42);  // describes the layers for the device model
  TraceRecorder recorder(1);
  CostModel cost(find_profile("nvlink8"), 1);
  MemoryTracker mem;
  RankContext ctx(0, &recorder, &cost, nullptr, &mem);
  cuda::DeviceModel gpu(host, &mem, dev);
  cuda::DeviceOptimizer gpu_opt(oc, gpu.num_params(), &mem, dev);
  cuda::DeviceComputeTimer timer(&ctx, dev.compute());
  gpu.set_observer(&timer);
  DeviceTensor gx = on_device(x, dev), gy = on_device(y.data(), {B}, dev, DType::I64);
  DeviceTensor gprobs({B, K}, MemCategory::Activations, &mem, 0), gdlogits({B, K}, MemCategory::Activations, &mem, 0);
  DeviceTensor glosses({B}, MemCategory::Activations, &mem, 0), gloss({1}, MemCategory::Activations, &mem, 0);
  CHECK(mem.stats().current_of(MemCategory::Parameters) == spec.num_params() * 4);

  for (int step = 0; step < 3; step++) {
    cpu.zero_grad();
    const float* logits = cpu.forward(x.data(), B);
    cpu_loss = cross_entropy_forward(probs.data(), logits, y.data(), B, K);
    cross_entropy_backward(dlogits.data(), probs.data(), y.data(), B, K, 1.0f / B);
    cpu.backward(dlogits.data());
    cpu_opt.step(cpu.params(), cpu.grads());

    gpu.zero_grad();
    const float* glogits = gpu.forward(gx.f32(), B);
    cuda::cross_entropy_forward(dev, gprobs.f32(), glosses.f32(), gloss.f32(), glogits, gy.i64(), B, K);
    cuda::cross_entropy_backward(dev, gdlogits.f32(), gprobs.f32(), gy.i64(), B, K, 1.0f / B);
    gpu.backward(gdlogits.f32());
    gpu_opt.step(gpu.params(), gpu.grads());
    CHECK(max_diff(on_host(gloss, dev), {cpu_loss}, "model loss, step " + std::to_string(step + 1)) < kTol);
  }
  Model back(spec, nullptr, 0);
  gpu.download_params(back);
  CHECK(max_diff(std::vector<float>(back.params(), back.params() + back.num_params()),
                 std::vector<float>(cpu.params(), cpu.params() + cpu.num_params()), "model parameters after 3 AdamW steps") < kTol);

  // 3 steps x (5 layers forward + 5 backward), each a Compute event timed by CUDA events.
  const int flushed = timer.flush();
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
  for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
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

std::vector<std::vector<uint8_t>> run_threads(int n, int64_t count) {
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  ThreadsWorld w(n, quiet_options());
  w.run([&](int r, Communicator& c, RankContext&) {
    std::vector<std::vector<uint8_t>> storage;
    RankMemory m{[&](int64_t bytes) { return static_cast<void*>(storage.emplace_back(size_t(bytes) + 8).data()); },
                 [](void* d, const void* h, int64_t b) { std::memcpy(d, h, size_t(b)); },
                 [](void* h, const void* s, int64_t b) { std::memcpy(h, s, size_t(b)); }};
    storage.reserve(64);  // pointers handed out stay valid
    collective_program(r, n, count, c, m, out[size_t(r)]);
  });
  return out;
}

std::vector<std::vector<uint8_t>> run_cuda(int n, int64_t count, std::string* backend = nullptr) {
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  CudaWorld w(n, quiet_options());
  w.run([&](int r, Communicator& c, RankContext& ctx, RankDevice& dev) {
    if (backend && r == 0) *backend = c.backend_name();
    std::vector<DeviceTensor> storage;
    RankMemory m{[&](int64_t bytes) {
                   storage.emplace_back(Shape{bytes / 4 + 2}, MemCategory::CommBuffers, ctx.memory(), dev.device());
                   return storage.back().raw();
                 },
                 [&](void* d, const void* h, int64_t b) {
                   DTLAB_CUDA_CHECK(cudaMemcpyAsync(d, h, size_t(b), cudaMemcpyHostToDevice, dev.compute()));
                   dev.sync_compute();
                 },
                 [&](void* h, const void* s, int64_t b) {
                   DTLAB_CUDA_CHECK(cudaMemcpyAsync(h, s, size_t(b), cudaMemcpyDeviceToHost, dev.compute()));
                   dev.sync_compute();
                 }};
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
      auto want = run_threads(n, count);
      auto got = run_cuda(n, count, &backend);
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
  CudaWorld w(n, o);
  std::string error;
  std::thread runner([&] {
    try {
      w.run([&](int r, Communicator& c, RankContext& ctx, RankDevice& dev) {
        DeviceTensor buf({count}, MemCategory::CommBuffers, ctx.memory(), dev.device());
        c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto ring_steps = [&](int r) {
    std::vector<Event> v;
    for (const Event& e : w.world().recorder().events(r))
      if (e.kind == EventKind::RingStep) v.push_back(e);
    return v;
  };
  Stepper& st = w.world().stepper();
  const auto patience = std::chrono::milliseconds(20000);
  REQUIRE(st.wait_until_all_blocked(1, patience));  // every comm worker at collective #0's gate
  st.step(GateKind::RingStep);                       // up to the gate of ring step 0
  REQUIRE(st.wait_until_all_blocked(1, patience));
  for (int s = 0; s + 1 < steps; s++) {
    CAPTURE(s);
    st.step(GateKind::RingStep);
    REQUIRE(st.wait_until_all_blocked(1, patience));
    for (int r = 0; r < n; r++) CHECK(ring_steps(r).size() == size_t(s + 1));
    WorldStatus ws = w.world().status();
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
  CudaWorld w(n, quiet_options());
  std::vector<std::vector<float>> out(n);
  w.run([&](int r, Communicator& c, RankContext& ctx, RankDevice& dev) {
    DeviceTensor x({count}, MemCategory::Activations, ctx.memory(), dev.device());
    DeviceTensor buf({count}, MemCategory::Gradients, ctx.memory(), dev.device());
    std::vector<float> ones(size_t(count), 1.0f + r);
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(x.raw(), ones.data(), size_t(count) * 4, cudaMemcpyHostToDevice, dev.compute()));
    dev.sync_compute();
    // Enqueued, not waited for: the all-reduce must still see its result.
    for (int k = 0; k < 20; k++) cuda::relu_forward(dev, buf.f32(), x.f32(), count);
    c.all_reduce(buf.f32(), count, DType::F32, ReduceOp::Sum)->wait();
    out[size_t(r)] = on_host(buf, dev);
  });
  for (int r = 0; r < n; r++) CHECK(std::count(out[size_t(r)].begin(), out[size_t(r)].end(), 3.0f) == count);
}

TEST_CASE("cuda backend: world size limits and bad devices are one-sentence errors") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  CHECK_THROWS_WITH_AS(CudaWorld(17), doctest::Contains("use 1 to 16"), Error);
  CHECK_THROWS_WITH_AS(CudaWorld(2, quiet_options(), {cuda::device_count()}), doctest::Contains("does not exist"), Error);
}

// ---- training on the GPU (engine/cuda/cuda_train.h) ----

namespace {

// Per-step losses and the final training-set loss of one run.
struct RunLosses {
  std::vector<float> steps;
  float eval = 0;
};

template <class T>
RunLosses train_losses(const TrainConfig& c) {
  T t(c);
  RunLosses out;
  const TrainSummary s = t.run([&](const StepReport& r) { out.steps.push_back(r.loss); });
  out.eval = s.eval_loss;
  return out;
}

void check_follows_cpu(TrainConfig c, const std::string& backend, const std::string& what) {
  c.device = "cpu";
  c.backend = "threads";
  const RunLosses cpu = train_losses<Trainer>(c);
  c.device = "cuda";
  c.backend = backend;
  const RunLosses gpu = train_losses<CudaTrainer>(c);
  REQUIRE(gpu.steps.size() == cpu.steps.size());
  CHECK(max_diff(gpu.steps, cpu.steps, what + ": loss of every step") < 1e-4);
  CHECK(max_diff({gpu.eval}, {cpu.eval}, what + ": training-set loss after the last step") < 1e-4);
}

}  // namespace

TEST_CASE("train --device cuda: one rank, and DDP of 4 ranks sharing the GPU, follow the CPU engine step by step") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  TrainConfig c;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.steps = 8;
  c.batch = 16;
  check_follows_cpu(c, "cuda", "single");
  c.strategy = "ddp";
  c.world_size = 4;
  check_follows_cpu(c, "cuda", "ddp, cuda backend, 4 ranks");
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.momentum = 0.9;
  c.accum = 2;
  check_follows_cpu(c, "cuda", "ddp, SGD with momentum, accumulation 2");
}

#if DTLAB_HAVE_NCCL
TEST_CASE("train --device cuda --backend nccl: DDP with one GPU per rank follows the CPU engine") {
  DTLAB_REQUIRE_CUDA_DEVICE();
  if (cuda::device_count() < 2) {
    MESSAGE("skipped: needs 2 CUDA devices (this machine has " << cuda::device_count() << ")");
    return;
  }
  TrainConfig c;
  c.strategy = "ddp";
  c.world_size = 2;
  c.model = ModelSpec::parse("mlp:2,32,32,3");
  c.steps = 8;
  c.batch = 16;
  check_follows_cpu(c, "nccl", "ddp, nccl backend, 2 GPUs");
}
#endif

}  // TEST_SUITE

#endif  // DTLAB_HAVE_CUDA
