// The nccl backend: every collective against closed-form expectations (inputs are small integers,
// so sums are exact whatever order NCCL adds in), one stepper gate per collective, the watchdog's
// ncclCommAbort with a diagnosis, and the one-process-per-rank path (unique id over the TCP
// rendezvous), both as NcclProcess over a rank's RankDevice and as the trainer reaches it
// (cuda::make_device + cuda::join_nccl). Buffers are Tensors on each rank's CudaDevice. One rank per
// GPU: cases needing more GPUs than the machine has print "skipped: needs N CUDA devices" (or
// "skipped: no CUDA device"), which CTest reports as skipped.
#include <doctest/doctest.h>

#if DTLAB_HAVE_NCCL

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/nccl_backend.h"
#include "engine/comm/socket_mesh.h"  // pick_free_port
#include "engine/core/tensor.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/platform.h"
#include "engine/trace/event.h"

using namespace dtlab;
using cuda::CudaDevice;
using cuda::RankDevice;

namespace {

// True when the machine has `n` GPUs; otherwise says why the case is skipped.
bool have_gpus(int n) {
  if (!cuda::cuda_available()) {
    MESSAGE(("skipped: " + cuda::unavailable_reason()));
    return false;
  }
  if (cuda::device_count() < n) {
    MESSAGE(("skipped: needs " + std::to_string(n) + " CUDA devices (this machine has " +
            std::to_string(cuda::device_count()) + ")"));
    return false;
  }
  return true;
}

float input(int r, int64_t i) { return float((r + 1) * (i % 5 + 1)); }

std::vector<float> nccl_inputs(int r, int64_t count, int64_t offset = 0) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; i++) v[size_t(i)] = input(r, offset + i);
  return v;
}

Tensor on_device(const std::vector<float>& v, Device& dev) {
  Tensor t({int64_t(v.size())}, MemCategory::CommBuffers, nullptr, DType::F32, dev);
  dev.upload(t.raw(), v.data(), t.nbytes());
  return t;
}

std::vector<float> on_host(const Tensor& t, int64_t count) {
  std::vector<float> v(size_t(t.numel()));
  t.device().download(v.data(), t.raw(), t.nbytes());
  v.resize(size_t(count));
  return v;
}

// Relative difference within 1e-6 (NCCL's avg multiplies by 1/n before it adds).
int64_t nccl_count_wrong(const std::vector<float>& got, const std::vector<float>& want) {
  int64_t wrong = 0;
  for (size_t i = 0; i < want.size(); i++) wrong += std::abs(got[i] - want[i]) > 1e-6f * std::max(1.0f, std::abs(want[i]));
  return wrong;
}

WorldOptions options(double timeout_s = 30) {
  WorldOptions o;
  o.timeout_s = timeout_s;
  o.record = true;
  o.trace_capacity = 1 << 12;
  return o;
}

}  // namespace

