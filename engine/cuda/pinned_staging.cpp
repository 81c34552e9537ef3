#include "engine/cuda/pinned_staging.h"

#include <cstring>

#include "engine/cuda/runtime.h"

namespace dtlab::cuda {

PinnedStaging::~PinnedStaging() {
  for (Slot& s : slots_) {
    if (s.pending) cudaEventSynchronize(s.done);
    if (s.done) cudaEventDestroy(s.done);
    if (s.host) cudaFreeHost(s.host);
  }
}

bool PinnedStaging::upload(void* dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0 || bytes > kMaxStagedBytes) return false;
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_[next_];
  if (s.pending) {  // its copy of kSlots uploads ago must have read the slot before we overwrite it
    DTLAB_CUDA_CHECK(cudaEventSynchronize(s.done));
    s.pending = false;
  }
  if (s.capacity < bytes) {
    if (s.host) DTLAB_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr, s.capacity = 0;
    int64_t cap = 4096;
    while (cap < bytes) cap *= 2;
    if (cudaMallocHost(&s.host, static_cast<size_t>(cap)) != cudaSuccess) {
      cudaGetLastError();  // page-locked memory refused (a locked-memory limit): pageable it is
      s.host = nullptr;
      return false;
    }
    s.capacity = cap;
  }
  if (!s.done) DTLAB_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  std::memcpy(s.host, host_src, static_cast<size_t>(bytes));
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, s.host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  DTLAB_CUDA_CHECK(cudaEventRecord(s.done, stream_));
  s.pending = true;
  next_ = (next_ + 1) % kSlots;
  return true;
}

}  // namespace dtlab::cuda
