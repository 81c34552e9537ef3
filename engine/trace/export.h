// Trace export to the Chrome Trace Event JSON format, which chrome://tracing and ui.perfetto.dev
// open. One process per rank ("rank N"), thread 0 "compute" and thread 1 "comm" (the Lane); a
// collective carries the same args keys as a torch.profiler trace, so the two compare side by side.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace/event.h"

namespace dtlab {

// Which clock the timeline uses: measured wall time, or the cost model's modeled time.
enum class TraceClock : uint8_t { Wall, Modeled };

struct TraceExportOptions {
  TraceClock clock = TraceClock::Wall;
  std::string title;  // shown in the viewer's metadata ("otherData"); empty for none
  std::vector<std::string> labels;  // the recorder's labels (TraceRecorder::labels()), for names
};

// Writes atomically: the file appears whole or not at all. Throws dtlab::Error on a bad path.
void export_chrome_trace(const std::string& path, const std::vector<Event>& events,
                         const TraceExportOptions& opt = {});
// The same bytes as a string (tests, small traces).
std::string chrome_trace_json(const std::vector<Event>& events, const TraceExportOptions& opt = {});

}  // namespace dtlab
