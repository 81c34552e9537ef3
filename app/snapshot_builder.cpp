#include "app/snapshot_builder.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "engine/core/format.h"
#include "engine/data/sampler.h"
#include "engine/train/settings.h"
#include "engine/trace/tuning.h"

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

bool point_to_point(CollectiveOp op) { return op == CollectiveOp::Send || op == CollectiveOp::Recv; }

}  // namespace

// What each transfer of a step moves on the modeled clock: a ring chunk S/n; the whole buffer
// for the binomial tree and naive; a double-tree chunk S/2K; an in-network chunk S/K; hierarchical
// S/G inside a node and S/(G N) across nodes (docs/course_sources.md §6b).
double modeled_step_bytes(const CollectiveView& cv, const CostModel& cost, const std::vector<StepTransfer>& plan) {
  // A process group's collective moves S over its members (in_world_ranks keeps them).
  const double S = static_cast<double>(cv.bytes), K = kPipelineChunks;
  const double n = cv.members.empty() ? cv.world : static_cast<double>(cv.members.size());
  const int G = cost.profile().gpus_per_node;
  switch (cv.algo) {
    case Algorithm::DoubleTree: return S / (2 * K);
    case Algorithm::InNetwork: return S / K;
    case Algorithm::Hierarchical: {
      if (G <= 1 || G >= cv.world || cv.world % G != 0) return S / n;
      const bool crosses = std::any_of(plan.begin(), plan.end(), [&](const StepTransfer& t) {
        return cost.node_of(t.src) != cost.node_of(t.dst);
      });
      return crosses ? S / cv.world : S / G;
    }
    case Algorithm::Tree:
    case Algorithm::Naive:
      if (cv.op == CollectiveOp::AllReduce || cv.op == CollectiveOp::Broadcast || cv.op == CollectiveOp::Reduce) return S;
      return S / n;
    default: return cv.op == CollectiveOp::Broadcast || cv.op == CollectiveOp::Reduce ? S : S / n;
  }
}

namespace {

TopologyView build_topology(const CollectiveView& cv, const CostModel* cost) {
  TopologyView t;
  if (!cost) return t;
  t.valid = true;
  t.profile = cost->profile();
  t.world = cost->world_size();
  if (!cv.valid || cv.steps <= 0 || cv.world != t.world) return t;
  const bool pending = !cv.pending.empty();
  t.transfers = pending ? cv.pending : cv.last;
  if (t.transfers.empty()) return t;
  t.steps = cv.steps;
  t.step = pending ? (cv.schematic_step >= 0 ? cv.schematic_step : cv.steps_done) : cv.steps_done - 1;
  t.phase = t.transfers.front().phase;
  t.bytes = modeled_step_bytes(cv, *cost, t.transfers);
  std::vector<std::pair<int, int>> pairs;
  for (const StepTransfer& x : t.transfers) pairs.emplace_back(x.src, x.dst);
  t.links = cost->link_loads(pairs, t.bytes);
  t.seconds = cost->step_time(pairs, t.bytes, t.transfers.front().reduce);
  return t;
}

// A process group's collective on the profile's links: its steps (group ranks mapped to global
// ones, each moving S/n) one after the other, so a TP group inside a node runs at NVLink speed and
// a DP group across nodes at the network's.
double group_time(const CollectiveView& cv, const CostModel& cost) {
  const int n = cv.world;
  double t = 0;
  for (int s = 0; s < cv.steps; s++) {
    const std::vector<StepTransfer> plan = algorithm_step_plan(cv.op, cv.algo, n, cv.root, s);
    std::vector<std::pair<int, int>> pairs;
    bool reduce = false;
    for (const StepTransfer& x : plan) {
      if (x.src < 0 || x.dst < 0 || x.src >= n || x.dst >= n) continue;
      pairs.emplace_back(cv.members[static_cast<size_t>(x.src)], cv.members[static_cast<size_t>(x.dst)]);
      reduce = reduce || x.reduce;
    }
    if (!pairs.empty()) t += cost.step_time(pairs, modeled_step_bytes(cv, cost, plan), reduce);
  }
  return t;
}

// The topology view draws global ranks: a group's collective, mapped onto them.
CollectiveView in_world_ranks(const CollectiveView& cv) {
  CollectiveView w = cv;
  auto map = [&](std::vector<StepTransfer>& v) {
    for (StepTransfer& x : v) {
      if (x.src >= 0 && x.src < cv.world) x.src = cv.members[static_cast<size_t>(x.src)];
      if (x.dst >= 0 && x.dst < cv.world) x.dst = cv.members[static_cast<size_t>(x.dst)];
    }
  };
  map(w.last);
  map(w.pending);
  w.world = cv.world_size;
  return w;
}

// "0.weight rows 32-63 of 64 (column-parallel)" and its bias line, for Linear l of a stage.
void describe_linear(const std::vector<int64_t>& dims, int l, TpRole role, int degree, int tp_rank,
                     std::vector<std::string>& out) {
  const int64_t in = dims[static_cast<size_t>(l)], outf = dims[static_cast<size_t>(l) + 1];
  const TpSlice s = tp_slice(role, outf, in, degree, tp_rank);
  const std::string w = std::to_string(2 * l) + ".weight", b = std::to_string(2 * l) + ".bias";
  auto range = [](int64_t begin, int64_t end, int64_t of) {
    return std::to_string(begin) + "-" + std::to_string(end - 1) + " of " + std::to_string(of);
  };
  switch (role) {
    case TpRole::Column:
      out.push_back(w + " rows " + range(s.row_begin, s.row_end, outf) + " (column-parallel)");
      out.push_back(b + " " + range(s.bias_begin, s.bias_end, outf));
      break;
    case TpRole::Row:
      out.push_back(w + " columns " + range(s.col_begin, s.col_end, in) + " (row-parallel)");
      out.push_back(b + " whole (added once, after the partial outputs are summed)");
      break;
    case TpRole::Replicated:
      out.push_back(w + " whole, " + std::to_string(outf) + " x " + std::to_string(in) +
                    (degree > 1 ? " (replicated in the tp group)" : ""));
      out.push_back(b + " whole");
      break;
  }
}

// What a GPT stage holds on TP rank `tp` of `degree` (Megatron's split, engine/core/gpt.h), a block a line.
void describe_gpt_stage(const GptSpec& g, StageRange r, int degree, int tp, bool sp, std::vector<std::string>& out) {
  const GptRange gr{r.first, r.end};
  const std::string C = std::to_string(g.embd);
  const std::string copies = degree > 1 ? " (replicated in the tp group)" : "";
  if (gr.embeds()) {
    out.push_back("transformer.wte.weight whole, " + std::to_string(g.vocab) + " x " + C + copies);
    out.push_back("transformer.wpe.weight whole, " + std::to_string(g.ctx) + " x " + C + copies);
  }
  const int64_t per_block = (12 * g.embd * g.embd + 7 * g.embd) / degree + 6 * g.embd;  // LayerNorms, c_proj biases whole
  const int64_t H = g.heads / degree, Ct = g.embd / degree, F = 4 * g.embd / degree;
  // The stage's blocks hold the same split: one entry for them all, a line per pair of layers.
  const int b0 = gr.first_block(), b1 = gr.end_block(g);
  const std::string h = "transformer.h." + index_span(b0, b1) + (b1 - b0 > 1 ? ", each" : "");
  if (degree == 1) {
    out.push_back(h + " whole: ln_1, attn.c_attn " + std::to_string(3 * g.embd) + " x " + C + ", attn.c_proj, ln_2, mlp.c_fc " +
                  std::to_string(4 * g.embd) + " x " + C + ", mlp.c_proj (" + with_commas(per_block) + " parameters)");
  } else {
    const std::string cols = index_span(tp * Ct, (tp + 1) * Ct), mlp = index_span(tp * F, (tp + 1) * F);
    out.push_back(h + ": heads " + index_span(tp * H, (tp + 1) * H) + " of " + std::to_string(g.heads) + ", MLP columns " + mlp + " of " +
                  std::to_string(4 * g.embd) + " (" + with_commas(per_block) + " parameters)");
    out.push_back("  attn.c_attn: rows " + cols + " of each of q, k, v (column-parallel); attn.c_proj: columns " + cols + " (row-parallel)");
    out.push_back("  mlp.c_fc: rows " + mlp + " (column-parallel); mlp.c_proj: columns " + mlp + " (row-parallel)");
    out.push_back("  ln_1, ln_2 and both c_proj biases whole (a bias is added once, after the sum)");
  }
  if (gr.heads(g)) {
    out.push_back("transformer.ln_f whole" + copies);
    if (!gr.embeds()) out.push_back("lm_head.weight whole, " + std::to_string(g.vocab) + " x " + C + " (wte's copy; the embedding group sums their gradients)");
  }
  if (degree > 1 && sp)
    out.push_back("sequence parallel: positions " + index_span(tp * g.ctx / degree, (tp + 1) * g.ctx / degree) + " of every sample's " +
                  std::to_string(g.ctx) + " in the residual stream, the LayerNorms and the embeddings");
}

// What `rank` holds of each Linear of its stage(s) (virtual stages v = pp, pp + p, ...).
std::vector<std::string> rank_slices(const MeshView& mv, int rank) {
  const MeshShape& m = mv.shape;
  const MeshCoord c = mesh_coord(m, rank);
  std::vector<std::string> out;
  for (size_t v = static_cast<size_t>(c.pp); v < mv.stages.size(); v += static_cast<size_t>(m.pp)) {
    const StageRange r = mv.stages[v];
    if (!mv.gpt.empty()) {
      describe_gpt_stage(mv.gpt, r, m.tp, c.tp, mv.sequence_parallel, out);
      continue;
    }
    const std::vector<TpRole> roles = tp_roles(r.first, r.end, m.tp);
    for (int l = r.first; l < r.end; l++) describe_linear(mv.dims, l, roles[static_cast<size_t>(l - r.first)], m.tp, c.tp, out);
  }
  return out;
}

// The mesh of the run's --tp and pipeline stages over its world (engine/core/mesh.h).
void reset_mesh(const TrainConfig& config, const GptSpec& gpt, MeshView& m) {
  const bool pipeline = config.strategy == Strategy::Pipeline;
  const int stages = pipeline ? config.pipeline.stages : 1;
  m.sequence_parallel = config.sequence_parallel;
  m.dims = config.model.dims;
  m.gpt = gpt;  // the trainer's (its vocabulary is the data's)
  try {
    m.shape = resolve_mesh(config.world_size, config.tp, stages);
  } catch (const Error& e) {
    m.shape = MeshShape{config.world_size, 1, 1};
    m.error = e.what();
  }
  const int linears = static_cast<int>(m.dims.size()) - 1;
  m.stages = {config.model.is_gpt() ? StageRange{0, static_cast<int>(config.model.gpt.layers) + 2} : StageRange{0, linears}};
  if (pipeline && m.error.empty()) {
    try {
      m.stages = partition_stages(config.model, stages * std::max(1, config.pipeline.chunks), config.pipeline.split);
    } catch (const Error&) {  // the run itself refuses such a split; draw the mesh without slices
      m.stages.clear();
    }
  }
  for (int r = 0; r < m.shape.world(); r++) m.slices.push_back(rank_slices(m, r));
}

}  // namespace

