// The device interface: where a rank's tensors live and what runs on them. Everything above it (the
// model's per-layer forward and backward, the loss, the optimizers, DDP's buckets, FSDP's units, the
// pipeline runtime) is written once against this class and runs on either implementation:
//   engine/core/cpu_device.cpp    the CPU: host memory, OpenBLAS GEMMs and the loops of ops.h
//   engine/cuda/cuda_device.cpp   a GPU: device memory, cuBLAS and the kernels in engine/cuda, a
//                                 compute stream and a communication stream per rank, CUDA events
// Calls are ordered on the device's compute stream and return without waiting (the CPU's return
// done); download() and synchronize() are the points where the host waits. Pointers are the
// device's own memory unless a name says host.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/half.h"
#include "engine/core/observer.h"
#include "engine/core/optim_math.h"

namespace dtlab {

enum class DeviceKind : uint8_t { CPU, CUDA };

class RankContext;  // engine/trace/context.h

// Compute events of a device: ops are reported to it as to any ComputeObserver; flush() (at the end
// of an iteration) hands the finished ops' events to the rank's context. On the CPU the host clock is
// the device clock, so it forwards at once; on a GPU it times the ops with events on the stream.
class DeviceTimer : public ComputeObserver {
 public:
  virtual int flush() { return 0; }
};

// What a loss computation leaves on the device: the step's sums, read back once per step (a GPU does
// not stop for them every micro-batch). Laid out as two doubles: loss x samples, correct predictions.
inline constexpr int kLossStatsDoubles = 2;

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  // Host memory is this device's memory: the host may read and write its tensors directly.
  bool is_host() const { return kind() == DeviceKind::CPU; }

  // ---- memory ----
  // Zero-filled, 64-byte aligned on the host; throws std::bad_alloc (host) or dtlab::Error (device).
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void fill_zero(void* p, int64_t bytes) = 0;
  virtual void copy(void* dst, const void* src, int64_t bytes) = 0;           // device to device
  virtual void upload(void* dst, const void* host_src, int64_t bytes) = 0;    // the host buffer may be reused on return
  virtual void download(void* host_dst, const void* src, int64_t bytes) = 0;  // returns with the bytes on the host
  virtual void synchronize() {}  // the host waits for everything enqueued so far
  // Makes this device the calling thread's (a GPU's current device is per host thread): every thread
  // that enqueues work for a rank calls it first (the rank's own, its process groups' executor).
  virtual void bind_thread() {}

