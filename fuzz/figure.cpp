// Feeds the bytes, as a live figure's text, to Figure::parse (app/figures.h), then evaluates and
// explains it on a made-up snapshot of a 4-rank run (a collective mid-flight, DDP buckets, FSDP
// units, a pipeline, memory, history, step events and a watchdog diagnosis) with one `mark`.
// Finding: anything but dtlab::Error from parse or eval (the lab shows that sentence; anything else
// would end it), or a parsed figure that comes back empty.
#include <map>

#include "app/figures.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

Snapshot make_snapshot() {
  constexpr int kWorld = 4;
  Snapshot s;
  s.config.world = kWorld;
  s.config.batch = 16;
  s.config.accum = 2;
  s.config.num_params = 4547;
  s.config.bucket_cap_bytes = 4096;
  s.step = 3;
  s.total_steps = 10;
  s.iteration = 3;
  s.error = "watchdog: all-reduce #5 for bucket 1 stuck: ranks 0, 2 arrived (in that order); ranks 1, 3 missing";
  CollectiveView& c = s.collective;
  c.valid = c.in_flight = true;
  c.seq = 5;
  c.world = kWorld;
  c.count = 1024;
  c.bytes = 4096;
  c.steps = 6;
  c.steps_done = 2;
  c.arrived = {0, 2};
  c.missing = {1, 3};
  c.chunks = kWorld;
  c.cells.assign(kWorld, std::vector<int>(kWorld, 1));
  c.predicted_s = 1e-5;
  c.algbw_gbs = 0.4;
  c.busbw_gbs = 0.6;
  s.events.resize(kWorld);
  for (int r = 0; r < kWorld; r++) {
    Event e;
    e.rank = r;
    e.iteration = 3;
    e.kind = EventKind::RingStep;
    e.step = RingStepInfo{5, RingPhase::ReduceScatter, 0, 6, 0, static_cast<int16_t>(r), static_cast<int16_t>((r + 1) % kWorld), 1024};
    s.events[static_cast<size_t>(r)].push_back(e);
    Event loss;
    loss.rank = r;
    loss.iteration = 3;
    loss.compute.kind = ComputeKind::Loss;
    s.events[static_cast<size_t>(r)].push_back(loss);
  }
  for (int b = 0; b < 3; b++) {
    BucketView v;
    v.index = v.launch_order = b;
    v.bytes = 1024 * (b + 1);
    v.state = b == 0 ? BucketState::Done : b == 1 ? BucketState::AllReducing : BucketState::Filling;
    v.params.push_back(BucketParam{2 * b, std::to_string(2 * b) + ".weight", 512, true, 0});
    s.buckets.push_back(v);
  }
  for (int u = 0; u < 2; u++) {
    UnitView v;
    v.index = u;
    v.names = {std::to_string(2 * u) + ".weight"};
    v.numel = 99;
    v.chunk = 25;
    v.shard_world = kWorld;
    v.gathered.assign(kWorld, static_cast<uint8_t>(u));
    s.units.push_back(v);
  }
  s.pipeline.valid = true;
  s.pipeline.plan = make_schedule(ScheduleKind::OneFOneB, kWorld, 8);
  s.pipeline.formula = formula_bubble(ScheduleKind::OneFOneB, kWorld, 8);
  s.pipeline.ranks.resize(kWorld);
  s.pipeline.ranks[0].bubble = 0.25;
  s.memory.resize(kWorld);
  for (RankMemory& m : s.memory) m.stats.total_current = m.stats.total_peak = 1 << 20;
  for (int64_t k = 1; k <= 3; k++) s.history.push_back(StepPoint{k, 1.0f / static_cast<float>(k), 0.5, 0.3, 100});
  s.data.valid = true;
  s.data.n = 8;
  s.data.owner = {0, 1, 2, 3, 0, 1, 2, 3};
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Snapshot now = make_snapshot();
  static const std::map<std::string, Snapshot> marks = [] {
    std::map<std::string, Snapshot> m{{"m", now}};
    m["m"].config.world = 8;
    m["m"].data.owner = {3, 2, 1, 0};
    return m;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  Figure f;
  if (!fuzz::accepts([&] { f = Figure::parse(text); })) return 0;
  fuzz::require(!f.empty() && f.text() == text, "a parsed figure is empty or lost its text");
  for (const FigureScope& scope : {FigureScope{&now, &marks}, FigureScope{&now, nullptr}}) {
    fuzz::accepts([&] { f.eval(scope); });
    f.explain(scope);  // says "(none)" for what has no value; never throws
  }
  return 0;
}