std::string pending_text(const PendingItem& p) {
  if (!p.valid) return "";
  std::string who;
  for (size_t i = 0; i < p.members.size(); i++) who += (i ? ", " : "") + std::to_string(p.members[i]);
  who = (p.members.size() == 1 ? "rank " : "ranks ") + who;
  std::string s = p.gate.label.empty() ? gate_kind_name(p.kind) : p.gate.label;
  if (!p.missing.empty()) {
    std::string missing;
    for (size_t i = 0; i < p.missing.size(); i++) missing += (i ? ", " : "") + std::to_string(p.missing[i]);
    return s + " [" + who + "; waiting for " + missing + "]";
  }
  return s + " [" + who + "]";
}

namespace {

// Why the held collective runs, where the run knows: DDP's constructor and bucket rebuild, and the
// buckets' all-reduces (torch's names, docs/course_sources.md §2).
std::string collective_purpose(const Snapshot& s, const GateInfo& g) {
  if (g.op.p2p || g.op.group != 0) return "";
  if (s.config.strategy == Strategy::Ddp) {
    if (g.iteration < 0 && g.coll == CollectiveOp::AllGather)
      return "DDP's constructor checks that every rank's parameters have the same shapes "
             "(_verify_param_shape_across_processes)";
    if (g.iteration < 0 && g.coll == CollectiveOp::Broadcast)
      return "DDP's constructor copies rank 0's parameters to every rank (_sync_module_states)";
    if (g.iteration >= 0 && g.coll == CollectiveOp::Broadcast)
      return "rank 0's gradient order, broadcast to rebuild the buckets in that order";
    for (const BucketView& b : s.buckets)
      if (b.state >= BucketState::Launched && b.owns(static_cast<uint64_t>(g.op.seq))) {
        const char* part = bucket_part_name(s.config.comm_hook.kind, static_cast<int>(static_cast<uint64_t>(g.op.seq) - b.seq), b.collectives);
        return "bucket " + std::to_string(b.index) + "'s " + (b.gathered ? "all-gather" : "all-reduce") +
               (*part ? std::string(" of ") + part : "") + " (" + std::to_string(b.params.size()) +
               (b.params.size() == 1 ? " gradient, " : " gradients, ") + human_bytes(b.bytes) + ")";
      }
  }
  return "";
}

}  // namespace

