// The live-figure vocabulary: each figure's name, arguments, one line of help and how it is read
// from the Snapshot (or computed by the engine's planner, step plans, cost model and schedules).
#include "app/figure_table.h"
#include "app/mesh_figures.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "engine/comm/plan.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/parallel/sizing.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/tuning.h"

namespace dtlab::app {

namespace {

[[noreturn]] void throw_sentence(const std::string& sentence) { throw Error(sentence); }

int index_of(const Arg& a, size_t size, const char* what) {
  const double v = a.num;
  if (v != std::floor(v) || v < 0 || v >= static_cast<double>(size))
    throw_sentence(std::string(what) + " " + format_figure(v) + " does not exist (there " + (size == 1 ? "is " : "are ") +
         std::to_string(size) + ")");
  return static_cast<int>(v);
}

// A count a formula sizes its work by (ranks, stages, micro-batches, chunks): a whole number in
// [lo, hi], so a lesson cannot make it allocate without bound or overflow an int.
int count_arg(const Arg& a, const char* what, int lo, int hi) {
  if (!(a.num >= lo && a.num <= hi) || a.num != std::floor(a.num))
    throw_sentence(std::string(what) + " " + format_figure(a.num) + " is not a whole number from " + std::to_string(lo) + " to " +
         std::to_string(hi));
  return static_cast<int>(a.num);
}

// The imported trace (dtlab --open, or a lesson's `open:`), fully loaded.
const ImportedTrace& trace(const Snapshot& s) {
  if (!s.trace) throw_sentence("no trace is open; open one with --open DIR (or a lesson's open: line) and wait for it to load");
  return *s.trace;
}

const TraceCollective& trace_collective(const Snapshot& s, const Arg& k) {
  const ImportedTrace& t = trace(s);
  if (t.collectives.empty()) throw_sentence("the open trace has no collective every rank took part in");
  return t.collectives[static_cast<size_t>(index_of(k, t.collectives.size(), "collective"))];
}

const RankBreakdown& trace_rank(const Snapshot& s, const Arg& r) {
  const ImportedTrace& t = trace(s);
  return t.breakdown[static_cast<size_t>(index_of(r, t.breakdown.size(), "rank"))];
}

// Index of bucket B's all-reduce in the I-th profiled iteration (0-based, rank 0's ProfilerStep order).
int trace_bucket_collective(const Snapshot& s, const Arg& i, const Arg& b) {
  const ImportedTrace& t = trace(s);
  if (t.ranks.empty() || t.ranks[0].steps.empty()) throw_sentence("the open trace marks no iterations (no ProfilerStep#N)");
  const int number = index_of(i, t.ranks[0].steps.size(), "iteration");
  int buckets = 0;
  for (size_t k = 0; k < t.collectives.size(); k++)
    if (t.collectives[k].iteration == number && t.collectives[k].bucket >= 0) {
      if (t.collectives[k].bucket == b.num) return static_cast<int>(k);
      buckets++;
    }
  throw_sentence("bucket " + format_figure(b.num) + " does not exist in that iteration (it has " + std::to_string(buckets) + ")");
}

// The rank with the most of `field` (ties: the lowest rank).
double trace_argmax(const Snapshot& s, double RankBreakdown::*field) {
  const ImportedTrace& t = trace(s);
  int best = 0;
  for (size_t r = 1; r < t.breakdown.size(); r++)
    if (t.breakdown[r].*field > t.breakdown[static_cast<size_t>(best)].*field) best = static_cast<int>(r);
  return best;
}

const PendingItem& held(const Snapshot& s) {
  if (!s.held.valid) throw_sentence("the stepper holds nothing now: pause the run (or step it) first");
  return s.held;
}

// The word a lesson names what the stepper holds by (held.is).
std::string held_kind(const PendingItem& p) {
  switch (p.kind) {
    case GateKind::Collective: return p.gate.op.p2p || p.gate.op2.p2p ? "send" : "collective";
    case GateKind::RingStep: return "ring";
    case GateKind::Layer: return "layer";
    case GateKind::Grad: return "bucket";
    case GateKind::Action: return "action";
    case GateKind::Iteration: return "iteration";
  }
  return "";
}

const CollectiveView& collective(const Snapshot& s) {
  if (!s.collective.valid) throw_sentence("no collective has run yet");
  return s.collective;
}

const BucketView& bucket(const Snapshot& s, const Arg& i) {
  if (s.buckets.empty()) throw_sentence("this run has no DDP buckets yet");
  return s.buckets[static_cast<size_t>(index_of(i, s.buckets.size(), "bucket"))];
}

const MemoryStats& memory(const Snapshot& s, const Arg& r) {
  return s.memory[static_cast<size_t>(index_of(r, s.memory.size(), "rank"))].stats;
}

const UnitView& unit(const Snapshot& s, const Arg& i) {
  if (s.units.empty()) throw_sentence("this run has no FSDP units");
  return s.units[static_cast<size_t>(index_of(i, s.units.size(), "unit"))];
}

const PipelineRankView& pipe_rank(const Snapshot& s, const Arg& r) {
  if (!s.pipeline.valid) throw_sentence("this run is not a pipeline; use --strategy pipeline");
  return s.pipeline.ranks[static_cast<size_t>(index_of(r, s.pipeline.ranks.size(), "rank"))];
}

const StepPoint& step_point(const Snapshot& s, const Arg& k) {
  for (const StepPoint& p : s.history)
    if (static_cast<double>(p.step) == k.num) return p;
  if (k.num >= 1 && k.num <= static_cast<double>(s.steps_reported))  // thinned out of a long run's history
    throw_sentence("step " + format_figure(k.num) + " is no longer kept: the lab keeps every step of the newest " +
                   std::to_string(kHistoryExact) + " and fewer before them; ask for a later step");
  throw_sentence("step " + format_figure(k.num) + " has not run (" + std::to_string(s.steps_reported) + " steps so far)");
}

// Step K of a run that clips its gradients.
const StepPoint& clip_point(const Snapshot& s, const Arg& k) {
  const StepPoint& p = step_point(s, k);
  if (p.grad_norm < 0) throw_sentence("this run does not clip its gradients; add --clip-grad-norm MAX");
  return p;
}

const StepPoint& last_step(const Snapshot& s) {
  if (s.history.empty()) throw_sentence("no optimizer step has run yet");
  return s.history.back();
}

// fp16: rank R's GradScaler decision in iteration I (its LossScale event, in the recent window).
const LossScaleInfo& loss_scale_event(const Snapshot& s, const Arg& r, const Arg& i) {
  if (s.config.precision != Precision::FP16) throw_sentence("this run has no loss scaler; train with --precision fp16");
  const int rank = index_of(r, s.events.size(), "rank");
  for (const Event& e : s.events[static_cast<size_t>(rank)])
    if (e.kind == EventKind::LossScale && static_cast<double>(e.iteration) == i.num) return e.scaler;
  throw_sentence("rank " + std::to_string(rank) + " has no loss-scale decision for iteration " + format_figure(i.num) +
       " (not run yet, or older than the last few iterations)");
}

// Bytes rank `rank` sent (or received) in the world's collective #seq so far, from the engine's step events.
double collective_bytes(const Snapshot& s, uint64_t seq, int rank, bool sent) {
  int64_t b = 0;
  for (size_t r = 0; r < s.events.size(); r++)
    for (const Event& e : s.events[r])
      if (e.kind == EventKind::RingStep && e.step.seq == seq && e.step.group == 0 &&
          (sent ? e.step.src == rank : static_cast<int>(r) == rank))
        b += e.step.bytes;
  return static_cast<double>(b);
}

// Rank 0's events of iteration `iter` that `keep` accepts (the snapshot keeps the last few iterations).
template <class Keep>
double count_events(const Snapshot& s, double iter, Keep keep) {
  if (s.events.empty()) return 0;
  return static_cast<double>(std::count_if(s.events[0].begin(), s.events[0].end(), [&](const Event& e) {
    return static_cast<double>(e.iteration) == iter && keep(e);
  }));
}

// The watchdog's diagnosis names who arrived and who is missing: "ranks 0, 1 arrived (in that
// order); ranks 2, 3 missing".
std::vector<int> diagnosed_ranks(const Snapshot& s, bool missing) {
  const std::string& e = s.error;
  size_t at = missing ? e.find(" missing") : e.find(" arrived (in that order)");
  if (at == std::string::npos) return {};
  size_t from = missing ? e.rfind("; rank", at) : e.rfind(": ranks ", at);
  if (from == std::string::npos) return {};
  std::vector<int> out;
  for (size_t i = from; i < at; i++)
    if (std::isdigit(static_cast<unsigned char>(e[i]))) {
      size_t j = i;
      while (j < at && std::isdigit(static_cast<unsigned char>(e[j]))) j++;
      out.push_back(std::stoi(e.substr(i, j - i)));
      i = j;
    }
  return out;
}

// The latest iteration every rank has finished (its Iteration event is recorded at its end); the
// traffic figures read that one, whole.
int32_t last_finished_iteration(const Snapshot& s) {
  int32_t last = INT32_MAX;
  for (const auto& rank_events : s.events) {
    int32_t mine = -1;
    for (const Event& e : rank_events)
      if (e.kind == EventKind::Iteration) mine = std::max(mine, e.iteration);
    last = std::min(last, mine);
  }
  if (s.events.empty() || last < 0) throw_sentence("no iteration has finished on every rank yet");
  return last;
}

// Bytes each rank sent to each rank in iteration `it`, [src][dst]: the steps of collectives on the
// world (recorded by the receiver) and point-to-point sends, which is what a process group's
// collectives (HYBRID_SHARD's node and replica groups) are made of.
std::vector<std::vector<double>> traffic_matrix(const Snapshot& s, int32_t it) {
  const size_t n = s.events.size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n, 0.0));
  for (size_t r = 0; r < n; r++)
    for (const Event& e : s.events[r]) {
      if (e.iteration != it) continue;
      if (e.kind == EventKind::RingStep && e.step.src >= 0 && static_cast<size_t>(e.step.src) < n)
        m[static_cast<size_t>(e.step.src)][r] += static_cast<double>(e.step.bytes);
      else if (e.kind == EventKind::Collective && e.coll.op == CollectiveOp::Send && e.coll.root >= 0 &&
               static_cast<size_t>(e.coll.root) < n)
        m[r][static_cast<size_t>(e.coll.root)] += static_cast<double>(e.coll.bytes);
    }
  return m;
}

