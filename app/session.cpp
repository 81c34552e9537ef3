#include "app/session.h"

#include <algorithm>

#include "engine/core/check.h"
#include "engine/data/sampler.h"
#include "engine/train/config_json.h"

namespace dtlab::app {

namespace {

// Events kept per rank for the timeline: the last few iterations, bounded.
constexpr int kKeepIterations = 6;
constexpr size_t kMaxEventsPerRank = 40000;

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size() && !s.empty()) {
    size_t comma = s.find(", ", pos);
    out.push_back(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 2;
  }
  return out;
}

bool ring_chunked(CollectiveOp op, Algorithm algo) {
  return algo == Algorithm::Ring && collective_traits(op).runs(Algorithm::Ring);
}

}  // namespace

const char* bucket_state_name(BucketState s) {
  switch (s) {
    case BucketState::Empty: return "empty";
    case BucketState::Filling: return "filling";
    case BucketState::Ready: return "ready";
    case BucketState::Launched: return "launched";
    case BucketState::AllReducing: return "all-reducing";
    case BucketState::Done: return "done";
  }
  return "?";
}

Session::Session(const TrainConfig& config) : config_(config) { start(); }

std::unique_ptr<Session> Session::attach(const std::string& address, double timeout_s) {
  std::unique_ptr<Session> s(new Session());
  s->client_ = std::make_unique<MonitorClient>(address, timeout_s);
  s->config_ = train_config_from_json(s->client_->config_json());
  const TrainConfig& c = s->config_;
  s->plan_model_ = std::make_unique<Model>(c.model, nullptr, c.seed);
  s->plan_data_ = std::make_unique<Dataset>(make_dataset(c.data, c.model.in_features(), c.model.out_features()));
  if (c.strategy == "pipeline")
    s->plan_pipeline_ = std::make_unique<PipelinePlan>(plan_pipeline(c.model, c.pipeline, c.batch, c.world_size));
  s->plan_cost_ = std::make_unique<CostModel>(find_profile(c.profile), c.world_size);
  s->reset_derived();
  return s;
}

Session::~Session() { stop(); }

const Model& Session::model() const { return trainer_ ? trainer_->model() : *plan_model_; }
const Dataset& Session::dataset() const { return trainer_ ? trainer_->dataset() : *plan_data_; }
TraceRecorder& Session::recorder() { return trainer_ ? trainer_->recorder() : client_->recorder(); }
StepperState Session::stepper_state() const { return trainer_ ? trainer_->stepper().state() : client_->stepper_state(); }
const CostModel* Session::cost() const {
  if (client_) return plan_cost_.get();
  return trainer_->world() ? &trainer_->world()->cost() : nullptr;
}
bool Session::finished() const { return client_ ? client_->ended() : done_.load(); }

void Session::start() {
  trainer_ = std::make_unique<Trainer>(config_);  // throws dtlab::Error on a bad configuration
  done_ = false;
  reports_.clear();
  error_.clear();
  reset_derived();
  worker_ = std::thread([this] {
    try {
      trainer_->run([this](const StepReport& r) {
        std::lock_guard<std::mutex> lock(mu_);
        reports_.push_back(r);
      });
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = e.what();
    }
    done_ = true;
  });
}

void Session::stop() {
  if (!trainer_) return;
  if (!done_) trainer_->abort("the run was reset from the app");
  if (worker_.joinable()) worker_.join();
  trainer_.reset();
}

void Session::restart(const TrainConfig& config) {
  if (client_)
    throw Error("this window is attached to a launched run at " + client_->address() +
                "; its configuration is the launch command's: start a new launch to change it");
  // Validate first: a rejected configuration keeps the current run.
  // A GPU run is checked on the CPU (the same configuration checks, no GPU world built beside the
  // live one); its device is taken when it starts.
  TrainConfig check = config;
  if (check.device != "cpu") check.device = "cpu", check.backend = "threads", check.launched = false;
  Trainer{check};
  const TrainConfig previous = config_;
  stop();
  config_ = config;
  try {
    start();
  } catch (const std::exception&) {  // the device could not be had: the previous run comes back
    config_ = previous;
    start();
    throw;
  }
  if (speed_ > 0 || !config_.start_paused) run(speed_);
}