std::string next_hint(const Snapshot& s) {
  const PendingItem& p = s.held;
  if (!s.error.empty() || s.finished || !s.stepper.paused || !p.valid) return "";
  const GateInfo& g = p.gate;
  const std::string label = g.label.empty() ? gate_kind_name(p.kind) : g.label;
  const std::string iteration = g.iteration < 0 ? "the setup" : "iteration " + std::to_string(g.iteration);
  switch (p.kind) {
    case GateKind::Collective: {
      std::string why = collective_purpose(s, g);
      std::string line = "Next: " + (why.empty() ? label : why + ": " + label) + ".  C runs it whole";
      const CollectiveView& cv = s.collective;
      if (!g.op.p2p && cv.valid && cv.seq == static_cast<uint64_t>(g.op.seq) && cv.steps > 0 && cv.steps_done == 0)
        line += "; R enters it and stops before its step 1 of " + std::to_string(cv.steps);
      return line + "; I runs to the end of " + iteration;
    }
    case GateKind::RingStep: {
      const CollectiveView& cv = s.collective;
      std::string op = label;  // "world #2 allreduce of ... (sum, ring), step 0": the operation
      if (const size_t at = op.rfind(", step "); at != std::string::npos) op.resize(at);
      if (cv.valid && cv.steps > 0)
        return "Next: step " + std::to_string(cv.steps_done + 1) + " of " + std::to_string(cv.steps) +
               (cv.phase == RingPhase::None ? std::string() : std::string(" (") + ring_phase_name(cv.phase) + ")") + " of " + op +
               ".  R runs it; C finishes the collective";
      return "Next: " + label + ".  R runs the next step; C finishes the collective";
    }
    case GateKind::Iteration:
      return "Next: iteration " + std::to_string(g.iteration) + ".  I runs it whole; C stops at its first collective; "
             "F at its first layer" + std::string(s.config.strategy == Strategy::Ddp ? "; B at its first gradient" : "");
    case GateKind::Layer:
      return "Next: " + label + " (" + iteration + ").  F runs it; C runs to the next collective";
    case GateKind::Grad:
      return "Next: " + label + ".  B lands it in its bucket; C runs to the next collective";
    case GateKind::Action:
      return "Next: " + label + " (" + iteration + ").  A runs this time step; C runs to the next collective";
  }
  return "";
}

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

const char* bucket_part_name(CommHook hook, int k, int n) {
  if (hook == CommHook::TopK && n == 2) return k == 0 ? "values" : "indices";
  if (hook == CommHook::PowerSgd && n == 3) return k == 0 ? "whole tensors" : k == 1 ? "P" : "Q";
  return "";
}

void SnapshotBuilder::reset(const RunSources& run) {
  run_ = run;
  const TrainConfig& config = *run.config;
  world_ = config.world_size;
  snap_ = Snapshot{};
  done_ = false;
  epoch_ = 0;
  const int N = world_;
  next_order_.assign(static_cast<size_t>(N), 0);
  issued_.clear();
  newest_seq_.clear();
  coll_done_.clear();
  coll_steps_.clear();
  coll_wall_s_.clear();
  coll_first_order_.clear();
  group_ranks_.clear();
  group_names_.clear();
  shown_seq_ = UINT64_MAX;
  shown_group_ = 0;
  shown_order_ = 0;
  alltoall_.reset();
  bucket_iteration_ = -1;
  ready_counter_ = launch_counter_ = 0;
  data_epoch_ = -1;
  snap_.events.assign(static_cast<size_t>(N), {});
  snap_.memory.assign(static_cast<size_t>(N), RankMemory{});
  param_numel_.clear();
  const Model& model = *run.model;
  for (const auto& p : model.parameters()) {
    snap_.param_names.push_back(p.name);
    param_numel_[p.name] = p.numel;
    param_shape_[p.name] = p.shape;
  }
  RunConfigView& c = snap_.config;
  c.strategy = config.strategy;
  c.model = config.model.str();
  c.data = run.dataset->name;
  c.optimizer = config.optimizer.str();
  c.profile = config.profile;
  c.algo = config.algo;
  c.proto = config.proto;
  c.world = N;
  c.batch = config.batch;
  c.accum = config.accum;
  c.steps = run.total_steps;
  c.device = config.device;
  c.roof = run.roof;
  c.backend = run.backend;
  c.attached = run.attached;
  c.bucket_cap_bytes = config.ddp.bucket_cap_bytes;
  c.first_bucket_bytes = config.ddp.first_bucket_bytes;
  c.find_unused_parameters = config.ddp.find_unused_parameters;
  c.sized_first_iteration = config.ddp.sized_first_iteration;
  c.comm_hook = config.ddp.comm_hook;
  ExpertsView& ex = snap_.experts;
  ex.moe = config.model.is_gpt() && config.moe.on();
  ex.experts = config.moe.experts;
  ex.top_k = config.moe.top_k;
  ex.capacity_factor = config.moe.capacity;
  ex.ep = std::max(1, config.ep);
  ContextView& cx = snap_.context;
  cx = ContextView{};
  cx.cp = config.model.is_gpt() && config.cp > 1;
  cx.degree = std::max(1, config.cp);
  cx.layout = config.cp_layout;
  cx.ctx = config.model.gpt.ctx;
  cx.heads = config.model.gpt.heads / std::max(1, config.tp);
  c.precision = config.precision;
  c.amp = config.amp;
  c.reduce_fp32 = config.reduce_fp32;
  c.settings = changed_settings(config);
  // Read before the run starts (FSDP releases the model's storage then; the counts stay).
  c.sharding = config.strategy == Strategy::Fsdp ? config.fsdp.sharding : Sharding::NoShard;
  c.num_params = model.num_params();
  c.gpt = model.spec().gpt;
  c.activation_checkpointing = config.activation_checkpointing;
  c.lora_rank = config.lora.rank;
  c.frozen_params = model.lora() ? model.spec().num_params() : 0;
  c.optimizer_kind = config.optimizer.kind;
  c.sgd_momentum = config.optimizer.kind == OptimizerKind::SGD && config.optimizer.momentum > 0;
  c.wrap_layers = config.fsdp.wrap_layers;
  c.fsdp_api = config.fsdp.api;
  c.reshard_after_forward = config.fsdp.reshard_after_forward;
  c.largest_unit_params = c.wrap_layers ? 0 : c.num_params;
  if (c.wrap_layers)
    for (int i = 0; i < model.num_layers(); i++) {
      int64_t unit = 0;  // the Linear's trainable parameters (under LoRA its adapters)
      for (int p : model.trainable_of(model.layer(i))) unit += model.parameters()[static_cast<size_t>(p)].numel;
      c.largest_unit_params = std::max(c.largest_unit_params, unit);
    }
  // BACKWARD_PRE holds the next unit's parameters beside this unit's parameters and gradient.
  // (Forward prefetch holds two units' parameters only, no more than one unit in backward.)
  c.units_in_flight = config.fsdp.backward_prefetch == BackwardPrefetch::Pre ? 2 : 1;
  c.node_size = run.node_size;
  snap_.total_steps = c.steps;
  pipeline_.reset(run.pipeline, N, config.tp, snap_.pipeline);
  snap_.pipeline.cp = std::max(config.cp, 1);  // (the plan's dp counts each replica's CP ranks)
  reset_mesh(config, model.spec().gpt, snap_.mesh);
}