// Bytes rank `from` (every rank: -1) sent to ranks on another node of the run's hardware profile.
double cross_node_bytes(const Snapshot& s, int from) {
  const auto m = traffic_matrix(s, last_finished_iteration(s));
  const CostModel cost(find_profile(s.config.profile), static_cast<int>(m.size()));
  double b = 0;
  for (size_t i = 0; i < m.size(); i++)
    for (size_t j = 0; j < m.size(); j++)
      if ((from < 0 || static_cast<int>(i) == from) && cost.node_of(static_cast<int>(i)) != cost.node_of(static_cast<int>(j)))
        b += m[i][j];
  return b;
}

// The Experts view's routing (Session::read_experts), read each time the world stands still.
const ExpertsView& experts(const Snapshot& s) {
  if (!s.experts.moe) throw_sentence("this run has no mixture of experts; start a GPT with --moe experts=E,top_k=K");
  if (!s.experts.read)
    throw_sentence("the routing is read when the run stands still after a forward (and not from an attached run); step or pause it first");
  if (!s.experts.current)
    throw_sentence("the routing was read at step " + std::to_string(s.experts.at_step) +
                   " and the run has moved on since; pause or step it, and the lab reads every rank's router again");
  return s.experts;
}

// The Context view's chunks and ring passes (Session::read_context), read each time the world stands still.
const ContextView& context(const Snapshot& s) {
  if (!s.context.cp) throw_sentence("this run keeps every sample's sequence on each rank; start a GPT with --strategy ddp --world N --cp N");
  if (!s.context.read) throw_sentence("the CP ranks' ring passes are read when the run stands still; step or pause it first");
  return s.context;
}

// Rank R's latest ring pass of block L (its forward, or its backward once that ran): ring and zigzag only.
const ContextPassView& cp_pass_of(const Snapshot& s, const Arg& r, const Arg& l) {
  const ContextView& x = context(s);
  if (x.layout == CpLayout::Ulysses)
    throw_sentence("Ulysses runs attention whole over an all-to-all, with no ring steps; use --cp-layout ring or zigzag");
  const ContextRankView& v = x.ranks[static_cast<size_t>(index_of(r, x.ranks.size(), "rank"))];
  const ContextPassView& p = v.passes[static_cast<size_t>(index_of(l, v.passes.size(), "block"))];
  if (!p.valid) throw_sentence("rank " + format_figure(r.num) + " ran no ring pass of block " + format_figure(l.num) + " yet; step into its attention first");
  return p;
}

// Rank R's MoE block L (the GPT's block number) in its last forward.
const ExpertsBlockView& moe_block(const Snapshot& s, const Arg& r, const Arg& l) {
  const ExpertsView& x = experts(s);
  const auto& blocks = x.ranks[static_cast<size_t>(index_of(r, x.ranks.size(), "rank"))];
  std::vector<std::string> names;
  for (const ExpertsBlockView& b : blocks) {
    if (b.layer == l.num) return b;
    names.push_back(std::to_string(b.layer));
  }
  throw_sentence("rank " + format_figure(r.num) + " has no MoE block " + format_figure(l.num) + " in its last forward" +
                 (names.empty() ? std::string(" (it ran none yet)") : " (its MoE blocks: " + join(names, ", ") + ")"));
}

int64_t moe_expert(const Snapshot& s, const Arg& e) { return index_of(e, static_cast<size_t>(experts(s).experts), "expert"); }

// Rows each rank's experts computed in block L's last forward: the kept (token, expert) pairs of
// every rank whose tokens they serve (its EP group under --ep, else itself), by expert ownership.
// Ranks that do not run block L (another pipeline stage's) are left out: NaN.
std::vector<double> moe_rows(const Snapshot& s, const Arg& l) {
  const ExpertsView& x = experts(s);
  std::vector<double> rows(x.ranks.size(), std::nan(""));
  bool any = false;
  for (size_t r = 0; r < x.ranks.size(); r++)
    for (const ExpertsBlockView& b : x.ranks[r]) {
      if (b.layer != l.num) continue;
      any = true;
      for (int64_t e = 0; e < x.experts; e++) {
        const size_t owner = static_cast<size_t>(x.owner(static_cast<int>(r), e));
        if (owner >= rows.size()) continue;
        if (std::isnan(rows[owner])) rows[owner] = 0;
        rows[owner] += static_cast<double>(b.kept[static_cast<size_t>(e)]);
      }
    }
  if (!any) moe_block(s, Arg{0, "", false}, l);  // says which blocks there are
  return rows;
}

// The ranks' rows without the ones that do not run the block.
std::vector<double> moe_rows_run(const Snapshot& s, const Arg& l) {
  std::vector<double> rows = moe_rows(s, l);
  rows.erase(std::remove_if(rows.begin(), rows.end(), [](double v) { return std::isnan(v); }), rows.end());
  return rows;
}

// The All-to-all view's all-to-all unless a group is picked there (the held operation's group's newest,
// else the newest of all), and group member `r` of it named by its global rank.
const AllToAllView& alltoall(const Snapshot& s) {
  if (!s.alltoall.valid) throw_sentence("no all-to-all has been issued yet (an --ep run's MoE blocks issue them in forward and backward)");
  return s.alltoall;
}
int alltoall_member(const AllToAllView& a, const Arg& r) {
  const auto it = std::find(a.members.begin(), a.members.end(), static_cast<int>(r.num));
  if (r.num != std::floor(r.num) || it == a.members.end())
    throw_sentence("rank " + format_figure(r.num) + " is not in the all-to-all's group (" +
                   (a.group_name.empty() ? std::string("the world") : a.group_name) + ")");
  return static_cast<int>(it - a.members.begin());
}

