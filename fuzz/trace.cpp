// Feeds the bytes, as one rank's profiler trace (plain JSON or gzip), and again as the same trace on
// two ranks, to the trace importer (engine/trace/trace_import.h): the SAX reader, classification,
// the cross-rank matching and the clock alignment. Finding: anything but dtlab::Error, or an
// accepted trace whose collectives, clocks or breakdown break their contract.
#include <cmath>

#include "engine/trace/trace_import.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

namespace {

void check(const ImportedTrace& t) {
  fuzz::require(!t.ranks.empty() && t.breakdown.size() == t.ranks.size(), "a breakdown per rank");
  for (const RankBreakdown& b : t.breakdown) {
    const double sum = b.compute_us + b.overlapped_us + b.exposed_comm_us + b.memcpy_us + b.idle_us;
    fuzz::require(std::isfinite(b.wall_us) && b.wall_us >= 0, "a finite, non-negative wall time");
    fuzz::require(std::fabs(sum - b.wall_us) <= 1e-6 * std::max(1.0, std::fabs(b.wall_us)), "the breakdown sums to the wall time");
  }
  for (const TraceCollective& c : t.collectives) {
    fuzz::require(c.rank_index.size() == t.ranks.size(), "a matched collective names one index per rank");
    for (size_t r = 0; r < t.ranks.size(); r++)
      fuzz::require(c.rank_index[r] >= 0 && static_cast<size_t>(c.rank_index[r]) < t.ranks[r].collectives.size(),
                    "a matched collective's index is one of the rank's");
    fuzz::require(c.last_rank >= 0 && c.last_rank < static_cast<int>(t.ranks.size()), "the last rank is a rank");
    fuzz::require(c.busy_us >= 0, "busy time is not negative");
  }
  for (const RankTrace& r : t.ranks)
    for (const TraceSpan& s : r.spans) {
      fuzz::require(s.name >= 0 && static_cast<size_t>(s.name) < t.names.size(), "a span's name is in the table");
      fuzz::require(s.end_us >= s.begin_us, "a span ends after it begins");
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("rank0.json", data, size);
  ImportedTrace t;
  if (fuzz::accepts([&] { t = import_traces({path}); })) check(t);
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (fuzz::accepts([&] { t = import_trace_texts({{"rank0.json", text}, {"rank1.json", text}}); })) check(t);
  return 0;
}