void SnapshotBuilder::begin_frame(std::shared_ptr<const ImportedTrace> trace) {
  snap_.frame++;
  snap_.trace = std::move(trace);
}

void SnapshotBuilder::add_events(const TraceRecorder& rec) {
  Snapshot& s = snap_;
  std::vector<Event> fresh;
  int32_t newest_iter = s.iteration;
  for (int r = 0; r < world_; r++) {
    fresh.clear();
    rec.events_since(r, next_order_[static_cast<size_t>(r)], fresh);
    auto& win = s.events[static_cast<size_t>(r)];
    for (const Event& e : fresh) {
      next_order_[static_cast<size_t>(r)] = std::max(next_order_[static_cast<size_t>(r)], e.order + 1);
      ingest(rec, r, e);
      win.push_back(e);
      newest_iter = std::max(newest_iter, e.iteration);
      s.clock_now_model = std::max(s.clock_now_model, e.model_end);
    }
  }
  s.iteration = newest_iter;
  trim_events(newest_iter);
  prune_collectives();
  if (rec.label_count() != s.labels.size()) s.labels = rec.labels();
  s.clock_now_wall_ns = rec.now_ns();
}

// Keep the last few iterations per rank (and never more than a bound).
void SnapshotBuilder::trim_events(int32_t newest_iter) {
  for (auto& win : snap_.events) {
    size_t cut = 0;
    while (cut < win.size() && win[cut].iteration >= 0 && win[cut].iteration < newest_iter - kKeepIterations) cut++;
    if (win.size() - cut > kMaxEventsPerRank) cut = win.size() - kMaxEventsPerRank;
    if (cut) win.erase(win.begin(), win.begin() + static_cast<std::ptrdiff_t>(cut));
  }
}

void SnapshotBuilder::set_stepper(StepperState st) { snap_.stepper = std::move(st); }

// Every second point of what is older than the newest kHistoryExact: a run of any length keeps a
// bounded curve of the whole run, each older stretch at half the resolution of the one after it.
void thin_history(std::vector<StepPoint>& h) {
  if (h.size() <= kHistoryExact) return;
  const size_t old_end = h.size() - kHistoryExact;
  size_t w = 0;
  for (size_t i = 0; i < old_end; i += 2) h[w++] = h[i];
  h.erase(h.begin() + static_cast<std::ptrdiff_t>(w), h.begin() + static_cast<std::ptrdiff_t>(old_end));
}

void SnapshotBuilder::set_reports(const std::vector<StepReport>& fresh, const std::string& error, bool done) {
  Snapshot& s = snap_;
  done_ = done;
  s.running = !done;
  s.error = error;
  for (const StepReport& r : fresh) {
    s.history.push_back({r.step, r.loss, r.accuracy, r.overlap, r.samples_per_sec, r.loss_scale, r.step_skipped, r.samples,
                         r.grad_norm, r.clip_coef});
    s.steps_reported++;
    if (r.step_skipped) s.steps_skipped++, s.last_skipped_step = r.step;
    pipeline_.add_report(r);
  }
  if (s.history.size() >= kHistoryExact + kHistoryThinned) thin_history(s.history);
  if (!fresh.empty()) s.step = fresh.back().step, epoch_ = fresh.back().epoch;
  s.finished = done && s.error.empty();
}

void SnapshotBuilder::set_world_status(const WorldStatus& ws) {
  Snapshot& s = snap_;
  s.compute_activity = ws.compute_activity;
  s.comm_activity = ws.comm_activity;
  // The collective a ring view draws: the oldest one in flight, else the newest that ran.
  s.collective.in_flight = !ws.in_flight.empty();
  if (!ws.in_flight.empty()) {
    const CollectiveStatus& cs = ws.in_flight.front();
    shown_seq_ = cs.seq;
    shown_group_ = 0;
    s.collective.arrived = cs.arrived;
    s.collective.missing = cs.missing;
  } else {
    s.collective.arrived.clear();
    s.collective.missing.clear();
  }
}

// A launched world's status comes per rank (each process knows only itself): the activities and
// memory as they are, and the collective in flight derived from where each comm worker is.
void SnapshotBuilder::set_rank_statuses(const std::vector<RankMonitorStatus>& ranks) {
  Snapshot& s = snap_;
  const int N = world_;
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
  shown_group_ = 0;
  for (int r = 0; r < N; r++) {
    const RankMonitorStatus& st = ranks[static_cast<size_t>(r)];
    (st.current_seq == oldest || st.done_seq >= oldest ? s.collective.arrived : s.collective.missing).push_back(r);
  }
}

void SnapshotBuilder::set_activities(std::vector<std::string> compute, std::vector<std::string> comm) {
  snap_.compute_activity = std::move(compute);
  snap_.comm_activity = std::move(comm);
}

void SnapshotBuilder::set_memory(int rank, const MemoryStats& stats) {
  if (rank >= 0 && rank < static_cast<int>(snap_.memory.size())) snap_.memory[static_cast<size_t>(rank)].stats = stats;
}

void SnapshotBuilder::set_device_memory(int rank, int64_t used, int64_t total) {
  if (rank < 0 || rank >= static_cast<int>(snap_.memory.size())) return;
  RankMemory& m = snap_.memory[static_cast<size_t>(rank)];
  m.device_used = used;
  m.device_total = total;
}

const Snapshot& SnapshotBuilder::finish_frame() {
  hold_stepped_op();
  build_bucket_parts();
  build_collective();
  light_mesh_group();
  alltoall_.build(group_ranks_, group_names_, world_, snap_.held, snap_.alltoall_groups, snap_.alltoall, snap_.alltoall_held);
  const CollectiveView& cv = snap_.collective;
  snap_.topology = build_topology(cv.group != 0 && cv.valid ? in_world_ranks(cv) : cv, run_.cost);
  build_data();
  pipeline_.build(snap_.stepper, snap_.pipeline);
  return snap_;
}

namespace {

bool is_collective_item(const PendingItem& p) {
  return p.valid && (p.kind == GateKind::Collective || p.kind == GateKind::RingStep) && !p.gate.op.p2p && !p.gate.op2.p2p;
}

}  // namespace