// Float32 values rank `rank`'s file holds in a --save-sharded of this run, by the engine's rule
// (FullyShardedDataParallel::owned_slices): a sharded strategy saves each unit's shard without its
// zero padding, and under HYBRID_SHARD only the first node group writes (the others hold copies);
// NO_SHARD and ZeRO-1 save the rank's ZeRO-1 slice of the flat parameters.
double checkpoint_elements(const Snapshot& s, int rank) {
  const RunConfigView& c = s.config;
  if (c.strategy != Strategy::Fsdp) throw_sentence("--save-sharded saves FSDP runs; this run's strategy is " + std::string(strategy_name(c.strategy)));
  // A --tp run's file holds FSDP's shards of the rank's tensor-parallel pieces, less the pieces a
  // lower TP rank writes (sharded_checkpoint.h): not the full layers' shards counted below.
  if (s.mesh.shape.tp > 1)
    throw_sentence("checkpoint.elements counts FSDP's shards of full layers, and this run splits them with --tp " +
                   std::to_string(s.mesh.shape.tp) + "; read a tensor-parallel save's pieces from its index.json");
  const auto real = [](int64_t numel, int64_t chunk, int r) {
    return std::clamp<int64_t>(numel - static_cast<int64_t>(r) * chunk, 0, chunk);
  };
  if (c.sharding == Sharding::NoShard || c.sharding == Sharding::Zero1) {
    const int64_t chunk = (c.num_params + c.world - 1) / c.world;
    return static_cast<double>(real(c.num_params, chunk, rank));
  }
  if (s.units.empty()) throw_sentence("this run has no FSDP units yet");
  const int group = std::max(1, s.units[0].shard_world);
  if (rank / group != 0) return 0;
  int64_t n = 0;
  for (const UnitView& u : s.units) n += real(u.numel, u.chunk, rank);
  return static_cast<double>(n);
}

Sharding sharding_arg(const Arg& a) { return parse_sharding(a.str); }

double plan_field(const Args& a, double MemoryPlan::*field) {
  MemoryPlanInput in;
  in.params = a[0].num;
  in.world = count_arg(a[1], "plan: world", 1, 1 << 20);
  in.sharding = sharding_arg(a[2]);
  in.dtype = a.size() > 3 ? parse_plan_dtype(a[3].str) : PlanDType::Fp32;
  in.optimizer = OptimizerKind::AdamW;
  return plan_memory(in).*field;
}

// HYBRID_SHARD's per-rank bytes: (P, N, K, DTYPE?), shard groups of K ranks.
double plan_hybrid(const Args& a) {
  MemoryPlanInput in;
  in.params = a[0].num;
  in.world = count_arg(a[1], "plan: world", 1, 1 << 20);
  in.node_size = count_arg(a[2], "plan: node size", 1, 1 << 20);
  in.sharding = Sharding::Hybrid;
  in.dtype = a.size() > 3 ? parse_plan_dtype(a[3].str) : PlanDType::Fp32;
  in.optimizer = OptimizerKind::AdamW;
  return plan_memory(in).total;
}

// Bytes each rank sends in an all-reduce of `bytes` by the engine's own step plan.
std::vector<double> algo_sent(const Args& a) {
  const Algorithm algo = parse_algorithm(a[0].str);
  const int n = count_arg(a[1], "algo: world", 1, 64);
  std::vector<double> sent(static_cast<size_t>(n), 0.0);
  for (int s = 0; s < algorithm_step_count(CollectiveOp::AllReduce, algo, n); s++)
    for (const StepTransfer& t : algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, s))
      if (t.src >= 0)  // the in-network switch is no rank
        sent[static_cast<size_t>(t.src)] += t.chunk >= 0 && t.chunks > 0 ? a[2].num / t.chunks : a[2].num;
  return sent;
}

// (ALGO, PROFILE, N, BYTES): bytes the busiest rank sends from its node to another node in an
// all-reduce of BYTES on N ranks of PROFILE (its nodes of gpus_per_node ranks), by the step plan.
double algo_across(const Args& a) {
  const Algorithm algo = parse_algorithm(a[0].str);
  const HardwareProfile p = find_profile(a[1].str);
  const int n = count_arg(a[2], "algo: world", 1, 64), G = p.gpus_per_node;
  std::vector<double> sent(static_cast<size_t>(n), 0.0);
  for (int s = 0; s < algorithm_step_count(CollectiveOp::AllReduce, algo, n, G); s++)
    for (const StepTransfer& t : algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, s, G))
      if (t.src >= 0 && t.dst >= 0 && t.src / G != t.dst / G)
        sent[static_cast<size_t>(t.src)] += t.chunk >= 0 && t.chunks > 0 ? a[3].num / t.chunks : a[3].num;
  return *std::max_element(sent.begin(), sent.end());
}

// (ALGO, PROFILE, N, BYTES): the tuning model's prediction for an all-reduce at ALGO's best protocol.
Prediction tuned(const Args& a) {
  return select(find_profile(a[1].str), count_arg(a[2], "tune: world", 1, 1024), CollectiveOp::AllReduce, a[3].num,
                parse_algorithm(a[0].str));
}

// (A, B, PROFILE, N): the smallest power of two from 8 B to 16 GiB at which B's predicted time is at
// most A's (each at its best protocol): where A stops being the faster.
double tune_crossover(const Args& a) {
  const HardwareProfile p = find_profile(a[2].str);
  const int n = count_arg(a[3], "tune: world", 1, 1024);
  const Algorithm x = parse_algorithm(a[0].str), y = parse_algorithm(a[1].str);
  for (double bytes = 8; bytes <= 16.0 * (1 << 30); bytes *= 2)
    if (select(p, n, CollectiveOp::AllReduce, bytes, y).seconds <= select(p, n, CollectiveOp::AllReduce, bytes, x).seconds)
      return bytes;
  throw_sentence(a[1].str + " never catches up with " + a[0].str + " between 8 B and 16 GiB on " + a[2].str);
}

// (KIND, P, M, ...): the generated schedule with v stages per rank.
int stages_arg(const Args& a) { return count_arg(a[1], "schedule: P", 1, 64); }
int microbatches_arg(const Args& a) { return count_arg(a[2], "schedule: M", 1, 1024); }
PipelineSchedule schedule_arg(const Args& a, int v) {
  return make_schedule(parse_schedule_kind(a[0].str), stages_arg(a), microbatches_arg(a), v);
}
int chunks_arg(const Args& a) { return a.size() > 3 ? count_arg(a[3], "schedule: V", 1, 16) : 1; }

// The table, one function per section; entries() joins them in this order.
using S = const Snapshot&;
using A = const Args&;

// The run
std::vector<Entry> run_entries() {
  auto b = [](bool x) { return x ? 1.0 : 0.0; };
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"world", "", "ranks in the run", [](S s, A) { return double(s.config.world); }},
    {"batch", "", "samples per rank per micro-batch", [d](S s, A) { return d(s.config.batch); }},
    {"accum", "", "micro-batches per optimizer step (gradient accumulation)", [d](S s, A) { return d(s.config.accum); }},
    {"effective_batch", "", "batch x world x accum", [d](S s, A) { return d(s.config.batch * s.config.world * s.config.accum); }},
    {"params", "", "parameters of the running model (Ψ; under LoRA the trainable adapters)", [d](S s, A) { return d(s.config.num_params); }},
    {"params.frozen", "", "LoRA: the frozen base parameters (0 without LoRA)", [d](S s, A) { return d(s.config.frozen_params); }},
    {"bucket_cap", "", "DDP bucket cap in bytes", [d](S s, A) { return d(s.config.bucket_cap_bytes); }},
    {"step", "", "optimizer steps done", [d](S s, A) { return d(s.step); }},
    {"iteration", "", "rank 0's current iteration (0-based)", [](S s, A) { return double(s.iteration); }},
    {"epoch", "", "the sampler's epoch", [d](S s, A) { return d(s.data.epoch); }},
    {"run.failed", "", "1 once the run failed (watchdog, desync)", [b](S s, A) { return b(!s.error.empty()); }},
    {"run.finished", "", "1 once every step ran", [b](S s, A) { return b(s.finished); }},
    {"watchdog.arrived", "", "ranks the watchdog saw arrive at the stuck collective", [](S s, A) { return double(diagnosed_ranks(s, false).size()); }},
    {"watchdog.arrived[I]", "n", "the I-th rank to arrive there", [](S s, A a) { auto v = diagnosed_ranks(s, false); return double(v[static_cast<size_t>(index_of(a[0], v.size(), "arrived rank"))]); }},
    {"watchdog.missing", "", "ranks the watchdog names missing (0 when none)", [](S s, A) { return double(diagnosed_ranks(s, true).size()); }},
    {"watchdog.missing[I]", "n", "the I-th missing rank", [](S s, A a) { auto v = diagnosed_ranks(s, true); return double(v[static_cast<size_t>(index_of(a[0], v.size(), "missing rank"))]); }},
    {"run.error_has(TEXT)", "s", "1 if the run's error message contains TEXT, e.g. \"finished reduction\"", [b](S s, A a) {
       return b(!a[0].str.empty() && s.error.find(a[0].str) != std::string::npos); }},
    {"run.error_rank", "", "the rank the run's error names first (\"rank R: ...\"; -1: none)", [](S s, A) {
       const size_t at = s.error.find("rank ");
       return at == std::string::npos || at > 16 ? -1.0 : std::atof(s.error.c_str() + at + 5); }},
    {"watchdog.bucket", "", "the DDP bucket that never launched its all-reduce (-1: none)", [](S s, A) {
       size_t at = s.error.find(", so bucket ");
       return at == std::string::npos ? -1.0 : std::atof(s.error.c_str() + at + 12); }},
  };
}

