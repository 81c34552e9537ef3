// Per-rank memory tracker. Every tensor buffer a rank allocates is registered here under a category,
// so the app and the CLI can show what a rank holds (parameters, gradients, optimizer state, ...)
// and its peak, and tests can check those figures against the arithmetic.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>

namespace dtlab {

enum class MemCategory : uint8_t {
  Parameters,
  Gradients,
  OptimizerState,
  Activations,
  CommBuffers,
  Other,
  GatheredParameters,  // FSDP: a unit's unsharded parameters while they are gathered
  MasterWeights,       // mixed precision: the fp32 copy of 16-bit parameters the optimizer updates
  // new values go at the end
};
inline constexpr int kNumMemCategories = 8;

std::string_view mem_category_name(MemCategory c);  // "parameters", "gradients", ...

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};  // bytes live now, per category
  std::array<int64_t, kNumMemCategories> peak{};     // highest `current` per category since reset
  int64_t total_current = 0;
  int64_t total_peak = 0;  // highest sum over categories at one instant (not the sum of peaks)
  int64_t allocations = 0;
  int64_t frees = 0;

  int64_t current_of(MemCategory c) const { return current[static_cast<int>(c)]; }
  int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
};

// Thread-safe: a rank's compute thread and its communication worker both allocate.
class MemoryTracker {
 public:
  // Called after every allocation (bytes > 0) and free (bytes < 0); the trace recorder hooks in here.
  using Listener = std::function<void(MemCategory, int64_t delta_bytes, const MemoryStats&)>;

  explicit MemoryTracker(int rank = 0) : rank_(rank) {}
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  void on_alloc(MemCategory c, int64_t bytes);
  void on_free(MemCategory c, int64_t bytes);
  MemoryStats stats() const;
  // Start a new peak window (e.g. per iteration): peaks become the current values.
  void reset_peaks();
  void set_listener(Listener l);
  int rank() const { return rank_; }

 private:
  void update(MemCategory c, int64_t delta);
  int rank_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  Listener listener_;
};

}  // namespace dtlab