// One item at a time, the same in every view: the focus's next item, else the stepper's pending one.
// A collective there is the one the Collective, Ring, Topology and Mesh views show.
void SnapshotBuilder::hold_stepped_op() {
  const StepperState& st = snap_.stepper;
  snap_.held = st.focused.valid ? st.focused : st.pending;
  held_ = is_collective_item(snap_.held);
  if (!held_) {
    // Nothing collective held (a send/recv, a layer): with a rank focus, show the latest collective
    // that rank took part in, so the inspector and the ring agree with the focus.
    if (st.focus_rank < 0 || st.focus_rank >= world_) return;
    const CollKey* best = nullptr;
    uint64_t best_order = 0;
    for (const auto& [k, order] : coll_first_order_) {
      bool member = k.first == 0;
      if (!member)
        if (auto g = group_ranks_.find(k.first); g != group_ranks_.end())
          member = std::find(g->second.begin(), g->second.end(), st.focus_rank) != g->second.end();
      if (member && (!best || order > best_order)) best = &k, best_order = order;
    }
    if (best) shown_group_ = best->first, shown_seq_ = best->second, shown_order_ = best_order;
    return;
  }
  shown_group_ = snap_.held.gate.trace_group;
  shown_seq_ = static_cast<uint64_t>(snap_.held.gate.op.seq);
  snap_.collective.in_flight = true;  // its members are at its gate (or inside it, at a ring step)
  snap_.collective.arrived = snap_.held.arrived;
  snap_.collective.missing = snap_.held.missing;
}

void SnapshotBuilder::light_mesh_group() {
  MeshGroup& g = snap_.mesh.group;
  const PendingItem& h = snap_.held;
  const CollectiveView& cv = snap_.collective;
  g = MeshGroup{};
  if (h.valid && (h.gate.op.p2p || h.gate.op2.p2p)) {  // a held send/recv: its pair (or chain)
    g.valid = true;
    g.name = h.gate.label.substr(0, h.gate.label.find(" ("));
    g.ranks = h.members;
    g.op = h.gate.coll;
    return;
  }
  if (!cv.valid) return;
  g.valid = true;
  g.op = cv.op;
  g.name = cv.group != 0 ? cv.group_name : "the world";
  if (cv.group != 0) g.ranks = cv.members;
  else
    for (int r = 0; r < world_; r++) g.ranks.push_back(r);
}

// ---- events ------------------------------------------------------------------------------------

void SnapshotBuilder::ingest(const TraceRecorder& rec, int rank, const Event& e) {
  const int N = world_;
  switch (e.kind) {
    case EventKind::CollectiveIssue:
      learn_group(rec, e.coll.group);
      note_seq(e.coll.group, e.coll.seq);
      if (!point_to_point(e.coll.op)) issued_.emplace(CollKey{e.coll.group, e.coll.seq}, e.coll);
      break;
    case EventKind::RingStep: {
      const CollKey k{e.step.group, e.step.seq};
      auto& v = coll_steps_[k];
      v.resize(static_cast<size_t>(N), 0);
      v[static_cast<size_t>(rank)] = std::max(v[static_cast<size_t>(rank)], static_cast<int>(e.step.step) + 1);
      show_latest(k, e.order);
      break;
    }
    case EventKind::Collective:
      learn_group(rec, e.coll.group);
      note_seq(e.coll.group, e.coll.seq);
      ingest_collective(rank, e);
      break;
    case EventKind::FsdpUnit: ingest_unit(rec, rank, e.fsdp); break;
    case EventKind::PipelineAction: pipeline_.ingest(rank, e); break;
    default: break;
  }
  if (e.kind == EventKind::CollectiveIssue || e.kind == EventKind::Collective || e.kind == EventKind::RingStep) alltoall_.ingest(rank, e);
  if (rank == 0) ingest_bucket(rec, e);
}

namespace {
constexpr uint64_t kKeptCollectives = 1024;  // per group: far more than one iteration issues

template <class Map>
void erase_seqs(Map& m, int32_t group, uint64_t below) {
  m.erase(m.lower_bound({group, 0}), m.lower_bound({group, below}));
}
}  // namespace

void SnapshotBuilder::prune_collectives() {
  for (const auto& [group, newest] : newest_seq_) {
    if (newest < 2 * kKeptCollectives) continue;
    uint64_t below = newest - kKeptCollectives;
    if (group == shown_group_ && shown_seq_ != UINT64_MAX) below = std::min(below, shown_seq_);
    erase_seqs(issued_, group, below);
    erase_seqs(coll_done_, group, below);
    erase_seqs(coll_steps_, group, below);
    erase_seqs(coll_wall_s_, group, below);
    erase_seqs(coll_first_order_, group, below);
  }
}

// A process group's name and ranks, read once from its label ("tp0: 0,1").
void SnapshotBuilder::learn_group(const TraceRecorder& rec, int32_t group) {
  if (group <= 0 || group_ranks_.count(group)) return;
  std::string name;
  std::vector<int> ranks;
  if (!parse_group_label(rec.label(group - 1), name, ranks)) return;
  for (int r : ranks)
    if (r < 0 || r >= world_) return;
  group_ranks_[group] = std::move(ranks);
  group_names_[group] = std::move(name);
}

// The view follows the newest collective: within one group (or the world) the highest seq, across
// groups the one whose first step or end was recorded last.
void SnapshotBuilder::show_latest(CollKey k, uint64_t order) {
  auto [it, fresh] = coll_first_order_.emplace(k, order);
  if (!fresh) it->second = std::min(it->second, order);
  const bool same = k.first == shown_group_;
  if (shown_seq_ != UINT64_MAX && same && k.second == shown_seq_) {
    shown_order_ = it->second;
    return;
  }
  if (shown_seq_ == UINT64_MAX || (same ? k.second > shown_seq_ : it->second > shown_order_)) {
    shown_group_ = k.first;
    shown_seq_ = k.second;
    shown_order_ = it->second;
  }
}

void SnapshotBuilder::ingest_collective(int rank, const Event& e) {
  const int N = world_;
  if (point_to_point(e.coll.op)) return;
  const CollKey k{e.coll.group, e.coll.seq};
  auto& v = coll_done_[k];
  v.resize(static_cast<size_t>(N), 0);
  v[static_cast<size_t>(rank)] = 1;
  issued_.emplace(k, e.coll);
  if (!coll_wall_s_.count(k) || rank == 0)
    coll_wall_s_[k] = static_cast<double>(e.wall_end_ns - e.wall_begin_ns) * 1e-9;
  if (e.coll.group != 0) {  // a process group's: FSDP units and DDP buckets name the world's
    if (e.coll.group_size > 1 && algorithm_step_count(e.coll.op, e.coll.algo, e.coll.group_size) > 0)
      show_latest(k, e.order);
    return;
  }
  for (UnitView& u : snap_.units) {
    if (u.gathering.size() <= static_cast<size_t>(rank)) continue;
    if (u.gather_seq == e.coll.seq) u.gathering[static_cast<size_t>(rank)] = 0, u.gathered[static_cast<size_t>(rank)] = 1;
    if (u.reduce_seq == e.coll.seq) u.reducing[static_cast<size_t>(rank)] = 0;
  }
  if (e.coll.group_size > 1 && algorithm_step_count(e.coll.op, e.coll.algo, N) > 0) show_latest(k, e.order);
  // A bucket's all-reduce (a hook's last collective for it) finished on rank 0's comm lane.
  if (rank == 0)
    for (BucketView& b : snap_.buckets)
      if ((b.state == BucketState::Launched || b.state == BucketState::AllReducing) && b.owns(e.coll.seq) &&
          e.coll.seq + 1 == b.seq + static_cast<uint64_t>(b.collectives)) {
        b.state = BucketState::Done;
        b.allreduce_begin = e.model_begin;
        b.allreduce_end = e.model_end;
        b.wire_bytes = 0;  // until the reducer's BucketAllReduce says: what each rank put into them
        for (int k = 0; k < b.collectives; k++)
          if (auto it = issued_.find(CollKey{0, b.seq + static_cast<uint64_t>(k)}); it != issued_.end())
            b.wire_bytes += it->second.in_count * dtype_size(it->second.dtype);
      }
}

