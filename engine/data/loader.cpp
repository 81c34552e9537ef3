#include "engine/data/loader.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/core/check.h"

namespace dtlab {

DataLoader::DataLoader(const Dataset& data, DistributedSampler& sampler, int64_t batch, bool drop_last)
    : data_(data), sampler_(sampler), batch_(batch), drop_last_(drop_last) {
  if (batch < 1) throw Error("batch size must be at least 1, got " + std::to_string(batch) + ".");
  DTLAB_CHECK(sampler.config().n == data.n,
              "sampler built for " + std::to_string(sampler.config().n) + " samples but the dataset has " +
                  std::to_string(data.n) + "; build the sampler with n = dataset.n");
  order_ = sampler_.indices();
}

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_.num_samples();
  return drop_last_ ? n / batch_ : (n + batch_ - 1) / batch_;
}

void DataLoader::start_epoch(int64_t e) {
  sampler_.set_epoch(e);
  order_ = sampler_.indices();
  pos_ = 0;
}

bool DataLoader::next(Batch& out) {
  const size_t left = order_.size() - pos_;
  const size_t b = static_cast<size_t>(batch_);
  if (left == 0 || (drop_last_ && left < b)) return false;
  const size_t size = std::min(b, left);
  const size_t d = static_cast<size_t>(data_.d);
  out.size = static_cast<int64_t>(size);
  if (data_.is_tokens()) {  // sample i: tokens [i*T, i*T+T) and the next ones as targets
    out.indices.assign(order_.begin() + static_cast<std::ptrdiff_t>(pos_),
                       order_.begin() + static_cast<std::ptrdiff_t>(pos_ + size));
    out.tok.resize(size * d);
    out.y.resize(size * d);
    for (size_t i = 0; i < size; ++i) {
      const int32_t* src = data_.tokens.data() + static_cast<size_t>(out.indices[i]) * d;
      for (size_t t = 0; t < d; t++) {
        out.tok[i * d + t] = src[t];
        out.y[i * d + t] = src[t + 1];
      }
    }
    pos_ += size;
    return true;
  }
  out.x.resize(size * d);  // resize keeps capacity: no allocation after the first full batch
  out.y.resize(size);
  out.indices.assign(order_.begin() + static_cast<std::ptrdiff_t>(pos_),
                     order_.begin() + static_cast<std::ptrdiff_t>(pos_ + size));
  for (size_t i = 0; i < size; ++i) {
    const size_t row = static_cast<size_t>(out.indices[i]);
    std::memcpy(out.x.data() + i * d, data_.x.data() + row * d, d * sizeof(float));
    out.y[i] = data_.y[row];
  }
  pos_ += size;
  return true;
}

}  // namespace dtlab