void Session::reset_derived() {
  snap_ = Snapshot{};
  const int N = config_.world_size;
  next_order_.assign(static_cast<size_t>(N), 0);
  issued_.clear();
  coll_done_.clear();
  coll_steps_.clear();
  coll_wall_s_.clear();
  shown_seq_ = UINT64_MAX;
  bucket_iteration_ = -1;
  ready_counter_ = launch_counter_ = 0;
  data_epoch_ = -1;
  snap_.events.assign(static_cast<size_t>(N), {});
  snap_.memory.assign(static_cast<size_t>(N), RankMemory{});
  param_numel_.clear();
  for (const auto& p : model().parameters()) {
    snap_.param_names.push_back(p.name);
    param_numel_[p.name] = p.numel;
  }
  RunConfigView& c = snap_.config;
  c.strategy = config_.strategy;
  c.model = config_.model.str();
  c.data = dataset().name;
  c.optimizer = config_.optimizer.str();
  c.profile = config_.profile;
  c.world = N;
  c.batch = config_.batch;
  c.accum = config_.accum;
  c.steps = client_ ? client_->total_steps() : trainer_->total_steps();
  c.device = config_.device;
  c.backend = client_ ? client_->backend() : config_.backend;
  c.attached = client_ ? client_->address() : std::string();
  c.bucket_cap_bytes = config_.ddp.bucket_cap_bytes;
  c.first_bucket_bytes = config_.ddp.first_bucket_bytes;
  c.find_unused_parameters = config_.ddp.find_unused_parameters;
  c.sized_first_iteration = config_.ddp.sized_first_iteration;
  // Read before the run starts (FSDP releases the model's storage then; the counts stay).
  const Model& model = this->model();
  c.sharding = config_.strategy == "fsdp" ? config_.fsdp.sharding : Sharding::NoShard;
  c.num_params = model.num_params();
  c.optimizer_kind = config_.optimizer.kind;
  c.sgd_momentum = config_.optimizer.kind == OptimizerKind::SGD && config_.optimizer.momentum > 0;
  c.wrap_layers = config_.fsdp.wrap_layers;
  c.largest_unit_params = c.wrap_layers ? 0 : c.num_params;
  if (c.wrap_layers)
    for (int i = 0; i < model.num_layers(); i++) {
      const Layer& l = model.layer(i);
      if (l.kind == LayerKind::Linear) c.largest_unit_params = std::max(c.largest_unit_params, l.in_features * l.out_features + l.out_features);
    }
  // BACKWARD_PRE holds the next unit's parameters beside this unit's parameters and gradient.
  // (Forward prefetch holds two units' parameters only, no more than one unit in backward.)
  c.units_in_flight = config_.fsdp.backward_prefetch == BackwardPrefetch::Pre ? 2 : 1;
  c.node_size = client_ ? config_.fsdp.node_size : trainer_->config().fsdp.node_size;
  snap_.total_steps = c.steps;
  pipeline_.reset(client_ ? plan_pipeline_.get() : trainer_->pipeline_plan(), N, snap_.pipeline);
}

void Session::run(double speed) {
  speed_ = speed;
  if (client_) command_generation_ = client_->stepper_state().generation, client_->run(speed);
  else trainer_->stepper().run(speed);
}

void Session::pause() {
  if (client_) command_generation_ = client_->stepper_state().generation, client_->pause();
  else trainer_->stepper().pause();
}

void Session::step(GateKind kind) {
  if (client_) command_generation_ = client_->stepper_state().generation, client_->step(kind);
  else trainer_->stepper().step(kind);
}

bool Session::paused() const { return client_ ? client_->stepper_state().paused : trainer_->stepper().paused(); }