void SnapshotBuilder::ingest_unit(const TraceRecorder& rec, int rank, const FsdpInfo& f) {
  const size_t N = static_cast<size_t>(world_), r = static_cast<size_t>(rank);
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
    u.post_forward.assign(N, 0);
  }
  u.state[r] = f.state;
  switch (f.verb) {
    case FsdpVerb::Layout:
      u.numel = f.numel;
      u.chunk = f.chunk;
      u.shard_world = f.shard_world;
      if (u.names.empty()) {
        int64_t at = 0;
        for (const std::string& name : split_names(rec.label(f.label))) {
          auto it = param_numel_.find(name);
          const int64_t n = it == param_numel_.end() ? 0 : it->second;
          u.names.push_back(name);
          auto sh = param_shape_.find(name);
          u.shapes.push_back(sh == param_shape_.end() ? Shape{n} : sh->second);
          u.offsets.push_back(at);
          u.sizes.push_back(n);
          at += n;
        }
        // An MoE block's experts under --ep: their own unit, sharded over the ranks holding them.
        u.experts = snap_.experts.ep > 1 && !u.names.empty() && u.names.front().find(".mlp.experts.") != std::string::npos;
        u.owner_stride = u.experts ? snap_.experts.ep : std::max(1, snap_.mesh.shape.tp);
      }
      lay_out_replicated_units();
      break;
    case FsdpVerb::Unshard:
      u.gathering[r] = 1;
      if (f.seq != UINT64_MAX) u.gather_seq = f.seq;
      break;
    case FsdpVerb::Unsharded: u.gathering[r] = 0, u.gathered[r] = 1, u.post_forward[r] = 0; break;
    case FsdpVerb::Reshard:
      u.gathered[r] = 0;
      u.post_forward[r] = f.seq != UINT64_MAX ? static_cast<int16_t>(f.seq) : 0;
      break;
    case FsdpVerb::ReduceGrad:
      u.reducing[r] = 1;
      if (f.seq != UINT64_MAX) u.reduce_seq = f.seq;
      break;
    case FsdpVerb::GradReduced: u.reducing[r] = 0; break;
    case FsdpVerb::State: break;  // the state above is all it says
  }
}

void SnapshotBuilder::lay_out_replicated_units() {
  auto& units = snap_.units;
  const Sharding sh = snap_.config.sharding;
  if (snap_.config.fsdp_api != 1 || (sh != Sharding::NoShard && sh != Sharding::Zero1)) return;
  for (const UnitView& u : units)
    if (u.state.empty() || u.numel == 0) return;  // a unit not laid out yet
  const size_t N = static_cast<size_t>(world_);
  // ZeRO-1 splits the concatenation of a group's units (the FSDP group's, and under --ep each block's
  // experts over the ranks holding them) in chunks of ceil(n / group size); rank r steps chunk
  // owned_chunk(r). The units are in flat order, so a group's concatenation is its units in order.
  int64_t total[2] = {0, 0};
  for (const UnitView& u : units) total[u.experts] += u.numel;
  int64_t before[2] = {0, 0};
  for (UnitView& u : units) {
    const int g = u.experts;
    u.steps.assign(N, {0, 0});
    const int K = std::max(1, u.shard_world);
    const int64_t chunk = (total[g] + K - 1) / K;
    for (size_t r = 0; r < N; r++) {
      if (sh == Sharding::NoShard) {
        u.steps[r] = {0, u.numel};
        continue;
      }
      const int64_t lo = u.owned_chunk(static_cast<int>(r)) * chunk, hi = std::min(total[g], lo + chunk);
      const int64_t a = std::max(lo, before[g]), b = std::min(hi, before[g] + u.numel);
      if (a < b) u.steps[r] = {a - before[g], b - before[g]};
    }
    before[g] += u.numel;
  }
}

void SnapshotBuilder::ingest_bucket(const TraceRecorder& rec, const Event& e) {
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
      b.gathered = snap_.config.comm_hook.kind == CommHook::TopK;
      const auto& params = run_.model->parameters();
      for (const std::string& name : split_names(rec.label(e.bucket.label))) {
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
          b.collectives = 1;
          b.parts.clear();
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
        b.collectives = std::max(1, e.bucket.collectives);
        // The comm worker may already have finished it (its Collective event came first).
        auto it = coll_done_.find(CollKey{0, e.bucket.seq + static_cast<uint64_t>(b.collectives) - 1});
        b.state = it != coll_done_.end() && !it->second.empty() && it->second[0] ? BucketState::Done : BucketState::Launched;
      } else {
        b.state = BucketState::Done;
        b.allreduce_begin = e.model_begin;
        b.allreduce_end = e.model_end;
        b.wire_bytes = e.bucket.bytes;
      }
      break;
    }
    default: break;
  }
}

// ---- the shown collective ------------------------------------------------------------------------

