// DistributedSampler: which sample indices each data-parallel rank sees in an epoch, with exactly
// PyTorch's semantics (torch/utils/data/distributed.py; docs/course_sources.md §1), including its shuffle,
// so an order shown in dtlab is the order torch would produce. DataLoader (loader.h) batches it.
#pragma once
#include <cstdint>
#include <vector>

namespace dtlab {

// torch.randperm reproduces this 32-bit Fisher-Yates only for n below this bound; above it torch
// switches to a 64-bit draw, which dtlab does not reproduce, so torch_randperm refuses such n.
inline constexpr int64_t kTorchRandpermMaxN = int64_t{0xFFFFFFFF} / 20;  // 214748363 is the largest n

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU, bit for bit
// (torch, like std::mt19937, keeps only the low 32 bits of the seed). Error if n >= kTorchRandpermMaxN.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

struct SamplerConfig {
  int64_t n = 0;  // dataset length; 0 is allowed (every rank gets nothing)
  int world_size = 1;
  int rank = 0;
  bool shuffle = true;
  uint64_t seed = 0;  // the epoch's permutation uses seed + epoch, as in torch
  bool drop_last = false;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerConfig config);  // Error on a bad config

  // Without set_epoch every epoch repeats the same order (the classic DDP pitfall).
  void set_epoch(int64_t e) { epoch_ = e; }
  int64_t epoch() const { return epoch_; }

  // drop_last: floor(n / W) per rank (the tail is cut); otherwise ceil(n / W) (the head is repeated).
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * config_.world_size; }

  std::vector<int64_t> indices() const;       // (num_samples,) this rank's, for the current epoch
  std::vector<int64_t> global_order() const;  // (total_size,) padded/truncated, before striding
  const SamplerConfig& config() const { return config_; }

 private:
  SamplerConfig config_;
  int64_t epoch_ = 0;
  int64_t num_samples_ = 0;
};

}  // namespace dtlab