// The collective the ring view shows
std::vector<Entry> collective_entries() {
  auto b = [](bool x) { return x ? 1.0 : 0.0; };
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"mesh.dp", "", "data-parallel replicas of the run's mesh (world / (tp x stages))", [](S s, A) { return double(s.mesh.shape.dp); }},
    {"mesh.pp", "", "pipeline stages of the mesh (1 without a pipeline)", [](S s, A) { return double(s.mesh.shape.pp); }},
    {"mesh.tp", "", "ranks per tensor-parallel group (--tp)", [](S s, A) { return double(s.mesh.shape.tp); }},
    {"mesh.holds(R, NAME)", "ns", "elements of parameter NAME (\"2.weight\", a GPT's \"transformer.h.0.attn.c_attn.weight\") rank R holds: its tensor-parallel slice (0: not in its stage)", [](S s, A a) { return mesh_holds(s, a[0].num, a[1].str); }},
    {"collective.seq", "", "its sequence number (#0 is the first of the run)", [d](S s, A) { return d(static_cast<int64_t>(collective(s).seq)); }},
    // What the stepper holds (issue 32): the item the next step releases, or the focus's next one.
    {"held.bytes", "", "bytes of the operation the stepper holds (a collective's payload S, a send/recv's message)", [d](S s, A) { return d(held(s).gate.bytes); }},
    {"held.members", "", "how many ranks take part in what the stepper holds", [](S s, A) { return double(held(s).members.size()); }},
    {"held.member[I]", "n", "the I-th rank (in rank order) of what the stepper holds", [](S s, A a) { auto& v = held(s).members; return double(v[static_cast<size_t>(index_of(a[0], v.size(), "member"))]); }},
    {"held.arrived", "", "how many of them are at its gate", [](S s, A) { return double(held(s).arrived.size()); }},
    {"held.is(KIND)", "s", "1 if the stepper holds a KIND: collective (of any group), send (a send/recv), ring, layer, bucket, action, iteration", [b](S s, A a) { return b(held_kind(held(s)) == a[0].str); }},
    {"held.in(GROUP)", "s", "1 if what the stepper holds is a collective of GROUP: world, tp0, dp1, ...", [b](S s, A a) { return b(held(s).gate.label.rfind(a[0].str + " #", 0) == 0); }},
    {"collective.is(OP)", "s", "1 if it is OP: allreduce, allgather, reduce_scatter, broadcast, barrier, ...", [b](S s, A a) { return b(a[0].str == collective_name(collective(s).op)); }},
    {"collective.layer", "", "the layer (Sequential index) whose forward or backward rank 0 ran last before issuing it: a TP collective's f or g follows its layer (-1: none)", [](S s, A) { return collective_layer(s); }},
    {"collective.bytes", "", "payload S in bytes (the whole buffer of an all-reduce)", [d](S s, A) { return d(collective(s).bytes); }},
    {"collective.count", "", "elements per rank buffer", [d](S s, A) { return d(collective(s).count); }},
    {"collective.steps", "", "algorithm steps: 2(n-1) for a ring all-reduce", [](S s, A) { return double(collective(s).steps); }},
    {"collective.steps_done", "", "steps every rank has finished", [](S s, A) { return double(collective(s).steps_done); }},
    {"collective.in_flight", "", "1 while some rank is inside it", [b](S s, A) { return b(collective(s).in_flight); }},
    {"collective.arrived", "", "ranks that arrived (while in flight)", [](S s, A) { return double(collective(s).arrived.size()); }},
    {"collective.arrived[I]", "n", "the I-th rank to arrive", [](S s, A a) { auto& v = collective(s).arrived; return double(v[static_cast<size_t>(index_of(a[0], v.size(), "arrived rank"))]); }},
    {"collective.missing", "", "ranks not arrived yet", [](S s, A) { return double(collective(s).missing.size()); }},
    {"collective.missing[I]", "n", "the I-th missing rank", [](S s, A a) { auto& v = collective(s).missing; return double(v[static_cast<size_t>(index_of(a[0], v.size(), "missing rank"))]); }},
    {"collective.sent(R)", "n", "bytes rank R sent in it so far (from the engine's step events)", [](S s, A a) { return collective_bytes(s, collective(s).seq, count_arg(a[0], "rank", 0, 1 << 20), true); }},
    {"collective.received(R)", "n", "bytes rank R received in it so far", [](S s, A a) { return collective_bytes(s, collective(s).seq, count_arg(a[0], "rank", 0, 1 << 20), false); }},
    {"sent(SEQ, R)", "nn", "bytes rank R sent in collective #SEQ (of the last few iterations), e.g. once it finished", [](S s, A a) { return collective_bytes(s, static_cast<uint64_t>(count_arg(a[0], "collective #", 0, 1 << 30)), count_arg(a[1], "rank", 0, 1 << 20), true); }},
    {"collective.bytes_per_rank", "", "bytes the busiest rank sent in it so far", [](S s, A) {
       double m = 0;
       for (int r = 0; r < collective(s).world; r++) m = std::max(m, collective_bytes(s, collective(s).seq, r, true));
       return m; }},
    {"collective.cell(R, C)", "nn", "ranks' contributions chunk C holds on rank R", [](S s, A a) {
       const auto& cv = collective(s);
       const auto& row = cv.cells[static_cast<size_t>(index_of(a[0], cv.cells.size(), "rank"))];
       return double(row[static_cast<size_t>(index_of(a[1], row.size(), "chunk"))]); }},
    {"collective.predicted_us", "", "the cost model's time on the run's hardware profile, µs", [](S s, A) { return collective(s).predicted_s * 1e6; }},
    {"collective.algbw", "", "algorithm bandwidth, GB/s (bytes / time)", [](S s, A) { return collective(s).algbw_gbs; }},
    {"collective.busbw", "", "bus bandwidth, GB/s (algbw x 2(n-1)/n for all-reduce)", [](S s, A) { return collective(s).busbw_gbs; }},
  };
}