void SnapshotBuilder::build_collective() {
  CollectiveView& cv = snap_.collective;
  const CollKey key{shown_group_, shown_seq_};
  auto it = issued_.find(key);
  const auto members = group_ranks_.find(shown_group_);
  if (shown_seq_ == UINT64_MAX || it == issued_.end() || (shown_group_ != 0 && members == group_ranks_.end())) {
    cv.valid = false;
    return;
  }
  const CollectiveInfo& info = it->second;
  cv.valid = true;
  cv.seq = shown_seq_;
  cv.group = shown_group_;
  cv.members = shown_group_ != 0 ? members->second : std::vector<int>{};
  cv.group_name = shown_group_ != 0 ? group_names_[shown_group_] : std::string();
  cv.world_size = world_;
  // A group's collective is drawn in group ranks: its own ring of members.
  const int N = shown_group_ != 0 ? static_cast<int>(cv.members.size()) : world_;
  auto to_group = [&](const std::vector<int>& per_rank) {
    if (shown_group_ == 0) return per_rank;
    std::vector<int> v(static_cast<size_t>(N), 0);
    for (int i = 0; i < N; i++) {
      const size_t g = static_cast<size_t>(cv.members[static_cast<size_t>(i)]);
      v[static_cast<size_t>(i)] = g < per_rank.size() ? per_rank[g] : 0;
    }
    return v;
  };
  cv.op = info.op;
  cv.algo = info.algo;
  cv.proto = info.proto;
  cv.dtype = info.dtype;
  cv.reduce = info.reduce;
  cv.root = info.root;
  cv.world = N;
  cv.count = info.in_count;
  cv.bytes = info.bytes;
  cv.node_size = run_.cost ? run_.cost->profile().gpus_per_node : 0;
  cv.steps = algorithm_step_count(info.op, info.algo, N, cv.node_size);
  auto st = coll_steps_.find(key);
  cv.rank_steps_done = to_group(st != coll_steps_.end() ? st->second : std::vector<int>(static_cast<size_t>(world_), 0));
  cv.rank_steps_done.resize(static_cast<size_t>(N), 0);
  auto done = coll_done_.find(key);
  std::vector<int> done_ranks = to_group(done != coll_done_.end() ? done->second : std::vector<int>{});
  bool all_done = done_ranks.size() == static_cast<size_t>(N) &&
                  std::all_of(done_ranks.begin(), done_ranks.end(), [](int d) { return d != 0; });
  if (all_done) std::fill(cv.rank_steps_done.begin(), cv.rank_steps_done.end(), cv.steps);
  cv.steps_done = *std::min_element(cv.rank_steps_done.begin(), cv.rank_steps_done.end());
  // The world's status says which world collective is in flight; a group's is in flight from its
  // first step until every member finished. One the stepper holds says who arrived at its gate.
  if (shown_group_ != 0 && !held_) {
    cv.in_flight = !all_done && st != coll_steps_.end();
    cv.arrived.clear();
    cv.missing.clear();
  }
  cv.in_flight = cv.in_flight && !all_done;
  cv.opaque = run_.config->backend == "nccl";
  cv.schematic_step = -1;
  if (cv.opaque && cv.in_flight && cv.steps > 0) {  // two schematic steps a second
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    cv.schematic_step = static_cast<int>(static_cast<int64_t>(t * 2.0) % cv.steps);
  }
  const int shown_step = cv.schematic_step >= 0 ? cv.schematic_step : cv.steps_done;
  cv.last = algorithm_step_plan(cv.op, cv.algo, N, cv.root, shown_step - 1, cv.node_size);
  cv.pending = algorithm_step_plan(cv.op, cv.algo, N, cv.root, shown_step, cv.node_size);
  const auto& ph = cv.pending.empty() ? cv.last : cv.pending;
  cv.phase = ph.empty() ? RingPhase::None : ph.front().phase;
  auto wall = coll_wall_s_.find(key);
  cv.measured_s = all_done && wall != coll_wall_s_.end() ? wall->second : -1;
  label_collective(all_done);
  // Cost model prediction.
  if (const CostModel* cm = run_.cost) {
    cv.predicted_s = cv.group != 0 ? group_time(cv, *cm) : cm->collective_time(cv.op, cv.algo, static_cast<double>(cv.bytes));
    cv.algbw_gbs = cv.predicted_s > 0 ? static_cast<double>(cv.bytes) / cv.predicted_s / 1e9 : 0;
    cv.busbw_gbs = cv.algbw_gbs * bus_bandwidth_factor(cv.op, N, cv.algo);
    // The run forced the algorithm unless it is an all-reduce under --algo auto.
    const bool tuned = cv.op == CollectiveOp::AllReduce && snap_.config.algo == Algorithm::Default;
    cv.why = explain(cm->profile(), N, cv.op, static_cast<double>(cv.bytes), tuned ? Algorithm::Default : cv.algo,
                     snap_.config.proto);
  }
  fill_cells();
  if (all_done && cv.op == CollectiveOp::AllReduce)
    for (auto& row : cv.cells) std::fill(row.begin(), row.end(), N);
}

// A bucket's several collectives under a comm hook: each one's bytes once issued, and whether rank 0
// finished it.
void SnapshotBuilder::build_bucket_parts() {
  for (BucketView& b : snap_.buckets) {
    b.parts.clear();
    if (b.collectives < 2 || b.launch_order < 0) continue;
    for (int k = 0; k < b.collectives; k++) {
      BucketCollective c;
      c.seq = b.seq + static_cast<uint64_t>(k);
      if (auto it = issued_.find(CollKey{0, c.seq}); it != issued_.end()) c.bytes = it->second.in_count * dtype_size(it->second.dtype);
      auto done = coll_done_.find(CollKey{0, c.seq});
      c.done = done != coll_done_.end() && !done->second.empty() && done->second[0];
      b.parts.push_back(c);
    }
  }
}

// What the collective is for (a DDP bucket, DataParallel, an FSDP unit, a process group), and the
// bucket it moves.
void SnapshotBuilder::label_collective(bool all_done) {
  CollectiveView& cv = snap_.collective;
  cv.label.clear();
  if (cv.group != 0) return;  // buckets and units name the world's collectives; views name the group
  for (const BucketView& b : snap_.buckets)
    if (b.owns(cv.seq) && b.seq != 0) {
      std::string names;
      for (const BucketParam& p : b.params) names += (names.empty() ? "" : ", ") + p.name;
      const char* part = bucket_part_name(snap_.config.comm_hook.kind, static_cast<int>(cv.seq - b.seq), b.collectives);
      cv.label = "DDP bucket " + std::to_string(b.index) + (*part ? std::string(" (") + part + ")" : "") + ": " + names;
    }
  if (run_.config->strategy == Strategy::Dp) {  // DataParallel's only collectives: replicate and ReduceAddCoalesced
    if (cv.op == CollectiveOp::Broadcast) cv.label = "DataParallel replicate: every parameter from rank 0";
    if (cv.op == CollectiveOp::Reduce) cv.label = "DataParallel backward: every gradient reduce-added onto rank 0";
  }
  for (const UnitView& u : snap_.units) {
    if (u.gather_seq != cv.seq && u.reduce_seq != cv.seq) continue;
    std::string names;
    for (const std::string& n : u.names) names += (names.empty() ? "" : ", ") + n;
    cv.label = "FSDP unit " + std::to_string(u.index) + (u.gather_seq == cv.seq ? " unshard: " : " gradient: ") + names;
  }
  // A launched bucket whose all-reduce has ranks in it (or steps done) is on the wire; held at its
  // issue gate by the stepper, it is launched but not yet on the wire.
  const bool at_issue_gate = held_ && snap_.held.kind == GateKind::Collective && cv.steps_done == 0;
  for (BucketView& b : snap_.buckets)
    if (b.state == BucketState::Launched && b.owns(cv.seq) && (cv.in_flight || cv.steps_done > 0) && !all_done && !at_issue_gate)
      b.state = BucketState::AllReducing;
}

