// TraceRecorder: one fixed ring of Events per rank plus a short deque of per-iteration aggregates.
// The ring is reserved up front so recording never allocates; only a new iteration's aggregate
// may (once per iteration, amortized by the deque). Reserved, not resized: filling 64 Ki events per
// rank with zeros touched every page of them (8 MiB a rank) for every world a test or a lab restart
// made, most never written; the comm suite spent half its CPU there and in the page faults.
#include "engine/trace/recorder.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>

#include "engine/core/check.h"

namespace dtlab {
namespace {

// Enough for any run a view scrolls through; bounds memory on runs of millions of iterations.
constexpr size_t kMaxAggregatesPerRank = 4096;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TraceRecorder::TraceRecorder(int world_size, size_t capacity_per_rank)
    : capacity_(capacity_per_rank), start_ns_(steady_ns()) {
  DTLAB_CHECK(world_size >= 1, "TraceRecorder needs world_size >= 1");
  ranks_.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    auto b = std::make_unique<RankBuffer>();
    b->ring.reserve(capacity_);
    ranks_.push_back(std::move(b));
  }
}

int64_t TraceRecorder::now_ns() const { return steady_ns() - start_ns_.load(std::memory_order_relaxed); }

void TraceRecorder::record(Event& e) {
  if (!enabled()) return;
  DTLAB_CHECK(e.rank >= 0 && e.rank < world_size(),
              "event rank " + std::to_string(e.rank) + " is outside the recorder's world of " +
                  std::to_string(world_size()));
  RankBuffer& b = *ranks_[static_cast<size_t>(e.rank)];
  std::lock_guard<std::mutex> lock(b.mu);
  // Taken under the rank's lock: two threads of one rank (compute and comm worker) cannot
  // interleave between stamping and appending, so the window stays sorted by `order`.
  e.order = next_order_.fetch_add(1, std::memory_order_relaxed);
  aggregate(b, e);
  if (capacity_ == 0) {  // aggregates only
    ++b.dropped;
    return;
  }
  // `head` is the next slot to write; once full it is also the oldest event, overwritten here.
  // The ring grows to its reserved capacity (no allocation), then wraps; after clear() it is
  // overwritten from the start.
  if (b.head < b.ring.size()) b.ring[b.head] = e;
  else b.ring.push_back(e);
  b.head = (b.head + 1) % capacity_;
  if (b.size < capacity_)
    ++b.size;
  else
    ++b.dropped;
}

void TraceRecorder::aggregate(RankBuffer& b, const Event& e) {
  if (e.iteration < 0) return;
  // Events arrive in (nearly) increasing iteration order, so the match is almost always the back.
  auto it = b.iters.end();
  while (it != b.iters.begin() && std::prev(it)->iteration > e.iteration) --it;
  IterationAggregate* a;
  if (it != b.iters.begin() && std::prev(it)->iteration == e.iteration) {
    a = &*std::prev(it);
  } else {
    if (b.iters.size() >= kMaxAggregatesPerRank && it == b.iters.begin()) return;  // older than all kept
    it = b.iters.insert(it, IterationAggregate{});
    it->iteration = e.iteration;
    a = &*it;
    // The new aggregate is never the front here (checked above), so `a` survives the pop.
    if (b.iters.size() > kMaxAggregatesPerRank) b.iters.pop_front();
  }
  a->events++;
  switch (e.kind) {
    case EventKind::Compute:
      a->compute_wall_s += static_cast<double>(e.wall_end_ns - e.wall_begin_ns) / 1e9;
      a->compute_model_s += e.model_end - e.model_begin;
      break;
    case EventKind::Collective:
      a->comm_wall_s += static_cast<double>(e.wall_end_ns - e.wall_begin_ns) / 1e9;
      a->comm_model_s += e.model_end - e.model_begin;
      a->collectives++;
      break;
    case EventKind::RingStep: a->comm_bytes += e.step.bytes; break;
    case EventKind::MemAlloc:
    case EventKind::MemFree: a->peak_memory = std::max(a->peak_memory, e.mem.total); break;
    default: break;
  }
}

std::vector<Event> TraceRecorder::events(int rank) const {
  DTLAB_CHECK(rank >= 0 && rank < world_size(), "rank outside the recorder's world");
  const RankBuffer& b = *ranks_[static_cast<size_t>(rank)];
  std::lock_guard<std::mutex> lock(b.mu);
  std::vector<Event> out;
  out.reserve(b.size);
  size_t first = (b.head + capacity_ - b.size) % std::max<size_t>(capacity_, 1);
  for (size_t i = 0; i < b.size; ++i) out.push_back(b.ring[(first + i) % capacity_]);
  return out;
}

size_t TraceRecorder::events_since(int rank, uint64_t min_order, std::vector<Event>& out) const {
  DTLAB_CHECK(rank >= 0 && rank < world_size(), "rank outside the recorder's world");
  const RankBuffer& b = *ranks_[static_cast<size_t>(rank)];
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.size == 0) return 0;
  // The window is sorted by `order`: walk back from the newest to the first one wanted.
  const size_t first = (b.head + capacity_ - b.size) % capacity_;
  size_t n = 0;
  while (n < b.size && b.ring[(first + b.size - 1 - n) % capacity_].order >= min_order) ++n;
  for (size_t i = b.size - n; i < b.size; ++i) out.push_back(b.ring[(first + i) % capacity_]);
  return n;
}