// DDP buckets (rank 0's reducer)
std::vector<Entry> bucket_entries() {
  auto b = [](bool x) { return x ? 1.0 : 0.0; };
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"bucket.count", "", "DDP buckets", [](S s, A) { return double(s.buckets.size()); }},
    {"bucket.of(NAME)", "s", "the bucket holding parameter NAME, e.g. \"2.weight\" (-1: none)", [](S s, A a) {
       for (const BucketView& bv : s.buckets)
         for (const BucketParam& p : bv.params)
           if (p.name == a[0].str) return double(bv.index);
       return -1.0; }},
    {"bucket[I].bytes", "n", "its size in bytes", [d](S s, A a) { return d(bucket(s, a[0]).bytes); }},
    {"bucket[I].params", "n", "parameters in it", [](S s, A a) { return double(bucket(s, a[0]).params.size()); }},
    {"bucket[I].sent", "n", "bytes its collectives moved in its last pass (a comm hook's compressed bytes; its own bytes without one)",
     [d](S s, A a) { return d(bucket(s, a[0]).wire_bytes); }},
    {"bucket[I].ready", "n", "1 once every gradient in it is ready (ready, launched, reducing or done)", [b](S s, A a) { return b(bucket(s, a[0]).state >= BucketState::Ready); }},
    {"bucket[I].launched", "n", "1 once its all-reduce is issued", [b](S s, A a) { return b(bucket(s, a[0]).state >= BucketState::Launched); }},
    {"bucket[I].done", "n", "1 once its all-reduce finished", [b](S s, A a) { return b(bucket(s, a[0]).state == BucketState::Done); }},
    {"bucket[I].launch_order", "n", "its launch position in this backward pass (-1: not launched)", [](S s, A a) { return double(bucket(s, a[0]).launch_order); }},
    {"buckets.ready", "", "buckets ready or further along", [](S s, A) { return double(std::count_if(s.buckets.begin(), s.buckets.end(), [](const BucketView& v) { return v.state >= BucketState::Ready; })); }},
    {"buckets.done", "", "buckets whose all-reduce finished", [](S s, A) { return double(std::count_if(s.buckets.begin(), s.buckets.end(), [](const BucketView& v) { return v.state == BucketState::Done; })); }},
  };
}

// Memory per rank, bytes now
std::vector<Entry> memory_entries() {
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"memory.rank[R].parameters", "n", "parameter bytes (FSDP: the shard)", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::Parameters)); }},
    {"memory.rank[R].gradients", "n", "gradient bytes", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::Gradients)); }},
    {"memory.rank[R].optimizer", "n", "optimizer state bytes", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::OptimizerState)); }},
    {"memory.rank[R].master", "n", "mixed precision: the fp32 master weights the optimizer updates", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::MasterWeights)); }},
    {"memory.rank[R].activations", "n", "activation bytes", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::Activations)); }},
    {"memory.rank[R].comm", "n", "communication buffers (DDP buckets)", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::CommBuffers)); }},
    {"memory.rank[R].gathered", "n", "FSDP: unsharded parameters gathered now", [d](S s, A a) { return d(memory(s, a[0]).current_of(MemCategory::GatheredParameters)); }},
    {"memory.rank[R].total", "n", "everything the rank holds now", [d](S s, A a) { return d(memory(s, a[0]).total_current); }},
    {"memory.rank[R].peak", "n", "the iteration's peak", [d](S s, A a) { return d(memory(s, a[0]).total_peak); }},
  };
}

// Training history (rank 0's reports: means over every rank's samples)
std::vector<Entry> history_entries() {
  return {
    {"history.count", "", "optimizer steps reported", [](S s, A) { return double(s.steps_reported); }},
    {"history.last.loss", "", "loss of the last step (before its update)", [](S s, A) { return double(last_step(s).loss); }},
    {"history.last.accuracy", "", "accuracy of the last step", [](S s, A) { return last_step(s).accuracy; }},
    {"history.last.overlap", "", "share of all-reduce time hidden behind backward in the last step", [](S s, A) { return last_step(s).overlap; }},
    {"count.micro_batches(I)", "n", "forward+backward passes rank 0 ran in iteration I (losses computed)", [](S s, A a) {
       return count_events(s, a[0].num, [](const Event& e) { return e.kind == EventKind::Compute && e.compute.kind == ComputeKind::Loss; }); }},
    {"flops.compute(I, KIND)", "ns", "FLOPs rank 0's layers charged in iteration I: KIND forward, backward or recompute (activation checkpointing's second forward), multiply-adds counted twice", [](S s, A a) {
       const std::string& k = a[1].str;
       if (k != "forward" && k != "backward" && k != "recompute")
         throw Error("flops.compute: KIND '" + k + "' is not forward, backward or recompute");
       const ComputeKind want = k == "forward" ? ComputeKind::LayerForward : k == "backward" ? ComputeKind::LayerBackward : ComputeKind::Recompute;
       double sum = 0;
       if (!s.events.empty())
         for (const Event& e : s.events[0])
           if (static_cast<double>(e.iteration) == a[0].num && e.kind == EventKind::Compute && e.compute.kind == want) sum += e.compute.flops;
       return sum; }},
    {"count.collectives(I, OP)", "ns", "collectives OP (broadcast, reduce, allreduce, ...) rank 0 ran in iteration I", [](S s, A a) {
       return count_events(s, a[0].num, [&a](const Event& e) { return e.kind == EventKind::Collective && a[1].str == collective_name(e.coll.op); }); }},
    {"count.group_collectives(I, OP, GROUP)", "nss", "collectives OP rank 0 ran in iteration I in its GROUP: tp, dp, pp (its mesh groups) or world", [](S s, A a) {
       return count_group_collectives(s, a[0].num, a[1].str, a[2].str); }},
    {"count.bucket_allreduces(I)", "n", "bucket all-reduces rank 0 launched in iteration I", [](S s, A a) {
       return count_events(s, a[0].num, [](const Event& e) { return e.kind == EventKind::BucketLaunch; }); }},
    {"loss(K)", "n", "loss of step K (1-based)", [](S s, A a) { return double(step_point(s, a[0]).loss); }},
    {"accuracy(K)", "n", "accuracy of step K", [](S s, A a) { return step_point(s, a[0]).accuracy; }},
    {"samples(K)", "n", "samples whose gradients step K averaged, over every rank (a rank joined under --join adds none)", [](S s, A a) {
       return double(step_point(s, a[0]).samples); }},
    {"clip.norm(K)", "n", "--clip-grad-norm: the whole model's gradient norm in step K, before clipping", [](S s, A a) {
       return clip_point(s, a[0]).grad_norm; }},
    {"clip.coef(K)", "n", "--clip-grad-norm: the factor step K multiplied every gradient by (1: not clipped)", [](S s, A a) {
       return clip_point(s, a[0]).clip_coef; }},
  };
}

// Mixed precision and fp16's loss scaler (engine/train/grad_scaler.h; docs/course_sources.md §6e)
std::vector<Entry> precision_entries() {
  auto b = [](bool x) { return x ? 1.0 : 0.0; };
  return {
    {"run.precision_bytes", "", "bytes of a parameter, gradient and activation as the run trains: 2 (bf16, fp16) or 4 (fp32)", [](S s, A) {
       return is_mixed(s.config.precision) ? 2.0 : 4.0; }},
    {"scaler.scale", "", "fp16: the loss scale the last step's gradients carried (0: no loss scaler)", [](S s, A) { return double(last_step(s).loss_scale); }},
    {"count.skipped_steps", "", "fp16: optimizer steps every rank skipped (inf/NaN in the gradients)", [](S s, A) {
       return double(s.steps_skipped); }},
    {"scaler.last_skipped_step", "", "fp16: the last step skipped (1-based; -1: none)", [](S s, A) {
       return double(s.last_skipped_step); }},
    {"scaler.found_inf(R, I)", "nn", "fp16: 1 if rank R's own gradients held an inf/NaN in iteration I (before the ranks agreed)", [b](S s, A a) {
       return b(loss_scale_event(s, a[0], a[1]).found_inf != 0); }},
    {"scaler.skipped(R, I)", "nn", "fp16: 1 if rank R skipped its optimizer step in iteration I (the ranks' agreement)", [b](S s, A a) {
       return b(loss_scale_event(s, a[0], a[1]).skipped != 0); }},
    {"scaler.next_scale(R, I)", "nn", "fp16: the loss scale rank R's scaler set for the step after iteration I", [](S s, A a) {
       return double(loss_scale_event(s, a[0], a[1]).next_scale); }},
  };
}