// Buffer cells from the steps every rank finished: what each chunk holds follows from the
// algorithm's schedule (a ring reduce-scatter step s leaves s + 2 contributions in the chunk it
// received; an all-gather step leaves a final chunk).
void SnapshotBuilder::fill_cells() {
  CollectiveView& cv = snap_.collective;
  const int N = cv.world;  // the group's size for a group's collective
  if (planned_chunks(cv.algo, N, cv.node_size) > 0) return fill_planned_cells();
  const bool ringy = ring_chunked(cv.op, cv.algo);
  cv.chunks = ringy || cv.op == CollectiveOp::AllToAll ? N : 1;
  cv.cells.assign(static_cast<size_t>(N), std::vector<int>(static_cast<size_t>(cv.chunks), 1));
  if (cv.op == CollectiveOp::AllGather || cv.op == CollectiveOp::AllToAll) {  // each rank holds its own chunk
    for (int r = 0; r < N; r++)
      for (int c = 0; c < N; c++) cv.cells[static_cast<size_t>(r)][static_cast<size_t>(c)] = c == r ? N : 0;
  }
  if (cv.op == CollectiveOp::Broadcast)
    for (int r = 0; r < N; r++) cv.cells[static_cast<size_t>(r)][0] = r == cv.root ? N : 0;
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
}

// The double binary tree, hierarchical and in-network all-reduces: cells are the finest chunks
// any of their transfers moves (2K, G x N = world, K), and what each holds follows from replaying
// the plan's transfers over the steps each receiver finished (a reduce adds the sender's count, a
// copy or the switch's answer brings the final value).
void SnapshotBuilder::fill_planned_cells() {
  CollectiveView& cv = snap_.collective;
  const int N = cv.world, F = planned_chunks(cv.algo, N, cv.node_size);
  cv.chunks = F;
  cv.cells.assign(static_cast<size_t>(N), std::vector<int>(static_cast<size_t>(F), 1));
  for (int s = 0; s < cv.steps; s++) {
    const std::vector<std::vector<int>> before = cv.cells;  // a step's transfers read what was there before it
    for (const StepTransfer& t : algorithm_step_plan(cv.op, cv.algo, N, cv.root, s, cv.node_size)) {
      if (t.dst < 0 || cv.rank_steps_done[static_cast<size_t>(t.dst)] <= s) continue;
      const auto [lo, hi] = fine_chunks(t, F);
      for (int c = lo; c < hi; c++) {
        int& held = cv.cells[static_cast<size_t>(t.dst)][static_cast<size_t>(c)];
        if (t.src == kNetworkSwitch || !t.reduce) held = t.src == kNetworkSwitch ? N : before[static_cast<size_t>(t.src)][static_cast<size_t>(c)];
        else held += before[static_cast<size_t>(t.src)][static_cast<size_t>(c)];
      }
    }
  }
}

// ---- the data view -----------------------------------------------------------------------------

void SnapshotBuilder::build_data() {
  DataView& d = snap_.data;
  const Dataset& ds = *run_.dataset;
  if (!d.valid) {
    d.valid = true;
    d.name = ds.name;
    d.n = ds.n;
    d.classes = static_cast<int>(ds.num_classes);
    // Token data (the GPT's windows of text) has no points to plot: xy and label stay empty.
    d.xy.resize(ds.is_tokens() ? 0 : static_cast<size_t>(2 * ds.n));
    d.label.resize(ds.is_tokens() ? 0 : static_cast<size_t>(ds.n));
    for (int64_t i = 0; i < (ds.is_tokens() ? 0 : ds.n); i++) {
      d.xy[static_cast<size_t>(2 * i)] = ds.x[static_cast<size_t>(i * ds.d)];
      d.xy[static_cast<size_t>(2 * i + 1)] = ds.d > 1 ? ds.x[static_cast<size_t>(i * ds.d + 1)] : 0.0f;
      d.label[static_cast<size_t>(i)] = static_cast<int32_t>(ds.y[static_cast<size_t>(i)]);
    }
    name_data_owners();
  }
  const int64_t shown = data_set_epoch_ ? epoch_ : 0;  // without set_epoch every epoch repeats epoch 0's order
  d.epoch = epoch_;
  if (shown == data_epoch_ && data_set_epoch_ == data_set_epoch_built_) return;
  data_epoch_ = shown;
  data_set_epoch_built_ = data_set_epoch_;
  d.set_epoch = data_set_epoch_;
  d.owner.assign(static_cast<size_t>(ds.n), -1);
  const TrainConfig& config = *run_.config;
  if (config.strategy == Strategy::Dp) {
    assign_dp_owners(shown);
    return;
  }
  // The sampler splits over the data-parallel replicas (engine/train/train.cpp, RankBatches).
  const int N = static_cast<int>(d.owners.size());
  for (int r = N - 1; r >= 0; r--) {  // lower replicas win for padded duplicates
    DistributedSampler sampler(rank_sampler_config(config, ds.n, N, r));
    sampler.set_epoch(shown);
    for (int64_t i : sampler.indices()) d.owner[static_cast<size_t>(i)] = static_cast<int16_t>(r);
  }
}

// The owners the data view colors: DataParallel's devices and plain replicas (DDP, FSDP) are ranks;
// in a mesh a replica is all the ranks that share its batches, its TP group and every pipeline stage.
void SnapshotBuilder::name_data_owners() {
  DataView& d = snap_.data;
  const MeshShape& mesh = snap_.mesh.shape;
  const bool dp = run_.config->strategy == Strategy::Dp;
  d.by_replica = !dp && mesh.dp < mesh.world();
  d.owners.clear();
  for (int r = 0; r < (dp ? run_.config->world_size : mesh.dp); r++) {
    if (d.by_replica) d.owners.push_back({"replica " + std::to_string(r), rank_runs_text(mesh_ranks_at(mesh, MeshDim::DP, r))});
    else d.owners.push_back({"rank " + std::to_string(r), ""});
  }
}

// DataParallel: rank 0's one loader (no DistributedSampler split) cuts its order into batches of
// batch x world; torch.chunk gives each device its piece of every batch.
void SnapshotBuilder::assign_dp_owners(int64_t shown) {
  const TrainConfig& config = *run_.config;
  DataView& d = snap_.data;
  DistributedSampler sampler(rank_sampler_config(config, run_.dataset->n, 1, 0));
  sampler.set_epoch(shown);
  const std::vector<int64_t> order = sampler.indices();
  const int64_t G = config.batch * config.world_size;
  for (int64_t p = 0; p < static_cast<int64_t>(order.size()); p++) {
    const int64_t rows = std::min(G, static_cast<int64_t>(order.size()) - p / G * G);
    if (config.drop_last && rows < G) break;
    const std::vector<int64_t> pieces = chunk_sizes(rows, config.world_size);
    int64_t at = p % G, r = 0;
    while (at >= pieces[static_cast<size_t>(r)]) at -= pieces[static_cast<size_t>(r++)];
    d.owner[static_cast<size_t>(order[static_cast<size_t>(p)])] = static_cast<int16_t>(r);
  }
}

}  // namespace dtlab::app
