// A rank's pinned staging for host-to-device uploads. cudaMemcpyAsync from pageable memory makes the
// host wait while the runtime stages the bytes (CUDA's API synchronization rules), so every
// micro-batch's tokens and targets held the rank's thread until the bus had taken them. Here the
// host copies them into a page-locked slot (a memcpy at memory speed) and the DMA runs from it on the
// rank's stream, in stream order: upload() returns at once and the caller may reuse its buffer.
// Slots are reused round-robin; one still being read by its copy is waited for first (an event),
// which in a training loop has long finished.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace dtlab::cuda {

class PinnedStaging {
 public:
  // Uploads up to this size are staged; larger ones (initial weights, checkpoints) go from pageable
  // memory as before, so the pinned slots stay small.
  static constexpr int64_t kMaxStagedBytes = int64_t{64} << 20;

  explicit PinnedStaging(cudaStream_t stream) : stream_(stream) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // Enqueues dst = host_src (bytes) on the stream. True when it was staged; false when the caller
  // must upload it another way (larger than kMaxStagedBytes, or pinned memory was refused).
  bool upload(void* dst, const void* host_src, int64_t bytes);

 private:
  struct Slot {
    void* host = nullptr;  // page-locked (cudaMallocHost)
    int64_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the slot's last upload
    bool pending = false;
  };
  static constexpr int kSlots = 4;  // a micro-batch's inputs and targets, and the next one's
  cudaStream_t stream_;
  std::mutex mu_;  // a rank's thread and its process groups' executor may both upload
  Slot slots_[kSlots];
  int next_ = 0;
};

}  // namespace dtlab::cuda
