// Feeds the bytes, as a pipeline schedule CSV, to load_csv (engine/parallel/pipeline_schedule.h),
// which parses every cell and validates the grid; an accepted schedule is then formatted, simulated
// and measured, as the CLI and the pipeline view do. Finding: anything but dtlab::Error
// (ScheduleError is one), or an accepted schedule that simulate() cannot run.
#include "engine/parallel/pipeline_schedule.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("schedule.csv", data, size);
  PipelineSchedule s;
  if (!fuzz::accepts([&] { s = load_csv(path); })) return 0;
  fuzz::require(s.ranks >= 1 && s.stages == s.ranks * s.chunks && static_cast<int>(s.order.size()) == s.ranks,
                "an accepted schedule's sizes do not add up");
  format_schedule(s);
  const ScheduleTiming t = simulate(s);  // validated grids always run: any throw here is a finding
  fuzz::require(t.bubble.size() == static_cast<size_t>(s.ranks), "simulate() lost a rank");
  for (int r = 0; r < s.ranks; r++) {
    measured_peak_inflight(s, r);
    measured_peak_inflight(s, r, InflightUntil::BackwardWeight);
  }
  return 0;
}
