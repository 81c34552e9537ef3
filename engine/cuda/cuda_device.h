// The CUDA implementation of the device interface (engine/core/device.h): one rank's place on a GPU.
// Memory comes from the device's stream-ordered pool on the rank's compute stream (an allocation is
// usable by later work on that stream, and a free waits for the work enqueued before it without
// stopping the host); layers are cuBLAS GEMMs in plain FP32 (no TF32, torch's default) and the kernels
// of engine/cuda/*.cu; everything is enqueued on the compute stream and returns at once. The rank's
// comm stream belongs to its communicator, which orders itself after the compute stream with an event
// per call (engine/cuda/issue_events.h): that is what lets DDP's all-reduces overlap the backward.
#pragma once
#include <memory>

#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/cuda/pinned_staging.h"
#include "engine/cuda/rank_device.h"

namespace dtlab::cuda {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const RankDevice& rank);                 // uses `rank` (which must outlive it)
  explicit CudaDevice(std::unique_ptr<RankDevice> owned);      // owns it
  ~CudaDevice() override;

  const RankDevice& rank_device() const { return rank_; }

  DeviceKind kind() const override { return DeviceKind::CUDA; }
  std::string name() const override;
  void* allocate(int64_t bytes) override;
  void release(void* p) override;
  void fill_zero(void* p, int64_t bytes) override;
  void copy(void* dst, const void* src, int64_t bytes) override;
  void upload(void* dst, const void* host_src, int64_t bytes) override;
  void download(void* host_dst, const void* src, int64_t bytes) override;
  void synchronize() override;
  void bind_thread() override { rank_.bind(); }

  void widen_half(float* dst, const uint16_t* src, int64_t n, HalfFormat f) override;
  void narrow_half(uint16_t* dst, const float* src, int64_t n, HalfFormat f) override;
  void round_half(float* x, int64_t n, HalfFormat f) override;
  void accumulate_half(uint16_t* acc, const uint16_t* x, int64_t n, bool max, HalfFormat f) override;
  bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat f) override;
  bool all_finite(const float* x, int64_t n) override;

  void scale(float* x, int64_t n, float s) override;
  void scale_copy(float* dst, const float* src, int64_t n, float s) override;
  void accumulate(float* acc, const float* x, int64_t n, bool max) override;

  void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B, int64_t C,
                      int64_t OC) override;
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t B, int64_t C, int64_t OC) override;
  void relu_forward(float* out, const float* inp, int64_t N) override;
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t N) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) override;
  void gelu_forward(float* out, const float* inp, int64_t N) override;
  void gelu_backward(float* d, const float* dout, const float* inp, int64_t N) override;
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                         const HalfFormat* round16) override;
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH, const HalfFormat* round16) override;
  void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                         int64_t t0, int64_t C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                          int64_t t0, int64_t C) override;
  void add(float* out, const float* a, const float* b, int64_t n) override;
  void add_rows(float* y, const float* bias, int64_t R, int64_t C) override;
  void sum_rows(float* acc, const float* x, int64_t R, int64_t C) override;
  void cross_entropy_forward(float* probs, double* stats, const float* logits, const int64_t* targets, int64_t B,
                             int64_t C) override;
  void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets, int64_t B, int64_t C,
                              float scale) override;

  void sgd_step(float* params, const float* grads, float* buf, int64_t n, SgdCoeffs k, bool first) override;
  void adamw_step(float* params, const float* grads, float* m, float* v, int64_t n, AdamWCoeffs k) override;

  std::unique_ptr<DeviceTimer> make_timer(RankContext* ctx) override;
  bool memory_info(int64_t& used, int64_t& total) const override;

 private:
  std::unique_ptr<RankDevice> owned_;
  const RankDevice& rank_;
  Tensor loss_scratch_;  // (B + 1,) per-row losses, then hits; the last element the mean loss
  Tensor attention_scratch_;
  std::unique_ptr<PinnedStaging> staging_;  // uploads go through pinned slots (pinned_staging.h)
  Tensor flag_;  // one int: half_all_finite's answer  // (NH, T, T): the attention backward's score gradients, every head of a sample at once
};

}  // namespace dtlab::cuda