  // ---- 16-bit tensors (--precision bf16/fp16): engine/core/half.h's conversions, bit for bit ----
  virtual void widen_half(float* dst, const uint16_t* src, int64_t n, HalfFormat f) = 0;   // exact
  virtual void narrow_half(uint16_t* dst, const float* src, int64_t n, HalfFormat f) = 0;  // nearest, ties to even
  virtual void round_half(float* x, int64_t n, HalfFormat f) = 0;  // x = round_to_half(x): what 16 bits keep
  // acc = acc + x, or max(acc, x), each element in float and rounded once (reduce_kernels.h's reduce_half).
  virtual void accumulate_half(uint16_t* acc, const uint16_t* x, int64_t n, bool max, HalfFormat f) = 0;
  // Whether every element is finite (GradScaler's found_inf); the host waits for the answer.
  virtual bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat f) = 0;
  virtual bool all_finite(const float* x, int64_t n) = 0;

  // ---- element-wise ----
  virtual void scale(float* x, int64_t n, float s) = 0;                         // x *= s
  virtual void scale_copy(float* dst, const float* src, int64_t n, float s) = 0;  // dst = src * s
  virtual void accumulate(float* acc, const float* x, int64_t n, bool max) = 0;   // acc = acc + x, or max(acc, x)

  // ---- layers (engine/core/ops.h's contracts: parameter gradients accumulate, input gradients are
  // overwritten, null skips a result) ----
  virtual void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int64_t B, int64_t C, int64_t OC) = 0;
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int64_t B, int64_t C, int64_t OC) = 0;
  virtual void relu_forward(float* out, const float* inp, int64_t N) = 0;
  virtual void relu_backward(float* dinp, const float* dout, const float* out, int64_t N) = 0;

  // ---- the transformer's layers (engine/core/gpt_ops.h's contracts, which the CPU runs) ----
  // LayerNorm over rows of C: out, mean, rstd (N) overwritten; backward adds into dinp, dw and db (dw and
  // db null together: frozen weights).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                 int64_t N, int64_t C) = 0;
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                                  const float* mean, const float* rstd, int64_t N, int64_t C) = 0;
  // GELU (erf form); the backward writes d = dout * GELU'(inp), d may equal dout.
  virtual void gelu_forward(float* out, const float* inp, int64_t N) = 0;
  virtual void gelu_backward(float* d, const float* dout, const float* inp, int64_t N) = 0;
  // Causal self-attention on the fused qkv (B*T, 3C) of NH heads: out (B*T, C), att (B, NH, T, T) the
  // softmax; the backward overwrites dqkv, and datt is T x T floats of scratch (a device may use its own).
  // `round16` (autocast's 16-bit attention; null: float32 inside): each op of nanoGPT's unfused
  // attention rounds its result as torch's bf16/fp16 ops do: q k^T, the scaling, the softmax (which
  // att v then reads); backward dy v^T, the softmax's backward and the scaling's. The caller rounds
  // out and dqkv.
  virtual void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                                 const HalfFormat* round16) = 0;
  virtual void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att,
                                  int64_t B, int64_t T, int64_t C, int64_t NH, const HalfFormat* round16) = 0;
  // Token and position embeddings of R rows: row i is sample i / Tl's position t0 + i % Tl (of T),
  // idx (samples x T) on the device; the backward adds each row into its token's and position's rows.
  virtual void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl,
                                 int64_t T, int64_t t0, int64_t C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl,
                                  int64_t T, int64_t t0, int64_t C) = 0;
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;               // out = a + b
  virtual void add_rows(float* y, const float* bias, int64_t R, int64_t C) = 0;              // y[i, :] += bias
  virtual void sum_rows(float* acc, const float* x, int64_t R, int64_t C) = 0;               // acc += sum over i of x[i, :]

  // ---- loss: softmax cross-entropy with mean reduction ----
  // probs (B, C) receives the softmax; stats (kLossStatsDoubles) gains loss x B and the number of
  // rows whose argmax (lowest index on ties, as torch.argmax) equals the target. Targets (B) live on
  // the device and must lie in [0, C) (checked on the host before upload).
  virtual void cross_entropy_forward(float* probs, double* stats, const float* logits, const int64_t* targets,
                                     int64_t B, int64_t C) = 0;
  // dlogits = (probs - onehot(targets)) * scale
  virtual void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets, int64_t B,
                                      int64_t C, float scale) = 0;

  // ---- optimizers (optim_math.h's element updates) ----
  // buf: the momentum buffer or null; first: the optimizer's first step (buf = d_p).
  virtual void sgd_step(float* params, const float* grads, float* buf, int64_t n, SgdCoeffs k, bool first) = 0;
  virtual void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, AdamWCoeffs k) = 0;

  // ---- instrumentation ----
  // A timer for this device's ops whose events go to `ctx`; null where the host clock times them and
  // the ops report to the context directly (the CPU). device_observer() picks for the caller.
  virtual std::unique_ptr<DeviceTimer> make_timer(RankContext* ctx) { return nullptr; }
  // The device's own used and total bytes (cudaMemGetInfo: every context on it); false on the CPU.
  virtual bool memory_info(int64_t& used, int64_t& total) const { return false; }
};

// Host float32 values into 16-bit tensors on `dev` and back: rounded on the host (half.h), then copied.
void upload_half(Device& dev, uint16_t* dst, const float* host, int64_t n, HalfFormat f);
void download_half(const Device& dev, float* host, const uint16_t* src, int64_t n, HalfFormat f);

// The one CPU device (stateless; every CPU rank shares it).
Device& cpu_device();

}  // namespace dtlab
