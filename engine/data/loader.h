// DataLoader: cuts one rank's sampler order into batches and gathers their rows, like a torch
// DataLoader(dataset, batch_size, sampler=DistributedSampler(...), drop_last=...).
// Buffers in Batch are reused from call to call, so steady-state training allocates nothing here.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/sampler.h"

namespace dtlab {

struct Batch {
  int64_t size = 0;
  std::vector<float> x;          // (size, d)
  std::vector<int64_t> y;        // (size,); token data: (size, T) targets
  std::vector<int64_t> tok;      // token data: (size, T) input tokens (x stays empty)
  std::vector<int64_t> indices;  // (size,) dataset rows, in sampler order
};

class DataLoader {
 public:
  // Both references must outlive the loader. Starts at the sampler's current epoch.
  DataLoader(const Dataset& data, DistributedSampler& sampler, int64_t batch, bool drop_last);

  // Batches per epoch: the last partial batch counts unless drop_last.
  int64_t num_batches() const;
  int64_t batch_size() const { return batch_; }
  // Fills `out` with the next batch of the epoch; false when the epoch is exhausted.
  bool next(Batch& out);
  // sampler.set_epoch(e) and rewind: the step that makes each epoch's shuffle different.
  void start_epoch(int64_t e);

 private:
  const Dataset& data_;
  DistributedSampler& sampler_;
  int64_t batch_ = 1;
  bool drop_last_ = false;
  std::vector<int64_t> order_;  // (num_samples,) this rank's indices for the epoch
  size_t pos_ = 0;
};

}  // namespace dtlab
