#include "engine/cuda/cuda_device.h"

#include "engine/cuda/compute_timer.h"
#include "engine/cuda/runtime.h"
#include "engine/cuda/kernels.h"
#include "engine/cuda/ops.h"

namespace dtlab::cuda {

namespace {

// Makes `device` current for a scope and restores the thread's previous device: a tensor may be
// freed by a thread that works for another GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

CudaDevice::CudaDevice(const RankDevice& rank) : rank_(rank), staging_(std::make_unique<PinnedStaging>(rank.compute())) {}
CudaDevice::CudaDevice(std::unique_ptr<RankDevice> owned)
    : owned_(std::move(owned)), rank_(*owned_), staging_(std::make_unique<PinnedStaging>(rank_.compute())) {}
CudaDevice::~CudaDevice() {
  loss_scratch_ = Tensor();  // frees on the stream before the stream goes
  attention_scratch_ = Tensor();
  staging_.reset();  // waits for its last copies before the stream goes
  if (owned_) cudaStreamSynchronize(rank_.compute());
}

std::string CudaDevice::name() const { return "cuda:" + std::to_string(rank_.device()); }

void* CudaDevice::allocate(int64_t bytes) {
  DeviceGuard on(rank_.device());
  void* p = nullptr;
  DTLAB_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(bytes), rank_.compute()));
  DTLAB_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), rank_.compute()));
  return p;
}

void CudaDevice::release(void* p) {
  DeviceGuard on(rank_.device());
  cudaFreeAsync(p, rank_.compute());  // after the work already enqueued that may still read it
}

void CudaDevice::fill_zero(void* p, int64_t bytes) {
  if (bytes > 0) DTLAB_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), rank_.compute()));
}

void CudaDevice::copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src)
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, rank_.compute()));
}

void CudaDevice::upload(void* dst, const void* host_src, int64_t bytes) {
  // A micro-batch's bytes go through the rank's pinned slots: the host returns at once. Larger ones
  // go from pageable memory, where the runtime stages the bytes before it returns, so `host_src` may
  // change at once either way (CUDA's API synchronization rules); the copy stays in stream order.
  // (On this rank's GPU: a staging slot's event is created on the current device.)
  DeviceGuard on(rank_.device());
  if (bytes > 0 && !staging_->upload(dst, host_src, bytes))
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, rank_.compute()));
}

void CudaDevice::download(void* host_dst, const void* src, int64_t bytes) {
  if (bytes > 0)
    DTLAB_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, rank_.compute()));
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(rank_.compute()));
}

void CudaDevice::synchronize() { rank_.sync_compute(); }