std::vector<Event> TraceRecorder::all_events() const {
  std::vector<Event> out;
  for (int r = 0; r < world_size(); ++r) {
    std::vector<Event> mine = events(r);
    out.insert(out.end(), mine.begin(), mine.end());
  }
  std::sort(out.begin(), out.end(), [](const Event& a, const Event& b) { return a.order < b.order; });
  return out;
}

uint64_t TraceRecorder::dropped(int rank) const {
  DTLAB_CHECK(rank >= 0 && rank < world_size(), "rank outside the recorder's world");
  const RankBuffer& b = *ranks_[static_cast<size_t>(rank)];
  std::lock_guard<std::mutex> lock(b.mu);
  return b.dropped;
}

std::vector<IterationAggregate> TraceRecorder::aggregates(int rank) const {
  DTLAB_CHECK(rank >= 0 && rank < world_size(), "rank outside the recorder's world");
  const RankBuffer& b = *ranks_[static_cast<size_t>(rank)];
  std::lock_guard<std::mutex> lock(b.mu);
  return {b.iters.begin(), b.iters.end()};
}

// Keeps the ring allocation and the order counter: `order` stays unique across clears, so events
// copied out before a clear never compare equal to ones recorded after it.
void TraceRecorder::clear() {
  for (auto& bp : ranks_) {
    std::lock_guard<std::mutex> lock(bp->mu);
    bp->head = bp->size = 0;
    bp->dropped = 0;
    bp->iters.clear();
  }
}

int32_t TraceRecorder::intern(std::string_view text) {
  std::lock_guard<std::mutex> lock(labels_mu_);
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == text) return static_cast<int32_t>(i);
  labels_.emplace_back(text);
  return static_cast<int32_t>(labels_.size() - 1);
}

std::string TraceRecorder::label(int32_t id) const {
  std::lock_guard<std::mutex> lock(labels_mu_);
  if (id < 0 || static_cast<size_t>(id) >= labels_.size()) return {};
  return labels_[static_cast<size_t>(id)];
}

size_t TraceRecorder::label_count() const {
  std::lock_guard<std::mutex> lock(labels_mu_);
  return labels_.size();
}

std::vector<std::string> TraceRecorder::labels() const {
  std::lock_guard<std::mutex> lock(labels_mu_);
  return labels_;
}

}  // namespace dtlab
