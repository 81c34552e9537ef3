#include "engine/data/sampler.h"

#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  if (n < 0) throw Error("randperm needs n >= 0, got " + std::to_string(n) + ".");
  if (n >= kTorchRandpermMaxN)
    throw Error("randperm of " + std::to_string(n) + " elements is beyond the range where dtlab " +
                "reproduces torch.randperm (n < " + std::to_string(kTorchRandpermMaxN) +
                "); use a smaller dataset or shuffle=false.");
  std::vector<int64_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), int64_t{0});
  std::mt19937 g(static_cast<std::mt19937::result_type>(seed & 0xFFFFFFFFu));
  for (int64_t i = 0; i + 1 < n; ++i) {
    int64_t z = static_cast<int64_t>(static_cast<uint32_t>(g()) % static_cast<uint64_t>(n - i));
    std::swap(r[static_cast<size_t>(i)], r[static_cast<size_t>(i + z)]);
  }
  return r;
}

DistributedSampler::DistributedSampler(SamplerConfig config) : config_(config) {
  const SamplerConfig& c = config_;
  if (c.n < 0) throw Error("the dataset length must be >= 0, got " + std::to_string(c.n) + ".");
  if (c.world_size < 1)
    throw Error("world size must be at least 1, got " + std::to_string(c.world_size) + ".");
  if (c.rank < 0 || c.rank >= c.world_size)
    throw Error("rank " + std::to_string(c.rank) + " is out of range for world size " +
                std::to_string(c.world_size) + "; ranks are 0.." + std::to_string(c.world_size - 1) +
                ".");
  // torch: ceil((n - W) / W) when drop_last and n % W != 0, else ceil(n / W); both reduce to these.
  const int64_t w = c.world_size;
  num_samples_ = c.drop_last ? c.n / w : (c.n + w - 1) / w;
}

std::vector<int64_t> DistributedSampler::global_order() const {
  const SamplerConfig& c = config_;
  std::vector<int64_t> order;
  if (c.shuffle) {
    order = torch_randperm(c.n, c.seed + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(c.n));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const size_t total = static_cast<size_t>(total_size());
  if (total <= order.size()) {
    order.resize(total);  // drop_last: cut the tail
  } else {
    // Pad by wrapping around, repeatedly if the padding is longer than the dataset (n < W).
    const size_t n = order.size();
    order.reserve(total);
    for (size_t i = n; i < total; ++i) order.push_back(order[i % n]);
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order = global_order();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(config_.rank); i < order.size();
       i += static_cast<size_t>(config_.world_size))
    mine.push_back(order[i]);
  return mine;
}

}  // namespace dtlab