TEST_SUITE("nccl") {

TEST_CASE("nccl: the library's version, and one sentence when the machine lacks GPUs") {
  CHECK(nccl_version().rfind("2.", 0) == 0);
  MESSAGE(("NCCL " + nccl_version()));
  const int have = cuda::device_count();
  CHECK_THROWS_WITH_AS(NcclWorld(have + 1), doctest::Contains("the nccl backend needs one GPU per rank"), Error);
  if (!cuda::cuda_available())  // the trainer's door says the same in its own words
    CHECK_THROWS_WITH_AS(cuda::make_nccl_world(2, options()), doctest::Contains("--backend nccl: no CUDA device"), Error);
}

TEST_CASE("nccl: every collective on one rank per GPU matches its closed form") {
  if (!have_gpus(1)) return;
  const int n = std::min(cuda::device_count(), 8);
  if (n == 1) MESSAGE("one GPU: world 1 only (a ring needs 2 CUDA devices)");
  const int64_t count = 1001;
  NcclWorld w(n, options());
  std::vector<int64_t> wrong(size_t(n), 0);
  w.run([&](int r, Communicator& c, RankContext&, RankDevice& rank_device) {
    CHECK(std::string(c.backend_name()) == "nccl");
    CudaDevice dev(rank_device);  // before the tensors: they free on its stream
    int64_t& bad = wrong[size_t(r)];
    auto expect = [&](const Tensor& t, int64_t len, auto f) {
      std::vector<float> want(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; i++) want[size_t(i)] = f(i);
      bad += nccl_count_wrong(on_host(t, len), want);
    };
    const float tri = float(n * (n + 1) / 2);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      Tensor b = on_device(nccl_inputs(r, count), dev);
      c.all_reduce(b.f32(), count, DType::F32, op)->wait();
      expect(b, count, [&](int64_t i) {
        const float base = float(i % 5 + 1);
        return op == ReduceOp::Sum ? tri * base : op == ReduceOp::Avg ? tri * base / float(n) : float(n) * base;
      });
    }
    Tensor rs_in = on_device(nccl_inputs(r, count * n), dev), rs_out = on_device(std::vector<float>(size_t(count)), dev);
    c.reduce_scatter(rs_out.f32(), rs_in.f32(), count, DType::F32, ReduceOp::Sum)->wait();
    expect(rs_out, count, [&](int64_t i) { return tri * float((r * count + i) % 5 + 1); });
    Tensor ag_in = on_device(nccl_inputs(r, count), dev), ag_out = on_device(std::vector<float>(size_t(count * n)), dev);
    c.all_gather(ag_out.f32(), ag_in.f32(), count, DType::F32)->wait();
    expect(ag_out, count * n, [&](int64_t i) { return input(int(i / count), i % count); });
    Tensor bc = on_device(nccl_inputs(r, count), dev);
    c.broadcast(bc.f32(), count, DType::F32, n - 1)->wait();
    expect(bc, count, [&](int64_t i) { return input(n - 1, i); });
    Tensor rd = on_device(nccl_inputs(r, count), dev);
    c.reduce(rd.f32(), count, DType::F32, ReduceOp::Max, 0)->wait();
    expect(rd, count, [&](int64_t i) { return r == 0 ? float(n * (i % 5 + 1)) : input(r, i); });
    Tensor a2a_in = on_device(nccl_inputs(r, count * n), dev), a2a_out = on_device(std::vector<float>(size_t(count * n)), dev);
    c.all_to_all(a2a_out.f32(), a2a_in.f32(), count, DType::F32)->wait();
    expect(a2a_out, count * n, [&](int64_t i) { return input(int(i / count), r * count + i % count); });
    if (n > 1) {  // a ring of sends needs the receives in flight: sends complete when received
      Tensor s = on_device(nccl_inputs(r, count), dev), rv = on_device(std::vector<float>(size_t(count)), dev);
      WorkPtr recv = r % 2 ? c.recv(rv.f32(), count, DType::F32, (r - 1 + n) % n) : nullptr;
      WorkPtr send = c.send(s.f32(), count, DType::F32, (r + 1) % n);
      if (!recv) recv = c.recv(rv.f32(), count, DType::F32, (r - 1 + n) % n);
      send->wait();
      recv->wait();
      expect(rv, count, [&](int64_t i) { return input((r - 1 + n) % n, i); });
    }
    c.barrier()->wait();
  });
  int64_t total = 0;
  for (int64_t v : wrong) total += v;
  MESSAGE("world " << n << ": #wrong " << total);
  CHECK(total == 0);
  CHECK(!w.recorder().events(0).empty());
}

TEST_CASE("nccl: the world as the trainer sees it (make_nccl_world): one CudaDevice per rank, on its own GPU") {
  if (!have_gpus(1)) return;
  const int n = std::min(cuda::device_count(), 4);
  std::unique_ptr<RankWorld> w = cuda::make_nccl_world(n, options());
  CHECK(std::string(w->backend()) == "nccl");
  std::vector<int64_t> wrong(size_t(n), 0);
  w->run([&](int r, Communicator& c, RankContext& ctx, Device& dev) {
    CHECK(&dev == &w->device(r));
    CHECK(dev.name() == "cuda:" + std::to_string(r));
    Tensor b({1000}, MemCategory::Gradients, ctx.memory(), DType::F32, dev);
    const std::vector<float> v = nccl_inputs(r, 1000);
    dev.upload(b.raw(), v.data(), b.nbytes());
    dev.scale(b.f32(), 1000, 2.0f);  // enqueued on the compute stream; the all-reduce is ordered after it
    c.all_reduce(b.f32(), 1000, DType::F32, ReduceOp::Sum)->wait();
    std::vector<float> want(1000);
    for (int64_t i = 0; i < 1000; i++) want[size_t(i)] = 2.0f * float(n * (n + 1) / 2) * float(i % 5 + 1);
    wrong[size_t(r)] = nccl_count_wrong(on_host(b, 1000), want);
  });
  for (int r = 0; r < n; r++) CHECK(wrong[size_t(r)] == 0);
}