// Data and the DistributedSampler
std::vector<Entry> data_entries() {
  auto b = [](bool x) { return x ? 1.0 : 0.0; };
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"data.n", "", "samples in the data set", [d](S s, A) { return d(s.data.n); }},
    {"data.owned(R)", "n", "samples the sampler gives rank R in the shown epoch", [](S s, A a) {
       // Compared as numbers: R beyond an int16_t (or a fraction) owns nothing, and is never converted to one.
       return double(std::count_if(s.data.owner.begin(), s.data.owner.end(), [&](int16_t o) { return o == a[0].num; })); }},
    {"data.set_epoch", "", "1 when set_epoch is called every epoch", [b](S s, A) { return b(s.data.set_epoch); }},
    {"data.same_owner(MARK)", "s", "samples whose rank is the same now as when `mark MARK` ran", nullptr, [](const FigureScope& sc, A a) {
       const auto& now = sc.now->data.owner;
       const auto& then = marked(sc, a[0].str).data.owner;
       double same = 0;
       for (size_t i = 0; i < std::min(now.size(), then.size()); i++) same += now[i] == then[i] ? 1 : 0;
       return same; }},
  };
}

// FSDP units
std::vector<Entry> unit_entries() {
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"unit.count", "", "FSDP units (flat parameters)", [](S s, A) { return double(s.units.size()); }},
    {"unit[I].numel", "n", "elements of its flat parameter", [d](S s, A a) { return d(unit(s, a[0]).numel); }},
    {"unit[I].shard", "n", "elements each rank keeps (ceil(numel / ranks))", [d](S s, A a) { return d(unit(s, a[0]).chunk); }},
    {"unit[I].gathered", "n", "ranks holding its full parameters now", [](S s, A a) { auto& g = unit(s, a[0]).gathered; return double(std::count(g.begin(), g.end(), 1)); }},
  };
}

// What a sharded checkpoint of this run holds
std::vector<Entry> checkpoint_entries() {
  return {
    {"checkpoint.elements(R)", "n", "float32 values rank R's file holds in a --save-sharded of this run: its shards without the padding (0: R writes no file)", [](S s, A a) {
       return checkpoint_elements(s, index_of(a[0], static_cast<size_t>(std::max(1, s.config.world)), "rank")); }},
    {"checkpoint.files", "", "rank files a --save-sharded of this run writes (index.json not counted)", [](S s, A) {
       double files = 0;
       for (int r = 0; r < s.config.world; r++) files += checkpoint_elements(s, r) > 0 ? 1 : 0;
       return files; }},
  };
}

// An imported PyTorch profiler trace (dtlab --open): engine/trace/trace_import.h
std::vector<Entry> trace_entries() {
  return {
    {"trace.ranks", "", "ranks (files) of the open trace", [](S s, A) { return double(trace(s).ranks.size()); }},
    {"trace.iterations", "", "iterations it marks (rank 0's ProfilerStep#N spans)", [](S s, A) { return double(trace(s).iterations); }},
    {"trace.collectives", "", "collectives matched across every rank", [](S s, A) { return double(trace(s).collectives.size()); }},
    {"trace.buckets(I)", "n", "DDP buckets (all-reduces) in the I-th profiled iteration (0-based)", [](S s, A a) {
       const std::vector<int> per = trace(s).buckets_per_iteration();
       return double(per.at(static_cast<size_t>(index_of(a[0], per.size(), "iteration")))); }},
    {"trace.bucket_collective(I, B)", "nn", "index K of bucket B's all-reduce in iteration I (buckets in launch order)", [](S s, A a) {
       return double(trace_bucket_collective(s, a[0], a[1])); }},
    {"trace.bytes(K)", "n", "bytes of collective K (-1: the format records no sizes)", [](S s, A a) { return double(trace_collective(s, a[0]).bytes); }},
    {"trace.busy_us(K)", "n", "µs collective K moved data with every rank present (end - last rank's start)", [](S s, A a) { return trace_collective(s, a[0]).busy_us; }},
    {"trace.last_rank(K)", "n", "the rank that arrived last at collective K", [](S s, A a) { return double(trace_collective(s, a[0]).last_rank); }},
    {"trace.late_us(K)", "n", "µs between the first and the last rank's arrival at collective K", [](S s, A a) {
       const TraceCollective& c = trace_collective(s, a[0]);
       return c.last_arrival_us - c.first_arrival_us; }},
    {"trace.exposed_us(K, R)", "nn", "µs of collective K's communication on rank R with no compute beside it", [](S s, A a) {
       const TraceCollective& c = trace_collective(s, a[0]);
       const ImportedTrace& t = trace(s);
       const int r = index_of(a[1], t.ranks.size(), "rank");
       return t.ranks[static_cast<size_t>(r)].collectives[static_cast<size_t>(c.rank_index[static_cast<size_t>(r)])].exposed_us; }},
    {"trace.rank[R].wall_us", "n", "µs of rank R's profiled steps (the breakdown's whole)", [](S s, A a) { return trace_rank(s, a[0]).wall_us; }},
    {"trace.rank[R].compute_us", "n", "µs rank R computed with no communication beside it", [](S s, A a) { return trace_rank(s, a[0]).compute_us; }},
    {"trace.rank[R].overlapped_us", "n", "µs of rank R's communication hidden behind its compute", [](S s, A a) { return trace_rank(s, a[0]).overlapped_us; }},
    {"trace.rank[R].exposed_us", "n", "µs of rank R's communication with no compute beside it", [](S s, A a) { return trace_rank(s, a[0]).exposed_comm_us; }},
    {"trace.rank[R].idle_us", "n", "µs rank R neither computed, communicated nor copied", [](S s, A a) { return trace_rank(s, a[0]).idle_us; }},
    {"trace.rank[R].straggled", "n", "collectives rank R arrived last to", [](S s, A a) { return double(trace_rank(s, a[0]).straggled); }},
    {"trace.most_exposed_rank", "", "the rank with the most exposed communication", [](S s, A) { return trace_argmax(s, &RankBreakdown::exposed_comm_us); }},
    {"trace.straggler", "", "the rank that arrived last most often", [](S s, A) {
       const ImportedTrace& t = trace(s);
       int best = 0;
       for (size_t r = 1; r < t.breakdown.size(); r++)
         if (t.breakdown[r].straggled > t.breakdown[static_cast<size_t>(best)].straggled) best = static_cast<int>(r);
       return double(best); }},
  };
}

// Bytes on the wire, by link
std::vector<Entry> traffic_entries() {
  return {
    {"traffic.sent(R, PEER)", "nn", "bytes rank R sent to rank PEER in the last iteration every rank finished (collective steps and point-to-point sends, process groups included)", [](S s, A a) {
       const auto m = traffic_matrix(s, last_finished_iteration(s));
       return m[static_cast<size_t>(index_of(a[0], m.size(), "rank"))][static_cast<size_t>(index_of(a[1], m.size(), "rank"))]; }},
    {"traffic.cross_node(R)", "n", "bytes rank R sent to ranks on other nodes (of the run's hardware profile) in that iteration", [](S s, A a) {
       return cross_node_bytes(s, index_of(a[0], s.events.size(), "rank")); }},
    {"traffic.cross_node_total", "", "bytes all ranks together sent between nodes in that iteration", [](S s, A) { return cross_node_bytes(s, -1); }},
    {"traffic.sent_by(R)", "n", "bytes rank R sent to all ranks in that iteration", [](S s, A a) {
       const auto m = traffic_matrix(s, last_finished_iteration(s));
       const auto& row = m[static_cast<size_t>(index_of(a[0], m.size(), "rank"))];
       return std::accumulate(row.begin(), row.end(), 0.0); }},
    {"traffic.received_by(R)", "n", "bytes rank R received from all ranks in that iteration", [](S s, A a) {
       const auto m = traffic_matrix(s, last_finished_iteration(s));
       const size_t r = static_cast<size_t>(index_of(a[0], m.size(), "rank"));
       double b = 0;
       for (const auto& row : m) b += row[r];
       return b; }},
    {"traffic.total", "", "bytes all ranks together sent in that iteration", [](S s, A) {
       double b = 0;
       for (const auto& row : traffic_matrix(s, last_finished_iteration(s))) b += std::accumulate(row.begin(), row.end(), 0.0);
       return b; }},
    {"iteration.modeled_us", "", "rank 0's last finished iteration on the modeled clock, µs", [](S s, A) {
       const int32_t it = last_finished_iteration(s);
       for (const Event& e : s.events[0])
         if (e.kind == EventKind::Iteration && e.iteration == it) return (e.model_end - e.model_begin) * 1e6;
       throw_sentence("iteration " + std::to_string(it) + " is no longer in rank 0's recent events"); }},
  };
}

