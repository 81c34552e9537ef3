// The newest records of an append-only log, numbered as in the whole log: a long run's per-step
// records stay bounded (the lab at world 8 ran 7 minutes from 376 MB to 836 MB keeping every step's
// report), while a reader still asks for "everything after record n" and learns what it missed.
#pragma once
#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace dtlab {

template <class T>
class BoundedLog {
 public:
  explicit BoundedLog(size_t keep) : keep_(std::max<size_t>(keep, 1)) {}

  // Amortized O(1): at twice the bound the older half goes at once.
  void push_back(T v) {
    items_.push_back(std::move(v));
    if (items_.size() >= 2 * keep_) {
      const size_t cut = items_.size() - keep_;
      items_.erase(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(cut));
      base_ += cut;
    }
  }
  size_t total() const { return base_ + items_.size(); }  // records ever appended
  size_t first_kept() const { return base_; }             // the number of the oldest kept record
  const std::vector<T>& kept() const { return items_; }
  // The kept records numbered `first` and after (those before first_kept() are gone).
  std::vector<T> since(size_t first) const {
    const size_t from = std::min(std::max(first, base_) - base_, items_.size());
    return std::vector<T>(items_.begin() + static_cast<std::ptrdiff_t>(from), items_.end());
  }
  void clear() { items_.clear(), base_ = 0; }

 private:
  size_t keep_;
  size_t base_ = 0;
  std::vector<T> items_;
};

// Step reports a monitor keeps for viewers that attach late (the newest this many steps).
constexpr size_t kMonitorKeptReports = 10000;

}  // namespace dtlab
