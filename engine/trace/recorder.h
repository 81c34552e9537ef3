// The trace recorder: per-rank bounded event buffers. Recording is a lock of the rank's own buffer
// and a copy of one Event (no allocation), so it can stay on in every run. A long run keeps the most
// recent `capacity` events per rank plus one aggregate per iteration, so memory stays flat.
#pragma once
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/trace/event.h"

namespace dtlab {

struct IterationAggregate {
  int32_t iteration = 0;
  int64_t events = 0;
  double compute_wall_s = 0, comm_wall_s = 0;    // summed durations of Compute / Collective events
  double compute_model_s = 0, comm_model_s = 0;
  int64_t comm_bytes = 0;                        // bytes received in algorithm steps
  int64_t collectives = 0;
  int64_t peak_memory = 0;                       // highest total seen in memory events
};

class TraceRecorder {
 public:
  explicit TraceRecorder(int world_size, size_t capacity_per_rank = size_t{1} << 16);

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  int world_size() const { return static_cast<int>(ranks_.size()); }
  int64_t now_ns() const;  // wall clock since construction
  // The steady clock's reading (ns since its epoch) at which wall_ns 0 falls. Processes on one
  // machine share the steady clock, so a viewer shifts another process's events by the difference
  // of the two starts; set_start_ns() makes a mirror recorder's now_ns() the remote one's.
  int64_t start_ns() const { return start_ns_.load(std::memory_order_relaxed); }
  void set_start_ns(int64_t ns) { start_ns_.store(ns, std::memory_order_relaxed); }

  // Stamps e.order and appends it to e.rank's buffer (dropping the oldest when full).
  void record(Event& e);

  std::vector<Event> events(int rank) const;  // the kept window, oldest first
  std::vector<Event> all_events() const;      // every rank's window, merged by `order`
  // Appends this rank's kept events with order >= min_order, oldest first; returns how many. A
  // viewer polling each frame passes one more than the last order it saw, so it copies only news.
  size_t events_since(int rank, uint64_t min_order, std::vector<Event>& out) const;
  uint64_t dropped(int rank) const;           // events that fell out of the window
  std::vector<IterationAggregate> aggregates(int rank) const;
  void clear();  // events and aggregates; labels stay valid

  // Strings events refer to by id (parameter and bucket names): events stay fixed-size. Interning
  // the same text twice gives the same id. Thread-safe; meant for setup-time text, not per event.
  int32_t intern(std::string_view text);
  std::string label(int32_t id) const;   // "" for an unknown id
  std::vector<std::string> labels() const;
  size_t label_count() const;  // labels only grow: a viewer re-copies when this changes

 private:
  struct RankBuffer {
    mutable std::mutex mu;
    std::vector<Event> ring;  // capacity slots reserved; grows to them, then wraps
    size_t head = 0, size = 0;
    uint64_t dropped = 0;
    std::deque<IterationAggregate> iters;
  };
  void aggregate(RankBuffer& b, const Event& e);
  size_t capacity_;
  std::vector<std::unique_ptr<RankBuffer>> ranks_;
  std::atomic<uint64_t> next_order_{0};
  std::atomic<bool> enabled_{true};
  mutable std::mutex labels_mu_;
  std::vector<std::string> labels_;
  std::atomic<int64_t> start_ns_;
};

}  // namespace dtlab
