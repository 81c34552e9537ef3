#include "engine/core/memory.h"

#include "engine/core/check.h"

namespace dtlab {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::OptimizerState: return "optimizer state";
    case MemCategory::Activations: return "activations";
    case MemCategory::CommBuffers: return "communication buffers";
    case MemCategory::Other: return "other";
    case MemCategory::GatheredParameters: return "gathered parameters";
    case MemCategory::MasterWeights: return "master weights";
  }
  return "?";
}

void MemoryTracker::update(MemCategory c, int64_t delta) {
  Listener l;
  MemoryStats snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int i = static_cast<int>(c);
    DTLAB_CHECK(stats_.current[i] + delta >= 0, "memory tracker freed more bytes than were allocated");
    stats_.current[i] += delta;
    stats_.total_current += delta;
    if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
    if (stats_.total_current > stats_.total_peak) stats_.total_peak = stats_.total_current;
    if (delta > 0) stats_.allocations++;
    else stats_.frees++;
    if (!listener_) return;
    l = listener_;
    snapshot = stats_;
  }
  l(c, delta, snapshot);  // outside the lock: a listener may read stats() itself
}

void MemoryTracker::on_alloc(MemCategory c, int64_t bytes) {
  if (bytes > 0) update(c, bytes);
}

void MemoryTracker::on_free(MemCategory c, int64_t bytes) {
  if (bytes > 0) update(c, -bytes);
}

MemoryStats MemoryTracker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak = stats_.current;
  stats_.total_peak = stats_.total_current;
}

void MemoryTracker::set_listener(Listener l) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(l);
}

}  // namespace dtlab