bool Session::settled() const {
  if (finished()) return true;
  StepperState st = stepper_state();
  // Attached, a command takes a round trip: until a state newer than the command comes back, the
  // one here is the old one.
  if (client_ && (static_cast<int>(st.gates.size()) != 2 * config_.world_size || st.generation <= command_generation_))
    return false;
  if (!st.paused) return false;
  const int N = config_.world_size;
  for (int r = 0; r < N; r++) {
    // A rank is still if one of its lanes waits at a gate: its other lane is either waiting at a
    // gate too, or waiting for that one (the compute lane in wait(), the comm worker idle).
    if (!st.gates[static_cast<size_t>(r) * 2].blocked && !st.gates[static_cast<size_t>(r) * 2 + 1].blocked) return false;
  }
  return true;
}

bool Session::wait_settled(std::chrono::milliseconds timeout) const {
  auto until = std::chrono::steady_clock::now() + timeout;
  // Give released gates a moment to be left before asking whether the world is still.
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  while (std::chrono::steady_clock::now() < until) {
    if (settled()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (settled()) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

const Snapshot& Session::update() {
  Snapshot& s = snap_;
  s.frame++;
  s.trace = trace_;
  TraceRecorder& rec = recorder();
  const int N = config_.world_size;
  std::vector<Event> fresh;
  int32_t newest_iter = s.iteration;
  for (int r = 0; r < N; r++) {
    fresh.clear();
    rec.events_since(r, next_order_[static_cast<size_t>(r)], fresh);
    auto& win = s.events[static_cast<size_t>(r)];
    for (const Event& e : fresh) {
      next_order_[static_cast<size_t>(r)] = std::max(next_order_[static_cast<size_t>(r)], e.order + 1);
      ingest(r, e);
      win.push_back(e);
      newest_iter = std::max(newest_iter, e.iteration);
      s.clock_now_model = std::max(s.clock_now_model, e.model_end);
    }
  }
  s.iteration = newest_iter;
  // Keep the last few iterations per rank (and never more than a bound).
  for (auto& win : s.events) {
    size_t cut = 0;
    while (cut < win.size() && win[cut].iteration >= 0 && win[cut].iteration < newest_iter - kKeepIterations) cut++;
    if (win.size() - cut > kMaxEventsPerRank) cut = win.size() - kMaxEventsPerRank;
    if (cut) win.erase(win.begin(), win.begin() + static_cast<std::ptrdiff_t>(cut));
  }
  if (rec.label_count() != s.labels.size()) s.labels = rec.labels();
  s.clock_now_wall_ns = rec.now_ns();
  s.stepper = stepper_state();
  if (client_ && s.stepper.gates.size() != static_cast<size_t>(2 * N)) s.stepper.gates.assign(static_cast<size_t>(2 * N), RankGateState{});
  if (client_) {  // the run's reports and end, as they came over the wire
    std::vector<StepReport> fresh_reports;
    if (client_->report_count() > reports_.size()) fresh_reports = client_->reports();
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = reports_.size(); i < fresh_reports.size(); i++) reports_.push_back(fresh_reports[i]);
    if (client_->ended()) error_ = client_->error();
    done_ = client_->ended();
  }
  s.running = !done_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.error = error_;
    for (size_t i = s.history.size(); i < reports_.size(); i++) {
      const StepReport& r = reports_[i];
      s.history.push_back({r.step, r.loss, r.accuracy, r.overlap, r.samples_per_sec});
      pipeline_.add_report(r);
    }
    s.step = reports_.empty() ? 0 : reports_.back().step;
  }
  s.finished = done_ && s.error.empty();
  if (client_) {
    update_attached_status();
  } else if (ThreadsWorld* w = trainer_->world()) {
    WorldStatus ws = w->status();
    s.compute_activity = ws.compute_activity;
    s.comm_activity = ws.comm_activity;
    for (int r = 0; r < N; r++) s.memory[static_cast<size_t>(r)].stats = w->memory(r).stats();
    // The collective a ring view draws: the oldest one in flight, else the newest that ran.
    s.collective.in_flight = !ws.in_flight.empty();
    if (!ws.in_flight.empty()) {
      const CollectiveStatus& cs = ws.in_flight.front();
      if (shown_seq_ != cs.seq) shown_seq_ = cs.seq;
      s.collective.arrived = cs.arrived;
      s.collective.missing = cs.missing;
    } else {
      s.collective.arrived.clear();
      s.collective.missing.clear();
    }
  } else {
    s.compute_activity = {trainer_->context().activity()};
    s.comm_activity = {"idle"};
    s.memory[0].stats = trainer_->memory().stats();
  }
  if (trainer_)
    for (int r = 0; r < static_cast<int>(s.memory.size()); r++) {
      RankMemory& m = s.memory[static_cast<size_t>(r)];
      if (!trainer_->device_memory(r, m.device_used, m.device_total)) m.device_used = m.device_total = -1;
    }
  build_collective();
  build_data();
  pipeline_.build(s.stepper, s.pipeline);
  return s;
}

// A launched world's status comes per rank (each process knows only itself): the activities and
// memory as they are, and the collective in flight derived from where each comm worker is.
void Session::update_attached_status() {
  Snapshot& s = snap_;
  const int N = config_.world_size;
  const std::vector<RankMonitorStatus> ranks = client_->ranks();
  if (static_cast<int>(ranks.size()) != N) return;
  s.compute_activity.assign(static_cast<size_t>(N), "");
  s.comm_activity.assign(static_cast<size_t>(N), "");
  int64_t oldest = -1;  // the oldest collective some rank is in and some rank has not finished
  for (int r = 0; r < N; r++) {
    const RankMonitorStatus& st = ranks[static_cast<size_t>(r)];
    s.compute_activity[static_cast<size_t>(r)] = st.connected || st.finished ? st.compute_activity : "not connected";
    s.comm_activity[static_cast<size_t>(r)] = st.comm_activity;
    s.memory[static_cast<size_t>(r)].stats = st.memory;
    if (st.current_seq >= 0 && (oldest < 0 || st.current_seq < oldest)) oldest = st.current_seq;
  }
  s.collective.arrived.clear();
  s.collective.missing.clear();
  s.collective.in_flight = oldest >= 0;
  if (oldest < 0) return;
  shown_seq_ = static_cast<uint64_t>(oldest);
  for (int r = 0; r < N; r++) {
    const RankMonitorStatus& st = ranks[static_cast<size_t>(r)];
    (st.current_seq == oldest || st.done_seq >= oldest ? s.collective.arrived : s.collective.missing).push_back(r);
  }
}

void Session::ingest_unit(int rank, const FsdpInfo& f) {
  const size_t N = static_cast<size_t>(config_.world_size), r = static_cast<size_t>(rank);
  auto& units = snap_.units;
  if (f.unit < 0 || f.unit >= f.num_units) return;
  if (units.size() != static_cast<size_t>(f.num_units)) units.resize(static_cast<size_t>(f.num_units));
  UnitView& u = units[static_cast<size_t>(f.unit)];
  if (u.state.size() != N) {
    u.index = f.unit;
    u.state.assign(N, FsdpState::Idle);
    u.gathered.assign(N, 0);
    u.gathering.assign(N, 0);
    u.reducing.assign(N, 0);
  }
  u.state[r] = f.state;
  switch (f.verb) {
    case FsdpVerb::Layout:
      u.numel = f.numel;
      u.chunk = f.chunk;
      u.shard_world = f.shard_world;
      if (u.names.empty()) {
        int64_t at = 0;
        for (const std::string& name : split_names(recorder().label(f.label))) {
          auto it = param_numel_.find(name);
          const int64_t n = it == param_numel_.end() ? 0 : it->second;
          u.names.push_back(name);
          u.offsets.push_back(at);
          u.sizes.push_back(n);
          at += n;
        }
      }
      break;
    case FsdpVerb::Unshard:
      u.gathering[r] = 1;
      if (f.seq != UINT64_MAX) u.gather_seq = f.seq;
      break;
    case FsdpVerb::Unsharded: u.gathering[r] = 0, u.gathered[r] = 1; break;
    case FsdpVerb::Reshard: u.gathered[r] = 0; break;
    case FsdpVerb::ReduceGrad:
      u.reducing[r] = 1;
      if (f.seq != UINT64_MAX) u.reduce_seq = f.seq;
      break;
    case FsdpVerb::GradReduced: u.reducing[r] = 0; break;
  }
}

void Session::ingest(int rank, const Event& e) {
  const int N = config_.world_size;
  switch (e.kind) {
    case EventKind::CollectiveIssue:
      if (e.coll.op != CollectiveOp::Send && e.coll.op != CollectiveOp::Recv) issued_.emplace(e.coll.seq, e.coll);
      break;
    case EventKind::RingStep: {
      auto& v = coll_steps_[e.step.seq];
      v.resize(static_cast<size_t>(N), 0);
      v[static_cast<size_t>(rank)] = std::max(v[static_cast<size_t>(rank)], static_cast<int>(e.step.step) + 1);
      if (shown_seq_ == UINT64_MAX || e.step.seq > shown_seq_) shown_seq_ = e.step.seq;
      break;
    }
    case EventKind::Collective: {
      if (e.coll.op == CollectiveOp::Send || e.coll.op == CollectiveOp::Recv) break;
      auto& v = coll_done_[e.coll.seq];
      v.resize(static_cast<size_t>(N), 0);
      v[static_cast<size_t>(rank)] = 1;
      issued_.emplace(e.coll.seq, e.coll);
      if (rank == 0) coll_wall_s_[e.coll.seq] = static_cast<double>(e.wall_end_ns - e.wall_begin_ns) * 1e-9;
      for (UnitView& u : snap_.units) {
        if (u.gathering.size() <= static_cast<size_t>(rank)) continue;
        if (u.gather_seq == e.coll.seq) u.gathering[static_cast<size_t>(rank)] = 0, u.gathered[static_cast<size_t>(rank)] = 1;
        if (u.reduce_seq == e.coll.seq) u.reducing[static_cast<size_t>(rank)] = 0;
      }
      if (e.coll.group_size > 1 && (shown_seq_ == UINT64_MAX || e.coll.seq > shown_seq_) &&
          algorithm_step_count(e.coll.op, e.coll.algo, N) > 0)
        shown_seq_ = e.coll.seq;
      // A bucket's all-reduce finished on rank 0's comm lane.
      if (rank == 0)
        for (BucketView& b : snap_.buckets)
          if ((b.state == BucketState::Launched || b.state == BucketState::AllReducing) && b.seq == e.coll.seq) {
            b.state = BucketState::Done;
            b.allreduce_begin = e.model_begin;
            b.allreduce_end = e.model_end;
          }
      break;
    }
    case EventKind::FsdpUnit: ingest_unit(rank, e.fsdp); break;
    case EventKind::PipelineAction: pipeline_.ingest(rank, e); break;
    default: break;
  }
  if (rank != 0) return;
  // Buckets: rank 0's reducer.
  auto& buckets = snap_.buckets;
  switch (e.kind) {
    case EventKind::BucketAssigned: {
      if (e.bucket.bucket == 0 || e.bucket.generation != snap_.bucket_generation) {
        buckets.clear();
        snap_.bucket_generation = e.bucket.generation;
      }
      BucketView b;
      b.index = e.bucket.bucket;
      b.generation = e.bucket.generation;
      b.bytes = e.bucket.bytes;
      const auto& params = model().parameters();
      for (const std::string& name : split_names(recorder().label(e.bucket.label))) {
        BucketParam p;
        p.name = name;
        for (size_t i = 0; i < params.size(); i++)
          if (params[i].name == name) {
            p.index = static_cast<int>(i);
            p.bytes = params[i].numel * static_cast<int64_t>(sizeof(float));
          }
        b.params.push_back(p);
      }
      buckets.push_back(std::move(b));
      bucket_iteration_ = -1;
      break;
    }
    case EventKind::GradReady:
    case EventKind::BucketReady:
    case EventKind::BucketLaunch:
    case EventKind::BucketAllReduce: {
      if (e.iteration != bucket_iteration_) {  // a new backward pass: every bucket starts empty
        bucket_iteration_ = e.iteration;
        ready_counter_ = launch_counter_ = 0;
        for (BucketView& b : buckets) {
          b.state = BucketState::Empty;
          b.launch_order = -1;
          b.seq = 0;
          for (BucketParam& p : b.params) p.ready = false, p.ready_order = -1;
        }
      }
      if (e.bucket.bucket < 0 || e.bucket.bucket >= static_cast<int>(buckets.size())) break;
      BucketView& b = buckets[static_cast<size_t>(e.bucket.bucket)];
      if (e.kind == EventKind::GradReady) {
        for (BucketParam& p : b.params)
          if (p.index == e.bucket.param) p.ready = true, p.ready_order = ready_counter_++;
        if (b.state == BucketState::Empty) b.state = BucketState::Filling;
      } else if (e.kind == EventKind::BucketReady) {
        b.state = BucketState::Ready;
      } else if (e.kind == EventKind::BucketLaunch) {
        b.launch_order = launch_counter_++;
        b.seq = e.bucket.seq;
        // The comm worker may already have finished it (its Collective event came first).
        auto it = coll_done_.find(e.bucket.seq);
        b.state = it != coll_done_.end() && !it->second.empty() && it->second[0] ? BucketState::Done : BucketState::Launched;
      } else {
        b.state = BucketState::Done;
        b.allreduce_begin = e.model_begin;
        b.allreduce_end = e.model_end;
      }
      break;
    }
    default: break;
  }
}

void Session::build_collective() {
  CollectiveView& cv = snap_.collective;
  const int N = config_.world_size;
  auto it = issued_.find(shown_seq_);
  if (shown_seq_ == UINT64_MAX || it == issued_.end()) {
    cv.valid = false;
    return;
  }
  const CollectiveInfo& info = it->second;
  cv.valid = true;
  cv.seq = shown_seq_;
  cv.op = info.op;
  cv.algo = info.algo;
  cv.dtype = info.dtype;
  cv.reduce = info.reduce;
  cv.root = info.root;
  cv.world = N;
  cv.count = info.in_count;
  cv.bytes = info.bytes;
  cv.steps = algorithm_step_count(info.op, info.algo, N);
  auto st = coll_steps_.find(cv.seq);
  cv.rank_steps_done = st != coll_steps_.end() ? st->second : std::vector<int>(static_cast<size_t>(N), 0);
  cv.rank_steps_done.resize(static_cast<size_t>(N), 0);
  auto done = coll_done_.find(cv.seq);
  bool all_done = done != coll_done_.end() && done->second.size() == static_cast<size_t>(N) &&
                  std::all_of(done->second.begin(), done->second.end(), [](int d) { return d != 0; });
  if (all_done) std::fill(cv.rank_steps_done.begin(), cv.rank_steps_done.end(), cv.steps);
  cv.steps_done = *std::min_element(cv.rank_steps_done.begin(), cv.rank_steps_done.end());
  cv.in_flight = cv.in_flight && !all_done;
  cv.opaque = config_.backend == "nccl";
  cv.schematic_step = -1;
  if (cv.opaque && cv.in_flight && cv.steps > 0) {  // two schematic steps a second
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    cv.schematic_step = static_cast<int>(static_cast<int64_t>(t * 2.0) % cv.steps);
  }
  const int shown_step = cv.schematic_step >= 0 ? cv.schematic_step : cv.steps_done;
  cv.last = algorithm_step_plan(cv.op, cv.algo, N, cv.root, shown_step - 1);
  cv.pending = algorithm_step_plan(cv.op, cv.algo, N, cv.root, shown_step);
  const auto& ph = cv.pending.empty() ? cv.last : cv.pending;
  cv.phase = ph.empty() ? RingPhase::None : ph.front().phase;
  auto wall = coll_wall_s_.find(cv.seq);
  cv.measured_s = all_done && wall != coll_wall_s_.end() ? wall->second : -1;
  cv.label.clear();
  for (const BucketView& b : snap_.buckets)
    if (b.seq == cv.seq && b.seq != 0) {
      std::string names;
      for (const BucketParam& p : b.params) names += (names.empty() ? "" : ", ") + p.name;
      cv.label = "DDP bucket " + std::to_string(b.index) + ": " + names;
    }
  if (config_.strategy == "dp") {  // DataParallel's only collectives: replicate and ReduceAddCoalesced
    if (cv.op == CollectiveOp::Broadcast) cv.label = "DataParallel replicate: every parameter from rank 0";
    if (cv.op == CollectiveOp::Reduce) cv.label = "DataParallel backward: every gradient reduce-added onto rank 0";
  }
  for (const UnitView& u : snap_.units) {
    if (u.gather_seq != cv.seq && u.reduce_seq != cv.seq) continue;
    std::string names;
    for (const std::string& n : u.names) names += (names.empty() ? "" : ", ") + n;
    cv.label = "FSDP unit " + std::to_string(u.index) + (u.gather_seq == cv.seq ? " unshard: " : " gradient: ") + names;
  }
  // A launched bucket whose all-reduce has ranks in it (or steps done) is on the wire.
  for (BucketView& b : snap_.buckets)
    if (b.state == BucketState::Launched && b.seq == cv.seq && (cv.in_flight || cv.steps_done > 0) && !all_done)
      b.state = BucketState::AllReducing;
  // Cost model prediction.
  if (const CostModel* cm = cost()) {
    cv.predicted_s = cm->collective_time(cv.op, cv.algo, static_cast<double>(cv.bytes));
    cv.algbw_gbs = cv.predicted_s > 0 ? static_cast<double>(cv.bytes) / cv.predicted_s / 1e9 : 0;
    cv.busbw_gbs = cv.algbw_gbs * bus_bandwidth_factor(cv.op, N);
  }
  // Buffer cells from the steps every rank finished: what each chunk holds follows from the
  // algorithm's schedule (a ring reduce-scatter step s leaves s + 2 contributions in the chunk it
  // received; an all-gather step leaves a final chunk).
  const bool ringy = ring_chunked(cv.op, cv.algo);
  cv.chunks = ringy || cv.op == CollectiveOp::AllToAll ? N : 1;
  cv.cells.assign(static_cast<size_t>(N), std::vector<int>(static_cast<size_t>(cv.chunks), 1));
  if (cv.op == CollectiveOp::AllGather) {
    for (int r = 0; r < N; r++)
      for (int c = 0; c < N; c++) cv.cells[static_cast<size_t>(r)][static_cast<size_t>(c)] = c == r ? N : 0;
  }
  if (cv.op == CollectiveOp::Broadcast)
    for (int r = 0; r < N; r++) cv.cells[static_cast<size_t>(r)][0] = r == cv.root ? N : 0;
  if (cv.op == CollectiveOp::AllToAll)
    for (int r = 0; r < N; r++)
      for (int c = 0; c < N; c++) cv.cells[static_cast<size_t>(r)][static_cast<size_t>(c)] = c == r ? N : 0;
  std::vector<int> held(static_cast<size_t>(N), 1);  // tree/naive: contributions per rank buffer
  for (int s = 0; s < cv.steps; s++) {
    for (const StepTransfer& t : algorithm_step_plan(cv.op, cv.algo, N, cv.root, s)) {
      if (cv.rank_steps_done[static_cast<size_t>(t.dst)] <= s) continue;  // not yet on that rank
      auto& cells = cv.cells[static_cast<size_t>(t.dst)];
      if (ringy || cv.op == CollectiveOp::AllToAll) {
        const bool rs = t.phase == RingPhase::ReduceScatter;
        cells[static_cast<size_t>(t.chunk)] = rs ? s + 2 : N;
      } else if (t.reduce) {
        held[static_cast<size_t>(t.dst)] += held[static_cast<size_t>(t.src)];
        cells[0] = held[static_cast<size_t>(t.dst)];
      } else {
        held[static_cast<size_t>(t.dst)] = N;
        cells[0] = N;
      }
    }
  }
  if (all_done && cv.op == CollectiveOp::AllReduce)
    for (auto& row : cv.cells) std::fill(row.begin(), row.end(), N);
}

void Session::build_data() {
  DataView& d = snap_.data;
  const Dataset& ds = dataset();
  if (!d.valid) {
    d.valid = true;
    d.name = ds.name;
    d.n = ds.n;
    d.classes = static_cast<int>(ds.num_classes);
    d.xy.resize(static_cast<size_t>(2 * ds.n));
    d.label.resize(static_cast<size_t>(ds.n));
    for (int64_t i = 0; i < ds.n; i++) {
      d.xy[static_cast<size_t>(2 * i)] = ds.x[static_cast<size_t>(i * ds.d)];
      d.xy[static_cast<size_t>(2 * i + 1)] = ds.d > 1 ? ds.x[static_cast<size_t>(i * ds.d + 1)] : 0.0f;
      d.label[static_cast<size_t>(i)] = static_cast<int32_t>(ds.y[static_cast<size_t>(i)]);
    }
  }
  int64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reports_.empty()) epoch = reports_.back().epoch;
  }
  const int64_t shown = data_set_epoch_ ? epoch : 0;  // without set_epoch every epoch repeats epoch 0's order
  d.epoch = epoch;
  if (shown == data_epoch_ && data_set_epoch_ == data_set_epoch_built_) return;
  data_epoch_ = shown;
  data_set_epoch_built_ = data_set_epoch_;
  d.set_epoch = data_set_epoch_;
  d.owner.assign(static_cast<size_t>(ds.n), -1);
  if (config_.strategy == "dp") {
    // DataParallel: rank 0's one loader (no DistributedSampler split) cuts its order into batches of
    // batch x world; torch.chunk gives each device its piece of every batch.
    DistributedSampler sampler(rank_sampler_config(config_, ds.n, 1, 0));
    sampler.set_epoch(shown);
    const std::vector<int64_t> order = sampler.indices();
    const int64_t G = config_.batch * config_.world_size;
    for (int64_t p = 0; p < static_cast<int64_t>(order.size()); p++) {
      const int64_t rows = std::min(G, static_cast<int64_t>(order.size()) - p / G * G);
      if (config_.drop_last && rows < G) break;
      const std::vector<int64_t> pieces = chunk_sizes(rows, config_.world_size);
      int64_t at = p % G, r = 0;
      while (at >= pieces[static_cast<size_t>(r)]) at -= pieces[static_cast<size_t>(r++)];
      d.owner[static_cast<size_t>(order[static_cast<size_t>(p)])] = static_cast<int16_t>(r);
    }
    return;
  }
  // A pipeline's ranks share their replica's shard: the sampler splits over the replicas.
  const int N = config_.strategy == "pipeline" ? config_.pipeline.dp : config_.world_size;
  for (int r = N - 1; r >= 0; r--) {  // lower ranks win for padded duplicates
    DistributedSampler sampler(rank_sampler_config(config_, ds.n, N, r));
    sampler.set_epoch(shown);
    for (int64_t i : sampler.indices()) d.owner[static_cast<size_t>(i)] = static_cast<int16_t>(r);
  }
}

}  // namespace dtlab::app
