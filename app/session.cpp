#include "app/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/train/config_json.h"

namespace dtlab::app {

Session::Session(const TrainConfig& config) : config_(config) { start(); }

std::unique_ptr<Session> Session::attach(const std::string& address, double timeout_s) {
  std::unique_ptr<Session> s(new Session());
  s->client_ = std::make_unique<MonitorClient>(address, timeout_s);
  s->config_ = train_config_from_json(s->client_->config_json());
  const TrainConfig& c = s->config_;
  s->plan_model_ = std::make_unique<Model>(c.model, nullptr, c.seed);
  s->plan_data_ = std::make_unique<Dataset>(make_dataset(c.data, c.model.in_features(), c.model.out_features()));
  if (c.strategy == Strategy::Pipeline)
    s->plan_pipeline_ = std::make_unique<PipelinePlan>(plan_pipeline(c.model, c.pipeline, c.batch, c.world_size / std::max(1, c.tp)));
  s->plan_cost_ = std::make_unique<CostModel>(find_profile(c.profile), c.world_size);
  s->reset_builder();
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
  reset_builder();
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
  // Nothing waits forever: an aborted run's ranks leave at their next collective or gate within a
  // frame or two. One stuck elsewhere (a rank that never returns from a library call, as OpenBLAS
  // allocating its buffers under a tight address-space limit once did) cannot be joined or freed; the
  // lab says which ranks and where, and ends the process rather than hang.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kStopLimitS);
  while (!done_ && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!done_) {
    std::string busy;
    if (ThreadsWorld* w = trainer_->world()) {
      const WorldStatus st = w->status();
      for (size_t r = 0; r < st.compute_activity.size(); r++)
        if (st.compute_activity[r] != "idle" && st.compute_activity[r] != "finished")
          busy += (busy.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " + st.compute_activity[r];
    } else {
      busy = "rank 0 " + trainer_->context().activity();
    }
    std::fprintf(stderr, "dtlab: the run did not stop within %.0f s of being asked to (%s); the lab exits without waiting for it\n",
                 kStopLimitS, busy.empty() ? "no rank says where it is" : busy.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
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

void Session::reset_builder() {
  RunSources run;
  run.config = &config_;
  run.model = &model();
  run.dataset = &dataset();
  run.pipeline = client_ ? plan_pipeline_.get() : trainer_->pipeline_plan();
  run.cost = cost();
  run.total_steps = client_ ? client_->total_steps() : trainer_->total_steps();
  run.backend = client_ ? client_->backend() : config_.backend;
  run.attached = client_ ? client_->address() : std::string();
  run.node_size = client_ ? config_.fsdp.node_size : trainer_->config().fsdp.node_size;
  // An attached run's ranks are processes of their own: one BLAS thread each on the CPU; a GPU the
  // lab cannot name from here has no roof.
  run.roof = !client_ ? trainer_->roof() : config_.device == "cpu" ? cpu_roof(this_machine_profile(), 1) : gpu_roof("a GPU of the attached run");
  builder_.reset(run);
  experts_key_ = 0;
  context_key_ = 0;
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

void Session::set_focus(int rank, const std::string& group) {
  if (client_) command_generation_ = client_->stepper_state().generation, client_->set_focus(rank, group);
  else trainer_->stepper().set_focus(rank, group);
}

bool Session::paused() const { return client_ ? client_->stepper_state().paused : trainer_->stepper().paused(); }

std::string Session::generate(const std::string& prompt, int64_t tokens) {
  if (!config_.model.is_gpt()) throw Error("generate samples text from a GPT; start a run with --model gpt-tiny");
  if (client_) throw Error("generate samples from this lab's own runs; an attached run's parameters live in its processes");
  if (!settled()) throw Error("the run is moving; pause it (or let it finish) and generate again");
  Model& live = finished() ? trainer_->result_model() : trainer_->model();
  if (!finished() && config_.strategy == Strategy::Pipeline)
    throw Error("the pipeline's stages hold the model across ranks, gathered to rank 0 only when the run ends; generate after the last step");
  if (!live.owns_parameters())
    throw Error("FSDP shards rank 0's parameters, so no rank holds the whole model until the run ends; generate after the last step");
  const Dataset& ds = trainer_->dataset();
  if (ds.chars.empty()) throw Error("the run's data is token ids, not text; train on --data text to read what it writes");
  std::vector<int32_t> ids;
  for (char32_t c : utf8_to_code_points(prompt, "the prompt")) {
    const size_t at = ds.chars.find(c);
    if (at == std::u32string::npos) throw Error("the prompt holds a character the text does not; use characters of " + ds.name);
    ids.push_back(static_cast<int32_t>(at));
  }
  if (!sample_model_ || sample_model_->spec().str() != live.spec().str())
    sample_model_ = std::make_unique<Model>(live.spec(), nullptr, 0);
  if (!finished() && config_.tp > 1) {  // replica 0's TP shards (ranks 0 .. tp-1), put together
    std::vector<const Model*> shards;
    for (int r = 0; r < config_.tp; r++) shards.push_back(&trainer_->rank_model(r));
    sample_model_->upload_params(assemble_tensor_parallel_params(shards).data());
  } else {
    sample_model_->upload_params(live.host_params().data());
  }
  const std::vector<int32_t> out = gpt_generate(*sample_model_, ids, tokens, 0.8f, 200, 1337);
  return decode_tokens(ds.chars, out.data(), static_cast<int64_t>(out.size()));
}

bool Session::attention(int layer, int head, std::vector<float>& probs, std::string& text) const {
  if (!trainer_ || !config_.model.is_gpt() || !settled()) return false;
  // Under --tp the head's TP rank of replica 0 computed it (rank = tp index there: tp varies fastest).
  const int holder = config_.tp > 1 ? head / static_cast<int>(config_.model.gpt.heads / config_.tp) : 0;
  const GptCore* g = trainer_->rank_model(holder).gpt();
  const int64_t* tok = g ? g->tokens(0) : nullptr;
  if (!tok) return false;
  // The run is paused: a GPU's copies are read back, on this thread bound to the rank's device.
  Device& dev = g->device();
  dev.bind_thread();
  if (!g->attention(layer, 0, head, probs)) return false;
  const int64_t T = config_.model.gpt.ctx;
  std::vector<int64_t> tok64(static_cast<size_t>(T));
  dev.download(tok64.data(), tok, T * static_cast<int64_t>(sizeof(int64_t)));
  const std::vector<int32_t> ids(tok64.begin(), tok64.end());
  const Dataset& ds = trainer_->dataset();
  text = ds.chars.empty() ? std::string() : decode_tokens(ds.chars, ids.data(), T);
  return true;
}

bool Session::read_experts(ExpertsView& v) const {
  if (!trainer_ || !v.moe || !settled()) return false;
  const int L = static_cast<int>(config_.model.gpt.layers);
  v.ranks.assign(static_cast<size_t>(config_.world_size), {});
  for (int r = 0; r < config_.world_size; r++) {
    for (const GptCore* g : view_cores(r, false)) {
      for (int l = 0; l < L; l++) {
        const GptCore::MoeRouting* m = g->moe_routing(l);
        if (!m) continue;  // a dense block, another stage's, or no forward yet
        ExpertsBlockView b;
        b.layer = l;
        b.tokens = m->tokens, b.capacity = m->capacity, b.dropped = m->dropped, b.aux_loss = m->aux_loss;
        b.routed = m->routed, b.kept = m->kept;
        if (const auto* h = g->moe_history(l))
          for (const GptCore::MoePoint& p : *h) b.imbalance_history.push_back(p.imbalance), b.aux_history.push_back(p.aux_loss);
        v.ranks[static_cast<size_t>(r)].push_back(std::move(b));
      }
    }
  }
  v.read = true;
  v.at_step = builder_.snapshot().step;
  return true;
}

// The GPT activations the Experts (context false) and Context views read for rank r: its model's, or a
// pipeline rank's stages', the one that ran last first.
std::vector<const GptCore*> Session::view_cores(int r, bool context) const {
  if (trainer_->pipeline_plan()) return trainer_->pipeline_view_cores(r);
  const Model& m = trainer_->rank_model(r);
  const GptCore* g = context ? m.context_parallel_core() : m.gpt();
  return g ? std::vector<const GptCore*>{g} : std::vector<const GptCore*>{};
}

bool Session::read_context(ContextView& v) const {
  if (!trainer_ || !v.cp || !settled()) return false;
  const int N = config_.world_size;
  v.groups.clear();
  v.ranks.assign(static_cast<size_t>(N), {});
  std::vector<char> placed(static_cast<size_t>(N), 0);
  for (int r = 0; r < N; r++) {
    ContextRankView& out = v.ranks[static_cast<size_t>(r)];
    out.rank = r;
    const std::vector<const GptCore*> cores = view_cores(r, true);
    if (cores.empty()) continue;
    const GptCore* g = cores.front();  // (a pipeline rank's stages: the one that ran last)
    const ContextParallelSpec& cp = g->context_parallel();
    out.positions = cp.positions(v.ctx);
    if (!placed[static_cast<size_t>(r)]) {  // its group: the ranks of its mesh coordinates but dp's, in CP order
      v.groups.push_back(cp_group_ranks(trainer_->mesh(), v.degree, r));
      for (int m : v.groups.back()) placed[static_cast<size_t>(m)] = 1;
    }
    out.block = g->cp_block();
    auto view = [](const GptCore::CpPass* p) {
      ContextPassView pv;
      if (!p) return pv;
      pv.valid = true;
      pv.backward = p->backward;
      pv.steps_done = p->steps_done;
      pv.held = p->held;
      pv.pairs = p->pairs;
      pv.sent_bytes = p->sent_bytes;
      pv.sending = p->sending;
      return pv;
    };
    for (int l = 0; l < static_cast<int>(config_.model.gpt.layers); l++) {
      const GptCore* at = g;  // the stage holding block l (a pipeline rank's other stages: another core)
      for (const GptCore* c : cores)
        if (c->cp_pass(l)) at = c;
      const GptCore::CpPass* latest = at->cp_pass(l);
      out.passes.push_back(view(latest));
      out.earlier.push_back(view(latest ? at->cp_pass(l, !latest->backward) : nullptr));  // the block's pass the other way
    }
  }
  v.read = true;
  v.at_step = builder_.snapshot().step;
  return true;
}

bool Session::settled() const {
  if (finished()) return true;
  StepperState st = stepper_state();
  // Attached, a command takes a round trip: until a state newer than the command comes back, the
  // one here is the old one.
  if (client_ && (static_cast<int>(st.gates.size()) != kStepperLanes * config_.world_size || st.generation <= command_generation_))
    return false;
  // The stepper knows its next item once every live rank waits at a gate (engine/trace/stepper.h).
  return st.paused && st.settled();
}

bool Session::wait_settled(std::chrono::milliseconds timeout) const {
  SettleWait wait;
  wait.start(timeout);
  for (;;) {
    const SettleWait::State st = wait.poll(*this);
    if (st != SettleWait::Waiting) return st == SettleWait::Settled;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void SettleWait::start(std::chrono::milliseconds timeout) {
  active_ = true;
  begun_ = Clock::now();
  until_ = begun_ + timeout;
  still_ = false;
}

SettleWait::State SettleWait::poll(const Session& session) {
  constexpr auto kMoment = std::chrono::milliseconds(5);
  const auto now = Clock::now();
  if (!active_) return Settled;
  if (now >= until_) {
    active_ = false;
    return TimedOut;
  }
  // Give released gates a moment to be left before asking whether the world is still.
  if (now < begun_ + kMoment) return Waiting;
  if (!session.settled()) {
    still_ = false;
    return Waiting;
  }
  if (!still_) {
    still_ = true, still_since_ = now;
    return Waiting;
  }
  if (now - still_since_ < kMoment) return Waiting;
  active_ = false;
  return Settled;
}

const Snapshot& Session::update() {
  builder_.begin_frame(trace_);
  builder_.add_events(recorder());
  StepperState st = stepper_state();
  const size_t gates = static_cast<size_t>(kStepperLanes * config_.world_size);
  if (client_ && st.gates.size() != gates) st.gates.assign(gates, RankGateState{});
  const uint64_t generation = st.generation;
  builder_.set_stepper(std::move(st));
  // The Experts view reads every rank's router once each time the world stands still at a new place;
  // the moe.* figures read the same data, and only while it is current (a moving run's is stale).
  if (!client_ && builder_.snapshot().experts.moe) {
    const uint64_t key = finished() ? UINT64_MAX : generation + 1;
    if (key != experts_key_) {
      ExpertsView v = builder_.snapshot().experts;
      if (read_experts(v)) {
        builder_.set_experts(std::move(v));
        experts_key_ = key;
      }
    }
    builder_.set_experts_current(key == experts_key_);
  }
  if (!client_ && builder_.snapshot().context.cp) {  // the Context view: the same, for every rank's ring pass
    const uint64_t key = finished() ? UINT64_MAX : generation + 1;
    if (key != context_key_) {
      ContextView v = builder_.snapshot().context;
      if (read_context(v)) {
        builder_.set_context(std::move(v));
        context_key_ = key;
      }
    }
  }
  if (client_) {  // the run's reports and end, as they came over the wire
    std::vector<StepReport> fresh_reports;
    if (client_->report_count() > client_reports_) fresh_reports = client_->reports_since(client_reports_);
    std::lock_guard<std::mutex> lock(mu_);
    for (StepReport& r : fresh_reports) reports_.push_back(std::move(r));
    if (client_->ended()) error_ = client_->error();
    done_ = client_->ended();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    builder_.set_reports(reports_, error_, done_);
    reports_.clear();  // the builder keeps what the views draw (bounded); the rest is gone
  }
  update_status();
  return builder_.finish_frame();
}

void Session::update_status() {
  const int N = config_.world_size;
  if (client_) {
    builder_.set_rank_statuses(client_->ranks());
    return;
  }
  if (ThreadsWorld* w = trainer_->world()) {
    builder_.set_world_status(w->status());
    for (int r = 0; r < N; r++) builder_.set_memory(r, w->memory(r).stats());
  } else {
    builder_.set_activities({trainer_->context().activity()}, {"idle"});
    builder_.set_memory(0, trainer_->memory().stats());
  }
  for (int r = 0; r < N; r++) {
    int64_t used = -1, total = -1;
    if (!trainer_->device_memory(r, used, total)) used = total = -1;
    builder_.set_device_memory(r, used, total);
  }
}

}  // namespace dtlab::app