TEST_CASE("nccl: the stepper holds each collective at one gate, then one step releases one collective") {
  if (!have_gpus(1)) return;
  const int n = std::min(cuda::device_count(), 4);
  WorldOptions o = options();
  o.start_paused = true;
  NcclWorld w(n, o);
  std::string error;
  std::thread runner([&] {
    try {
      w.run([&](int r, Communicator& c, RankContext&, RankDevice& rank_device) {
        CudaDevice dev(rank_device);
        Tensor b = on_device(nccl_inputs(r, 100), dev);
        for (int k = 0; k < 3; k++) c.all_reduce(b.f32(), 100, DType::F32, ReduceOp::Sum)->wait();
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  auto collectives = [&] {
    size_t k = 0;
    for (const Event& e : w.recorder().events(0)) k += e.kind == EventKind::Collective;
    return k;
  };
  const auto patience = std::chrono::milliseconds(20000);
  REQUIRE(w.stepper().wait_until_settled(patience));
  CHECK(collectives() == 0);
  for (size_t k = 1; k <= 2; k++) {
    w.stepper().step(GateKind::Collective);
    REQUIRE(w.stepper().wait_until_settled(patience));
    CHECK(collectives() == k);
  }
  w.stepper().run();
  runner.join();
  CHECK(error == "");
  CHECK(collectives() == 3);
}

TEST_CASE("nccl: watchdog: a rank that skips a collective is named, and the communicators are aborted") {
  if (!have_gpus(2)) return;
  WorldOptions o = options(3);
  o.faults.push_back(parse_fault("skip:rank=1,collective=0"));
  NcclWorld w(2, o);
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    w.run([&](int r, Communicator& c, RankContext&, RankDevice& rank_device) {
      CudaDevice dev(rank_device);
      Tensor b = on_device(nccl_inputs(r, 1000), dev);
      c.all_reduce(b.f32(), 1000, DType::F32, ReduceOp::Sum)->wait();
      c.all_reduce(b.f32(), 1000, DType::F32, ReduceOp::Sum)->wait();
    });
  } catch (const CommError& e) {
    what = e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(what);
  CHECK(what.find("watchdog") != std::string::npos);
  CHECK(what.find("ncclCommAbort") != std::string::npos);
  CHECK(took < 30);
}

TEST_CASE("nccl: one process per rank: the unique id crosses the TCP rendezvous, then ncclCommInitRank") {
  if (!have_gpus(2)) return;
  const int n = 2;
  // Both ways in: NcclProcess over the rank's own RankDevice, and the trainer's launched path
  // (make_device, then join_nccl over that Device).
  for (bool via_platform : {false, true}) {
    CAPTURE(via_platform);
    const int port = pick_free_port("127.0.0.1");
    std::vector<std::vector<float>> out(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> ranks;
    for (int r = 0; r < n; r++)
      ranks.emplace_back([&, r] {
        try {
          SocketOptions so;
          so.rank = r;
          so.world_size = n;
          so.master_port = port;
          so.timeout_s = 30;
          const std::vector<float> v = nccl_inputs(r, 1000);
          if (via_platform) {
            std::unique_ptr<Device> dev = cuda::make_device(r, r);
            std::unique_ptr<cuda::LaunchedRank> joined = cuda::join_nccl(so, *dev, nullptr);
            Tensor b = on_device(v, *dev);
            joined->comm().all_reduce(b.f32(), 1000, DType::F32, ReduceOp::Sum)->wait();
            out[size_t(r)] = on_host(b, 1000);
          } else {
            RankDevice rank_device(r, r);
            CudaDevice dev(rank_device);
            NcclProcess p(so, rank_device, nullptr);
            CHECK(&p.device() == &rank_device);
            Tensor b = on_device(v, dev);
            p.comm().all_reduce(b.f32(), 1000, DType::F32, ReduceOp::Sum)->wait();
            out[size_t(r)] = on_host(b, 1000);
          }
        } catch (const std::exception& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < n; r++) {
      CHECK(errors[size_t(r)] == "");
      std::vector<float> want(1000);
      for (int64_t i = 0; i < 1000; i++) want[size_t(i)] = 3.0f * float(i % 5 + 1);
      CHECK(nccl_count_wrong(out[size_t(r)], want) == 0);
    }
  }
}

}  // TEST_SUITE

#endif  // DTLAB_HAVE_NCCL