// Mixture of experts: the routers' last forward (the Experts view) and the All-to-all view's all-to-all
std::vector<Entry> moe_entries() {
  auto d = [](int64_t x) { return static_cast<double>(x); };
  return {
    {"moe.tokens(R, L)", "nn", "tokens rank R's MoE block L routed in its last forward (its micro-batch's B x T)", [d](S s, A a) { return d(moe_block(s, a[0], a[1]).tokens); }},
    {"moe.capacity(R, L)", "nn", "its capacity per expert: ceil(tokens x top_k / experts x capacity factor) (0: dropless)", [d](S s, A a) { return d(moe_block(s, a[0], a[1]).capacity); }},
    {"moe.routed(R, L, E)", "nnn", "(token, expert) pairs of rank R's tokens whose top-k chose expert E in block L, before capacity", [d](S s, A a) {
       return d(moe_block(s, a[0], a[1]).routed[static_cast<size_t>(moe_expert(s, a[2]))]); }},
    {"moe.kept(R, L, E)", "nnn", "of them, the ones expert E computed (within its capacity)", [d](S s, A a) {
       return d(moe_block(s, a[0], a[1]).kept[static_cast<size_t>(moe_expert(s, a[2]))]); }},
    {"moe.dropped(R, L)", "nn", "(token, expert) pairs of rank R's tokens past capacity in block L (they pass through the residual alone)", [d](S s, A a) { return d(moe_block(s, a[0], a[1]).dropped); }},
    {"moe.aux_loss(R, L)", "nn", "block L's load-balancing loss on rank R's tokens (the coefficient included)", [](S s, A a) { return moe_block(s, a[0], a[1]).aux_loss; }},
    {"moe.rows(R, L)", "nn", "rows rank R's experts computed in block L's last forward: the kept pairs every rank of its EP group (itself without --ep) routed to the experts R holds", [](S s, A a) {
       const std::vector<double> rows = moe_rows(s, a[1]);
       const double v = rows[static_cast<size_t>(index_of(a[0], rows.size(), "rank"))];
       if (std::isnan(v)) throw_sentence("rank " + format_figure(a[0].num) + " does not run MoE block " + format_figure(a[1].num));
       return v; }},
    {"moe.rows_max(L)", "n", "the most rows any rank's experts computed in block L: the slowest rank's expert work", [](S s, A a) {
       const std::vector<double> rows = moe_rows_run(s, a[0]);
       return *std::max_element(rows.begin(), rows.end()); }},
    {"moe.rows_mean(L)", "n", "the mean over the ranks of those rows (what each would compute with a perfectly even router)", [](S s, A a) {
       const std::vector<double> rows = moe_rows_run(s, a[0]);
       return std::accumulate(rows.begin(), rows.end(), 0.0) / static_cast<double>(rows.size()); }},
    {"alltoall.sent(R)", "n", "bytes that leave rank R in the All-to-all view's all-to-all (the held operation's group's newest, else the newest): what it sends the other ranks (its own block is kept, a local copy), known from its issue", [](S s, A a) {
       const AllToAllView& t = alltoall(s);
       const int64_t b = t.sent[static_cast<size_t>(alltoall_member(t, a[0]))];
       if (b < 0) throw_sentence("rank " + format_figure(a[0].num) + " has not issued the all-to-all yet");
       return double(b); }},
    {"alltoall.bytes(SRC, DST)", "nn", "bytes rank SRC sent rank DST in it so far (SRC = DST: its own block, kept: copied locally)", [](S s, A a) {
       const AllToAllView& t = alltoall(s);
       const int i = alltoall_member(t, a[0]), j = alltoall_member(t, a[1]);
       if (t.at(i, j) < 0) throw_sentence("rank " + format_figure(a[0].num) + "'s block for rank " + format_figure(a[1].num) + " has not moved yet; step the all-to-all (step ring)");
       return double(t.at(i, j)); }},
    {"alltoall.total", "", "bytes every pair of different ranks moved in it so far", [d](S s, A) { return d(alltoall(s).total); }},
  };
}

// Context parallelism: each CP rank's ring pass, running or last (the Context view)
std::vector<Entry> cp_entries() {
  return {
    {"cp.pairs(R, L)", "nn", "causal (query, key) pairs rank R computed in block L's latest ring pass so far, per sample and head", [](S s, A a) {
       const ContextPassView& v = cp_pass_of(s, a[0], a[1]);
       int64_t n = 0;
       for (int st = 0; st < v.steps_done; st++) n += v.pairs[static_cast<size_t>(st)];
       return double(n); }},
    {"cp.blocks(R, L)", "nn", "K/V blocks rank R computed in that pass so far: the ring steps with any pair under the causal mask", [](S s, A a) {
       const ContextPassView& v = cp_pass_of(s, a[0], a[1]);
       int n = 0;
       for (int st = 0; st < v.steps_done; st++) n += v.pairs[static_cast<size_t>(st)] > 0;
       return double(n); }},
    {"cp.steps_done(R, L)", "nn", "ring steps that pass has computed (the CP degree once it is done)", [](S s, A a) { return double(cp_pass_of(s, a[0], a[1]).steps_done); }},
    {"cp.sent(R, L, S)", "nnn", "bytes rank R sent after ring step S of that pass (forward: its K/V block; backward: K/V and dK/dV)", [](S s, A a) {
       const ContextPassView& v = cp_pass_of(s, a[0], a[1]);
       return double(v.sent_bytes[static_cast<size_t>(index_of(a[2], v.sent_bytes.size(), "ring step"))]); }},
    {"cp.backward(R, L)", "nn", "1 when that pass is a backward one, 0 for a forward", [](S s, A a) { return cp_pass_of(s, a[0], a[1]).backward ? 1.0 : 0.0; }},
  };
}

// The live pipeline run
std::vector<Entry> pipeline_entries() {
  return {
    {"pipeline.bubble(R)", "n", "rank R's idle share of the last finished iteration, measured on the modeled clock", [](S s, A a) {
       const double b = pipe_rank(s, a[0]).bubble;
       if (b < 0) throw_sentence("no pipeline iteration has finished yet; step an iteration first");
       return b; }},
    {"pipeline.formula_bubble", "", "the running schedule's bubble by formula, with this run's action costs", [](S s, A) {
       if (!s.pipeline.valid) throw_sentence("this run is not a pipeline; use --strategy pipeline");
       return s.pipeline.formula.of_wall; }},
    {"pipeline.peak(R)", "n", "rank R's most micro-batches in flight in the shown iteration", [](S s, A a) { return double(pipe_rank(s, a[0]).peak_inflight); }},
    {"pipeline.actions_done(R)", "n", "actions rank R has finished in the shown iteration", [](S s, A a) { return double(pipe_rank(s, a[0]).done.size()); }},
  };
}

