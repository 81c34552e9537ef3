// A GPU the CPU can run: every rank's memory is host memory at an address the host cannot read.
// Device pointers carry a tag that makes them non-canonical on x86-64, so code that loops over
// device memory on the host (what a GPU forbids) faults at once, here, without a GPU; the device's
// ops, the data mover and upload/download take the tag off and run the CPU's own code. The trainer
// runs on it through set_test_world (engine/comm/world.h): the same results as the CPU, bit for
// bit, unless a host loop or a missing upload/download is on the way.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/comm/data_mover.h"
#include "engine/comm/world.h"
#include "engine/core/check.h"
#include "engine/core/device.h"

namespace dtlab::test {

namespace hostless_detail {

// Bit 62 set, bit 47 clear: no x86-64 address (without Linear Address Masking, which a process must
// ask for). arm64's top-byte-ignore would read such an address, so the suite runs on x86-64 only.
constexpr uintptr_t kTag = uintptr_t{1} << 62;

template <class T>
T* tag(T* p) {
  return p ? reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) | kTag) : p;
}
// A device pointer's host address; a host pointer (a staged message, a caller's buffer) unchanged.
template <class T>
T* host(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) & ~kTag);
}

class TaggedDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::CUDA; }  // not host memory: what a GPU is to the host
  std::string name() const override { return "hostless"; }
  void* allocate(int64_t bytes) override { return tag(cpu().allocate(bytes)); }
  void release(void* p) override { cpu().release(dv(p)); }
  void fill_zero(void* p, int64_t bytes) override { cpu().fill_zero(dv(p), bytes); }
  void copy(void* dst, const void* src, int64_t bytes) override { cpu().copy(dv(dst), dv(src), bytes); }
  void upload(void* dst, const void* host_src, int64_t bytes) override { cpu().upload(dv(dst), untagged(host_src), bytes); }
  void download(void* host_dst, const void* src, int64_t bytes) override { cpu().download(untagged(host_dst), dv(src), bytes); }

  void widen_half(float* dst, const uint16_t* src, int64_t n, HalfFormat f) override { cpu().widen_half(dv(dst), dv(src), n, f); }
  void narrow_half(uint16_t* dst, const float* src, int64_t n, HalfFormat f) override { cpu().narrow_half(dv(dst), dv(src), n, f); }
  void round_half(float* x, int64_t n, HalfFormat f) override { cpu().round_half(dv(x), n, f); }
  void accumulate_half(uint16_t* acc, const uint16_t* x, int64_t n, bool max, HalfFormat f) override {
    cpu().accumulate_half(dv(acc), dv(x), n, max, f);
  }
  bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat f) override { return cpu().half_all_finite(dv(x), n, f); }
  bool all_finite(const float* x, int64_t n) override { return cpu().all_finite(dv(x), n); }

  void scale(float* x, int64_t n, float s) override { cpu().scale(dv(x), n, s); }
  void scale_copy(float* dst, const float* src, int64_t n, float s) override { cpu().scale_copy(dv(dst), dv(src), n, s); }
  void accumulate(float* acc, const float* x, int64_t n, bool max) override { cpu().accumulate(dv(acc), dv(x), n, max); }

  void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B, int64_t C, int64_t OC) override {
    cpu().linear_forward(dv(out), dv(inp), dv(weight), dv(bias), B, C, OC);
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, int64_t B,
                       int64_t C, int64_t OC) override {
    cpu().linear_backward(dv(dinp), dv(dweight), dv(dbias), dv(dout), dv(inp), dv(weight), B, C, OC);
  }
  void relu_forward(float* out, const float* inp, int64_t N) override { cpu().relu_forward(dv(out), dv(inp), N); }
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t N) override {
    cpu().relu_backward(dv(dinp), dv(dout), dv(out), N);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) override {
    cpu().layernorm_forward(dv(out), dv(mean), dv(rstd), dv(inp), dv(w), dv(b), N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w, const float* mean,
                          const float* rstd, int64_t N, int64_t C) override {
    cpu().layernorm_backward(dv(dinp), dv(dw), dv(db), dv(dout), dv(inp), dv(w), dv(mean), dv(rstd), N, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override { cpu().gelu_forward(dv(out), dv(inp), N); }
  void gelu_backward(float* d, const float* dout, const float* inp, int64_t N) override { cpu().gelu_backward(dv(d), dv(dout), dv(inp), N); }
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                         const HalfFormat* round16) override {
    cpu().attention_forward(dv(out), dv(att), dv(qkv), B, T, C, NH, round16);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH, const HalfFormat* round16) override {
    cpu().attention_backward(dv(dqkv), dv(datt), dv(dout), dv(qkv), dv(att), B, T, C, NH, round16);
  }
  void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl, int64_t T, int64_t t0,
                         int64_t C) override {
    cpu().embedding_forward(dv(x), dv(wte), dv(wpe), dv(idx), R, Tl, T, t0, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl, int64_t T, int64_t t0,
                          int64_t C) override {
    cpu().embedding_backward(dv(dwte), dv(dwpe), dv(dx), dv(idx), R, Tl, T, t0, C);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override { cpu().add(dv(out), dv(a), dv(b), n); }
  void add_rows(float* y, const float* bias, int64_t R, int64_t C) override { cpu().add_rows(dv(y), dv(bias), R, C); }
  void sum_rows(float* acc, const float* x, int64_t R, int64_t C) override { cpu().sum_rows(dv(acc), dv(x), R, C); }
  void cross_entropy_forward(float* probs, double* stats, const float* logits, const int64_t* targets, int64_t B, int64_t C) override {
    cpu().cross_entropy_forward(dv(probs), dv(stats), dv(logits), dv(targets), B, C);
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets, int64_t B, int64_t C, float scale) override {
    cpu().cross_entropy_backward(dv(dlogits), dv(probs), dv(targets), B, C, scale);
  }
  void sgd_step(float* params, const float* grads, float* buf, int64_t n, SgdCoeffs k, bool first) override {
    cpu().sgd_step(dv(params), dv(grads), dv(buf), n, k, first);
  }
  void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, AdamWCoeffs k) override {
    cpu().adamw_step(dv(params), dv(grads), dv(m), dv(v), n, k);
  }

 private:
  static Device& cpu() { return cpu_device(); }
  // A device pointer's host address. Host memory handed where the device's is meant (a GPU's
  // cudaMemcpy of the wrong kind, a kernel reading a host address) is refused.
  template <class T>
  static T* dv(T* p) {
    DTLAB_CHECK(p == nullptr || (reinterpret_cast<uintptr_t>(p) & kTag) != 0,
                "hostless device: host memory passed where device memory is expected");
    return host(p);
  }
  // upload's source and download's destination are the host's: a tagged one is device memory
  // handed where the host's was meant, which a GPU would reject (cudaMemcpy of the wrong kind).
  template <class T>
  static T* untagged(T* p) {
    DTLAB_CHECK((reinterpret_cast<uintptr_t>(p) & kTag) == 0, "hostless device: a device pointer passed as host memory to upload/download");
    return p;
  }
};

class TaggedScratch final : public CommScratch {
 public:
  explicit TaggedScratch(std::unique_ptr<CommScratch> s) : s_(std::move(s)) {}
  void* data() override { return tag(s_->data()); }

 private:
  std::unique_ptr<CommScratch> s_;
};

// The host mover on untagged addresses (a point-to-point message staged on the host has none).
class TaggedMover final : public DataMover {
 public:
  const char* device_name() const override { return "hostless"; }
  void copy(int rank, void* dst, const void* src, int64_t bytes) override { m_->copy(rank, host(dst), host(src), bytes); }
  void reduce_into(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op) override {
    m_->reduce_into(rank, host(dst), host(src), count, dt, op);
  }
  void reduce_to(int rank, void* dst, const void* a, const void* b, int64_t count, DType dt, ReduceOp op) override {
    m_->reduce_to(rank, host(dst), host(a), host(b), count, dt, op);
  }
  void finish_avg(int rank, void* buf, int64_t count, DType dt, ReduceOp op, int world_size) override {
    m_->finish_avg(rank, host(buf), count, dt, op, world_size);
  }
  std::unique_ptr<CommScratch> scratch(int rank, int64_t bytes, MemoryTracker* tracker) override {
    return std::make_unique<TaggedScratch>(m_->scratch(rank, bytes, tracker));
  }
  bool slice_ring_steps() const override { return false; }  // as a GPU's mover

 private:
  std::shared_ptr<DataMover> m_ = host_mover();
};

class HostlessWorld final : public RankWorld {
 public:
  HostlessWorld(int n, WorldOptions o) : world_(n, with_mover(std::move(o))), devices_(static_cast<size_t>(n)) {}
  const char* backend() const override { return "threads"; }
  ThreadsWorld& threads() override { return world_; }
  Communicator& comm(int rank) override { return world_.comm(rank); }
  Device& device(int rank) override { return devices_.at(static_cast<size_t>(rank)); }
  void run(const std::function<void(int, Communicator&, RankContext&, Device&)>& fn) override {
    world_.run([&](int rank, Communicator& comm, RankContext& ctx) { fn(rank, comm, ctx, device(rank)); });
  }

 private:
  static WorldOptions with_mover(WorldOptions o) {
    o.mover = std::make_shared<TaggedMover>();
    return o;
  }
  ThreadsWorld world_;
  std::vector<TaggedDevice> devices_;
};

}  // namespace hostless_detail

// The in-process world of tagged devices and the tagged mover over ThreadsWorld.
inline std::unique_ptr<RankWorld> make_hostless_world(int world_size, WorldOptions options) {
  return std::make_unique<hostless_detail::HostlessWorld>(world_size, std::move(options));
}

// Whether a tagged address faults on this machine (x86-64); elsewhere the suite says it skips.
#if defined(__x86_64__)
inline constexpr bool kHostlessFaults = true;
#else
inline constexpr bool kHostlessFaults = false;
#endif

// While alive, the trainer's in-process worlds are hostless ones.
struct HostlessWorlds {
  HostlessWorlds() { set_test_world(&make_hostless_world); }
  ~HostlessWorlds() { set_test_world(nullptr); }
  HostlessWorlds(const HostlessWorlds&) = delete;
  HostlessWorlds& operator=(const HostlessWorlds&) = delete;
};

}  // namespace dtlab::test