void CudaDevice::widen_half(float* dst, const uint16_t* src, int64_t n, HalfFormat f) {
  launch_widen_half(rank_.compute(), dst, src, n, f);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::narrow_half(uint16_t* dst, const float* src, int64_t n, HalfFormat f) {
  launch_narrow_half(rank_.compute(), dst, src, n, f);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::round_half(float* x, int64_t n, HalfFormat f) {
  launch_round_half(rank_.compute(), x, n, f);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::accumulate_half(uint16_t* acc, const uint16_t* x, int64_t n, bool max, HalfFormat f) {
  launch_reduce_half(rank_.compute(), acc, acc, x, n, max, f);
  DTLAB_CUDA_CHECK_LAUNCH();
}

bool CudaDevice::half_all_finite(const uint16_t* x, int64_t n, HalfFormat f) {
  if (n <= 0) return true;
  if (flag_.empty()) flag_ = Tensor({1}, MemCategory::Other, nullptr, DType::I64, *this);
  fill_zero(flag_.raw(), sizeof(int64_t));
  launch_half_nonfinite(rank_.compute(), flag_.i64(), x, n, f);
  DTLAB_CUDA_CHECK_LAUNCH();
  int64_t bad = 0;
  download(&bad, flag_.raw(), sizeof bad);
  return bad == 0;
}

bool CudaDevice::all_finite(const float* x, int64_t n) {
  if (n <= 0) return true;
  if (flag_.empty()) flag_ = Tensor({1}, MemCategory::Other, nullptr, DType::I64, *this);
  fill_zero(flag_.raw(), sizeof(int64_t));
  launch_nonfinite(rank_.compute(), flag_.i64(), x, n);
  DTLAB_CUDA_CHECK_LAUNCH();
  int64_t bad = 0;
  download(&bad, flag_.raw(), sizeof bad);
  return bad == 0;
}

void CudaDevice::scale(float* x, int64_t n, float s) {
  launch_scale(rank_.compute(), x, s, n);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::scale_copy(float* dst, const float* src, int64_t n, float s) {
  launch_scale_copy(rank_.compute(), dst, src, s, n);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::accumulate(float* acc, const float* x, int64_t n, bool max) {
  if (n > 0) launch_reduce_f32(rank_.compute(), acc, acc, x, n, max);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B,
                                int64_t C, int64_t OC) {
  cuda::linear_forward(rank_, out, inp, weight, bias, B, C, OC);
}

void CudaDevice::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                 const float* weight, int64_t B, int64_t C, int64_t OC) {
  cuda::linear_backward(rank_, dinp, dweight, dbias, dout, inp, weight, B, C, OC);
}

void CudaDevice::relu_forward(float* out, const float* inp, int64_t N) { cuda::relu_forward(rank_, out, inp, N); }

void CudaDevice::relu_backward(float* dinp, const float* dout, const float* out, int64_t N) {
  cuda::relu_backward(rank_, dinp, dout, out, N);
}

void CudaDevice::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                                   int64_t N, int64_t C) {
  launch_layernorm_forward(rank_.compute(), out, mean, rstd, inp, w, b, N, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                                    const float* mean, const float* rstd, int64_t N, int64_t C) {
  launch_layernorm_backward(rank_.compute(), dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::gelu_forward(float* out, const float* inp, int64_t N) {
  launch_gelu_forward(rank_.compute(), out, inp, N);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::gelu_backward(float* d, const float* dout, const float* inp, int64_t N) {
  launch_gelu_backward(rank_.compute(), d, dout, inp, N);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                                   const HalfFormat* round16) {
  cuda::attention_forward(rank_, out, att, qkv, B, T, C, NH, round16);
}

void CudaDevice::attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B,
                                    int64_t T, int64_t C, int64_t NH, const HalfFormat* round16) {
  (void)datt;  // one head's T x T: every head of a sample runs at once here
  if (attention_scratch_.numel() < NH * T * T)
    attention_scratch_ = Tensor({NH, T, T}, MemCategory::Other, nullptr, DType::F32, *this);
  cuda::attention_backward(rank_, dqkv, attention_scratch_.f32(), dout, qkv, att, B, T, C, NH, round16);
}

void CudaDevice::embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl,
                                   int64_t T, int64_t t0, int64_t C) {
  launch_embedding_forward(rank_.compute(), x, wte, wpe, idx, R, Tl, T, t0, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl,
                                    int64_t T, int64_t t0, int64_t C) {
  launch_embedding_backward(rank_.compute(), dwte, dwpe, dx, idx, R, Tl, T, t0, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::add(float* out, const float* a, const float* b, int64_t n) {
  if (n > 0) launch_add(rank_.compute(), out, a, b, n);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::add_rows(float* y, const float* bias, int64_t R, int64_t C) {
  if (R * C > 0) launch_add_rows(rank_.compute(), y, bias, R, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::sum_rows(float* acc, const float* x, int64_t R, int64_t C) {
  if (C > 0) launch_bias_backward(rank_.compute(), acc, x, R, C);  // the same column sums, rows in order
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::cross_entropy_forward(float* probs, double* stats, const float* logits, const int64_t* targets,
                                       int64_t B, int64_t C) {
  if (loss_scratch_.numel() < B + 1) loss_scratch_ = Tensor({B + 1}, MemCategory::Other, nullptr, DType::F32, *this);
  float* losses = loss_scratch_.f32();
  float* mean = losses + B;
  cuda::cross_entropy_forward(rank_, probs, losses, mean, logits, targets, B, C);
  launch_loss_stats(rank_.compute(), stats, losses, mean, logits, targets, B, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets, int64_t B,
                                        int64_t C, float scale) {
  cuda::cross_entropy_backward(rank_, dlogits, probs, targets, B, C, scale);
}

void CudaDevice::sgd_step(float* params, const float* grads, float* buf, int64_t n, SgdCoeffs k, bool first) {
  launch_sgd_step(rank_.compute(), params, grads, buf, n, k, first);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void CudaDevice::adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, AdamWCoeffs k) {
  launch_adamw_step(rank_.compute(), params, grads, m, v, n, k);
  DTLAB_CUDA_CHECK_LAUNCH();
}

std::unique_ptr<DeviceTimer> CudaDevice::make_timer(RankContext* ctx) {
  return std::make_unique<DeviceComputeTimer>(ctx, rank_.compute());
}

bool CudaDevice::memory_info(int64_t& used, int64_t& total) const {
  const DeviceMemory m = device_memory(rank_.device());
  used = m.total_bytes - m.free_bytes;
  total = m.total_bytes;
  return true;
}

}  // namespace dtlab::cuda