// Formulas, from the engine's planner, cost model, step plans and schedules
std::vector<Entry> formula_entries() {
  return {
    {"plan.total(P, N, SHARDING, DTYPE?)", "nns|s", "bytes per rank for P parameters on N ranks (AdamW; SHARDING no-shard, zero1, grad-op, full; DTYPE fp32 (default), bf16, fp16 or mixed (= fp16))", [](S, A a) { return plan_field(a, &MemoryPlan::total); }},
    {"plan.parameters(P, N, SHARDING, DTYPE?)", "nns|s", "of which parameters", [](S, A a) { return plan_field(a, &MemoryPlan::parameters); }},
    {"plan.gradients(P, N, SHARDING, DTYPE?)", "nns|s", "of which gradients", [](S, A a) { return plan_field(a, &MemoryPlan::gradients); }},
    {"plan.optimizer(P, N, SHARDING, DTYPE?)", "nns|s", "of which optimizer state", [](S, A a) { return plan_field(a, &MemoryPlan::optimizer_state); }},
    {"plan.comm(P, N, SHARDING, DTYPE?)", "nns|s", "bytes each rank sends per step", [](S, A a) { return plan_field(a, &MemoryPlan::comm_bytes); }},
    {"plan.mesh(WHAT, SPEC)", "ss", "the 3-D planner (dtlab-cli plan --tp): WHAT tp, pp, dp (bytes a rank sends per step along it), spanning:tp (groups spanning nodes), slowest (bytes on the slowest link), rank_params, memory, nodes; SPEC \"params=7B world=64 tp=4 stages=4 layers=32 hidden=4096 seq=2048 micro_batch=1 micro_batches=8 dtype=mixed profile=dgx-h100x2\"", [](S, A a) { return plan_mesh_figure(a[0].str, a[1].str); }},
    {"plan.activations(MODEL, B, CKPT)", "snn", "activation bytes a rank of MODEL (\"mlp:2,64,64,3\", or a GPT with its vocab=) holds for a batch of B rows (a GPT: B sequences), with activation checkpointing when CKPT is 1 (exactly what the tracker counts for the model; the loss's buffers are the run's)", [](S, A a) {
       const ModelSpec spec = ModelSpec::parse(a[0].str);
       const int64_t B = count_arg(a[1], "plan: batch", 1, 1 << 24);
       if (spec.is_gpt() && spec.gpt.vocab < 2) throw Error("plan.activations: " + spec.str() + " needs its vocab= (the logits are B x ctx x vocab floats)");
       return double(spec.is_gpt() ? gpt_activation_bytes(spec.gpt, B, a[2].num != 0) : mlp_activation_bytes(spec, B, a[2].num != 0)); }},
    {"plan.hybrid(P, N, K, DTYPE?)", "nnn|s", "bytes per rank under HYBRID_SHARD: P parameters on N ranks, sharded in groups of K (AdamW)", [](S, A a) { return plan_hybrid(a); }},
    {"sizing(WHAT, SPEC)", "ss", "the sizing calculator (dtlab-cli plan --global-batch; the Sizing view): WHAT a figure of it (memory.total, flops.step, compute.seconds, dp.bytes, dp.seconds, tp.seconds, pp.seconds, cp.bytes, cp.imbalance, ep.bytes, edp.bytes, cp.spanning, comm.seconds, overhead, grad.bytes, ...: `dtlab-cli plan --global-batch ... --json` lists them), SPEC \"params=70B layers=80 hidden=8192 heads=64 seq=4096 global_batch=512 dp=64 tp=8 pp=1 precision=bf16 zero=1 recompute=0 profile=dgx-h100x2 mfu=0.4\" (also micro_batch, sp, compute_s, gpu_gb, cp, cp_layout, kv_heads, ep, experts, top_k, capacity, moe_every); unset keys take those values", [](S, A a) { return sizing_line(plan_sizing(parse_sizing_spec(a[1].str)), a[0].str).value; }},
    {"algo.steps(ALGO, N)", "sn", "steps of an all-reduce with ALGO (ring, tree, naive, dbtree, nvls) on N ranks", [](S, A a) { return double(algorithm_step_count(CollectiveOp::AllReduce, parse_algorithm(a[0].str), count_arg(a[1], "algo: world", 1, 64))); }},
    {"algo.sent(ALGO, N, BYTES, R)", "snnn", "bytes rank R sends in an all-reduce of BYTES", [](S, A a) { auto v = algo_sent(a); return v[static_cast<size_t>(index_of(a[3], v.size(), "rank"))]; }},
    {"algo.busiest(ALGO, N, BYTES)", "snn", "bytes the busiest rank sends in it", [](S, A a) { auto v = algo_sent(a); return *std::max_element(v.begin(), v.end()); }},
    {"algo.across(ALGO, PROFILE, N, BYTES)", "ssnn", "bytes the busiest rank sends to other nodes in an all-reduce of BYTES on N ranks of PROFILE", [](S, A a) { return algo_across(a); }},
    {"tune.us(ALGO, PROFILE, N, BYTES)", "ssnn", "the tuning model's all-reduce time with ALGO at its best protocol, µs", [](S, A a) { return tuned(a).seconds * 1e6; }},
    {"tune.busbw(ALGO, PROFILE, N, BYTES)", "ssnn", "its bus bandwidth (nccl-tests' busbw), GB/s", [](S, A a) { return tuned(a).busbw / 1e9; }},
    {"tune.crossover(A, B, PROFILE, N)", "sssn", "the smallest power-of-two all-reduce size at which B is predicted at least as fast as A, bytes", [](S, A a) { return tune_crossover(a); }},
    {"cost.allreduce_us(PROFILE, N, BYTES)", "snn", "ring all-reduce time on a hardware profile (nvlink8, dgx-h100, ib2x4, ...), µs", [](S, A a) {
       return CostModel(find_profile(a[0].str), count_arg(a[1], "cost: world", 1, 1024)).collective_time(CollectiveOp::AllReduce, Algorithm::Ring, a[2].num) * 1e6; }},
    {"link.gbs(PROFILE, WHICH)", "ss", "bandwidth of a profile's \"intra\" (inside a node) or \"inter\" (between nodes) link, GB/s", [](S, A a) {
       const HardwareProfile p = find_profile(a[0].str);
       if (a[1].str != "intra" && a[1].str != "inter") throw_sentence("link.gbs takes \"intra\" or \"inter\", not \"" + a[1].str + "\"");
       return 1.0 / (a[1].str == "intra" ? p.intra : p.inter).beta / 1e9; }},
    {"schedule.bubble(KIND, P, M, V?)", "snn|n", "idle share of the makespan by formula: (p-1)/(m+p-1) for gpipe and 1f1b", [](S, A a) {
       return formula_bubble(parse_schedule_kind(a[0].str), stages_arg(a), microbatches_arg(a), chunks_arg(a)).of_wall; }},
    {"schedule.bubble_of_ideal(KIND, P, M, V?)", "snn|n", "idle over compute alone: (p-1)/m for gpipe and 1f1b", [](S, A a) {
       return formula_bubble(parse_schedule_kind(a[0].str), stages_arg(a), microbatches_arg(a), chunks_arg(a)).of_ideal; }},
    {"schedule.measured_bubble(KIND, P, M, V?)", "snn|n", "rank 0's idle share when the generated schedule is simulated", [](S, A a) { return simulate(schedule_arg(a, chunks_arg(a))).bubble.at(0); }},
    {"schedule.steps(KIND, P, M, V?)", "snn|n", "time steps of the generated grid", [](S, A a) { return double(num_steps(schedule_arg(a, chunks_arg(a)))); }},
    {"schedule.peak(KIND, P, M, R)", "snnn", "rank R's peak micro-batches in flight (activations held)", [](S, A a) { return double(measured_peak_inflight(schedule_arg(a, 1), index_of(a[3], static_cast<size_t>(stages_arg(a)), "rank"))); }},
  };
}

// Arithmetic
std::vector<Entry> arithmetic_entries() {
  return {
    {"min(A, B)", "nn", "the smaller", [](S, A a) { return std::min(a[0].num, a[1].num); }},
    {"max(A, B)", "nn", "the larger", [](S, A a) { return std::max(a[0].num, a[1].num); }},
    {"abs(X)", "n", "absolute value", [](S, A a) { return std::fabs(a[0].num); }},
    {"round(X)", "n", "nearest whole number", [](S, A a) { return std::round(a[0].num); }},
  };
}

}  // namespace

const Snapshot& marked(const FigureScope& sc, const std::string& name) {
  if (sc.marks)
    if (auto it = sc.marks->find(name); it != sc.marks->end()) return it->second;
  throw_sentence("no `mark " + name + "` has run before this");
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = [] {
    std::vector<Entry> t;
    for (auto section : {&run_entries, &collective_entries, &bucket_entries, &memory_entries, &history_entries, &precision_entries,
                         &data_entries, &unit_entries, &checkpoint_entries, &trace_entries, &traffic_entries,
                         &moe_entries, &cp_entries, &pipeline_entries, &formula_entries, &arithmetic_entries})
      for (Entry& e : section()) t.push_back(std::move(e));
    return t;
  }();
  return table;
}

std::string signature_of(const std::string& name) {
  std::string out;
  int depth = 0;
  for (char c : name) {
    if (c == '[' || c == '(') {
      if (depth++ == 0) out += c;
    } else if (c == ']' || c == ')') {
      if (--depth == 0) out += c;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

const Entry* find_entry(const std::string& sig) {
  for (const Entry& e : entries())
    if (signature_of(e.name) == sig) return &e;
  return nullptr;
}

}  // namespace dtlab::app
