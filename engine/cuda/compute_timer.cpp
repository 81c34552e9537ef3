#include "engine/cuda/compute_timer.h"

#include <nvtx3/nvToolsExt.h>

#include "engine/cuda/runtime.h"

namespace dtlab::cuda {

NvtxRange::NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
NvtxRange::~NvtxRange() { nvtxRangePop(); }

std::string compute_op_name(ComputeKind kind, int layer) {
  return std::string(compute_kind_name(kind)) + (layer >= 0 ? " " + std::to_string(layer) : "");
}

DeviceComputeTimer::DeviceComputeTimer(RankContext* ctx, cudaStream_t stream) : ctx_(ctx), stream_(stream) {
  DTLAB_CUDA_CHECK(cudaEventCreate(&anchor_));
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  anchor();
}

void DeviceComputeTimer::anchor() {
  const TraceRecorder* rec = ctx_ ? ctx_->recorder() : nullptr;
  const int64_t before = rec ? rec->now_ns() : 0;
  DTLAB_CUDA_CHECK(cudaEventRecord(anchor_, stream_));
  DTLAB_CUDA_CHECK(cudaEventSynchronize(anchor_));
  // The idle stream ran the anchor between the two readings: take the middle.
  anchor_ns_ = rec ? (before + rec->now_ns()) / 2 : 0;
}

DeviceComputeTimer::~DeviceComputeTimer() {
  for (Op& op : pending_) spare_.insert(spare_.end(), {op.begin, op.end});
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
  if (anchor_) cudaEventDestroy(anchor_);
}

cudaEvent_t DeviceComputeTimer::take_event() {
  if (spare_.empty()) {
    cudaEvent_t e;
    DTLAB_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  cudaEvent_t e = spare_.back();
  spare_.pop_back();
  return e;
}

void DeviceComputeTimer::compute_begin(ComputeKind kind, int layer, OpCost cost) {
  DTLAB_CHECK(!open_, "compute ops do not nest; close the open one with compute_end first");
  const std::string name = compute_op_name(kind, layer);
  nvtxRangePushA(name.c_str());
  const double model = ctx_ ? ctx_->compute_clock() : 0.0;
  pending_.push_back({ComputeInfo{kind, static_cast<int16_t>(layer), cost.flops, cost.bytes}, take_event(), take_event(),
                      model, model, ctx_ ? ctx_->iteration() : -1});
  DTLAB_CUDA_CHECK(cudaEventRecord(pending_.back().begin, stream_));
  if (ctx_) ctx_->set_activity(name);
  open_ = true;
}

void DeviceComputeTimer::compute_end() {
  DTLAB_CHECK(open_, "compute_end without compute_begin");
  Op& op = pending_.back();
  DTLAB_CUDA_CHECK(cudaEventRecord(op.end, stream_));
  nvtxRangePop();
  open_ = false;
  if (!ctx_) return;
  const double dur = ctx_->cost() ? ctx_->cost()->compute_time(op.info.flops) : 0.0;
  ctx_->advance_compute_clock(op.model_begin + dur);
  op.model_end = ctx_->compute_clock();
}

int DeviceComputeTimer::flush() {
  const size_t closed = open_ ? pending_.size() - 1 : pending_.size();
  if (closed == 0) return 0;
  DTLAB_CUDA_CHECK(cudaEventSynchronize(pending_[closed - 1].end));
  for (size_t i = 0; i < closed; i++) {
    Op& op = pending_[i];
    float t0 = 0, t1 = 0;  // ms since the anchor
    DTLAB_CUDA_CHECK(cudaEventElapsedTime(&t0, anchor_, op.begin));
    DTLAB_CUDA_CHECK(cudaEventElapsedTime(&t1, anchor_, op.end));
    if (ctx_) {
      Event e(EventKind::Compute, Lane::Compute, anchor_ns_ + static_cast<int64_t>(t0 * 1e6),
              anchor_ns_ + static_cast<int64_t>(t1 * 1e6), op.model_begin, op.model_end);
      e.compute = op.info;
      e.iteration = op.iteration;
      ctx_->record(e);
    }
    spare_.insert(spare_.end(), {op.begin, op.end});
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(closed));
  // Elapsed times are float milliseconds: re-anchor whenever the stream is idle, so they stay short.
  if (pending_.empty() && cudaStreamQuery(stream_) == cudaSuccess) anchor();
  return static_cast<int>(closed);
}

}  // namespace dtlab::cuda
