// What the UI sees of the engine in one frame. The SnapshotBuilder (app/snapshot_builder.h) builds
// it once per frame from what the Session hands it of the live run (recorder events, stepper state,
// world status, memory trackers, step reports); views read it and nothing else, so every picture
// comes from what the engine really did. Plain data: no engine object is reachable from here, no
// lock is needed to read it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/comm/plan.h"
#include "engine/core/memory.h"
#include "engine/core/mesh.h"
#include "engine/core/optim.h"
#include "engine/parallel/ddp.h"
#include "engine/parallel/memory_plan.h"
#include "engine/train/strategy.h"
#include "engine/parallel/pipeline.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/trace/event.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/roofline.h"
#include "engine/trace/stepper.h"
#include "engine/trace/trace_import.h"

namespace dtlab::app {

// The collective a ring/tree/naive view draws: the one in flight, else the last one that ran.
struct CollectiveView {
  bool valid = false;
  bool in_flight = false;     // some rank has arrived and not every rank has finished
  uint64_t seq = 0;           // the world's, or the process group's own counter
  // A process group's collective (issue 16): CollectiveInfo::group, its name and global ranks
  // ("tp0: ranks 0,1"). Then everything below is in group ranks (world = the group's size, cells
  // and transfers indexed by group rank) and group rank i is global rank members[i]; for the
  // world's collectives group is 0 and members is empty.
  int32_t group = 0;
  std::string group_name;     // "tp0"
  std::vector<int> members;
  int world_size = 0;         // every rank of the run (the group's members and the others)
  CollectiveOp op = CollectiveOp::AllReduce;
  Algorithm algo = Algorithm::Ring;
  Protocol proto = Protocol::Default;  // the tuning model's pick or the run's --proto
  std::string why;            // the tuning model's explain(): why this pair, what it would pick if forced
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = -1;
  int world = 1;
  int node_size = 0;          // ranks per node of the run's profile (hierarchical all-reduce groups them)
  int64_t count = 0;          // elements per rank buffer (in_count)
  int64_t bytes = 0;          // payload (nccl-tests S)
  int steps = 0;              // total algorithm steps
  int steps_done = 0;         // steps every rank has finished (the pending step's index)
  std::vector<int> rank_steps_done;  // per rank
  std::vector<int> arrived;   // ranks that arrived, in arrival order (while in flight)
  std::vector<int> missing;
  std::vector<StepTransfer> last;     // transfers of step steps_done - 1 (what just moved)
  std::vector<StepTransfer> pending;  // transfers of step steps_done (what moves next)
  RingPhase phase = RingPhase::None;  // of the pending step (or the last one when done)
  // Buffer cells, [rank][chunk]: how many ranks' contributions the chunk holds (1 = only its
  // own data, world = the final sum; 0 = not yet received, for all-gather outputs). Ring ops have
  // `world` chunks; tree and naive use one cell per rank buffer.
  int chunks = 1;
  std::vector<std::vector<int>> cells;
  // Cost model: predicted duration and bandwidths (GB/s, nccl-tests conventions).
  double predicted_s = 0, algbw_gbs = 0, busbw_gbs = 0;
  double measured_s = -1;     // wall time, once done (rank 0)
  std::string label;          // "DDP bucket 1: 2.bias, 2.weight" when the collective is a bucket
  // The backend runs the collective whole (NCCL: one kernel), so no step of it is observed. While it
  // is in flight, `schematic_step` cycles through the algorithm's steps so the ring view can show
  // NCCL's order, marked as a schematic; the cells stay what was observed.
  bool opaque = false;
  int schematic_step = -1;
};

// The topology view: the run's profile drawn as nodes of GPUs on their fabric, NIC rails and the
// network, with the links the shown step of the collective crosses (CostModel::link_loads).
struct TopologyView {
  bool valid = false;               // the run has a cost model (a hardware profile)
  HardwareProfile profile;
  int world = 1;
  int step = -1, steps = 0;         // the shown step: the pending one, else the last; -1: none
  RingPhase phase = RingPhase::None;
  std::vector<StepTransfer> transfers;  // that step's
  double bytes = 0;                 // what each of its transfers moves (modeled)
  double seconds = 0;               // its modeled time: the slowest link, with contention
  std::vector<LinkLoad> links;      // the links it crosses, with their loads and times
};

// Launched: its all-reduce is issued and queued on the rank's comm worker behind earlier ones;
// AllReducing: that all-reduce is running (ranks arrived, steps under way).
enum class BucketState : uint8_t { Empty, Filling, Ready, Launched, AllReducing, Done };
const char* bucket_state_name(BucketState s);

struct BucketParam {
  int index = -1;             // into the model's parameters
  std::string name;
  int64_t bytes = 0;
  bool ready = false;         // gradient ready in the current backward pass
  int ready_order = -1;       // 0 = first gradient produced in this pass
};

// One of the collectives a comm hook issues for a bucket when it issues several (top-k's all-gathers
// of values and indices; PowerSGD's all-reduces of the whole tensors, P and Q).
struct BucketCollective {
  uint64_t seq = 0;
  int64_t bytes = -1;  // what each rank puts in (elements x dtype); -1 until rank 0 issued it
  bool done = false;   // rank 0 finished it
};

struct BucketView {
  int index = 0;
  int generation = 0;
  int64_t bytes = 0;
  int64_t wire_bytes = 0;           // what its collectives moved last (half of `bytes` under an fp16/bf16 comm hook)
  bool gathered = false;            // --comm-hook topk: its collectives are all-gathers of values and indices
  std::vector<BucketParam> params;  // in bucket layout order
  BucketState state = BucketState::Empty;
  int launch_order = -1;      // order launched in this pass (always == index: torch's rule)
  uint64_t seq = 0;           // its all-reduce (the first of `collectives`), once launched
  int collectives = 1;        // a comm hook's collectives for it this pass, numbered seq, seq + 1, ...
  std::vector<BucketCollective> parts;  // each of them when there are several (filled every frame)
  double allreduce_begin = 0, allreduce_end = 0;  // modeled seconds, once done
  // Collective `s` is one of this pass's for the bucket.
  bool owns(uint64_t s) const { return state >= BucketState::Launched && s >= seq && s < seq + static_cast<uint64_t>(collectives); }
};
// What part `k` of a bucket's `n` collectives carries under `hook`: "values" and "indices" (top-k), "whole
// tensors", "P" and "Q" (PowerSGD); "" for a bucket's one collective.
const char* bucket_part_name(CommHook hook, int k, int n);

// FSDP: one unit's flat parameter and what each rank holds of it right now (from FsdpUnit events).
struct UnitView {
  int index = 0;
  std::vector<std::string> names;       // its parameters, in flat order
  std::vector<int64_t> offsets, sizes;  // each parameter's place in the flat parameter
  std::vector<Shape> shapes;            // each parameter's shape (FSDP2 splits dim 0)
  int64_t numel = 0, chunk = 0;         // flat elements; shard size ceil(numel / shard_world)
  int shard_world = 1;                  // ranks the flat parameter is split over (a node for HYBRID_SHARD)
  // Rank r owns chunk (r / owner_stride) % shard_world: --tp for the FSDP group (1 without it: each TP
  // rank's slice is sharded over the data-parallel ranks, every tp-th rank; a HYBRID_SHARD node's in
  // turn); --ep for an MoE block's experts, whose group is every ep-th rank (edp).
  int owner_stride = 1;
  bool experts = false;                 // an MoE block's experts (--ep), a unit of their own
  int owned_chunk(int r) const { return (r / std::max(1, owner_stride)) % std::max(1, shard_world); }
  // NO_SHARD and ZeRO-1 keep the unit whole on every rank; per rank, the elements [first, second) of
  // it that rank steps: all of them (NO_SHARD), or where its ZeRO-1 slice of the whole flat parameter
  // vector (under --ep: of its group's parameters) falls in this unit. Empty for the sharded layouts.
  std::vector<std::pair<int64_t, int64_t>> steps;
  std::vector<FsdpState> state;         // per rank
  std::vector<uint8_t> gathered;        // per rank: full parameters materialized (GatheredParameters)
  std::vector<uint8_t> gathering;       // per rank: its all-gather is under way
  std::vector<uint8_t> reducing;        // per rank: its gradient's reduction is under way
  std::vector<int16_t> post_forward;    // per rank: FSDP2 reshard_after_forward=N kept a 1/N shard (N), else 0
  uint64_t gather_seq = UINT64_MAX;     // the latest all-gather / reduction on the world (UINT64_MAX:
  uint64_t reduce_seq = UINT64_MAX;     // none yet, or a process group's)
};
// Pipeline: the schedule as planned and as it ran, from PipelineAction events (the pipeline view).
// An action's event is recorded when it ends, so the ones here are finished.
struct PipelineActionView {
  Action action;                              // stage, F/B/I/W, micro-batch
  int step = 0;                               // its time step in the planned grid
  double model_begin = 0, model_end = 0;      // modeled seconds: from its input's arrival to its end
  int64_t wall_begin_ns = 0, wall_end_ns = 0;
  int64_t bytes = 0;                          // the activation or gradient it sent
};

struct PipelineRankView {
  int pipe_rank = 0, replica = 0;
  std::vector<PipelineActionView> done;  // the shown iteration's finished actions, in order
  int next = 0;              // index into the planned row's actions of its current one (done.size())
  bool at_gate = false;      // paused at the gate before that action (else it runs or waits for input)
  int peak_inflight = 0;     // shown iteration: most micro-batches between their F and their B or I
  double bubble = -1;        // last finished iteration: idle / its replica's makespan (modeled); -1: none
  double reported_bubble = -1;  // the runtime's StepReport.bubble of that iteration
};

// One row of the pipeline chart: a pipeline rank of replica 0. With --tp its TP group's ranks run the
// same actions; the row shows the group's first rank.
struct PipelineRowView {
  int rank = 0;         // the world rank whose actions the row shows (the shown replica's, at the focus's TP rank)
  std::string ranks;    // every world rank of the row: "rank 1", "ranks 2, 3"
  std::string label;    // "stage 1: ranks 2, 3"; "stages 0, 2: rank 0" with v > 1
};

struct PipelineView {
  bool valid = false;
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int p = 1, m = 1, v = 1, dp = 1, tp = 1;
  int cp = 1;  // --cp: dp counts data-parallel indices, each replica's CP ranks (cp fastest)
  bool unit_costs = false;            // every action costs the same fixed modeled time
  PipelineSchedule plan;              // make_schedule(kind, p, m, v): [pipeline rank][time step]
  int32_t iteration = -1;             // shown: the one under way, else the last finished
  bool complete = false;              // every rank finished the shown iteration
  int32_t bubble_iteration = -1;      // the iteration the measured bubbles are from
  // Mean durations of F, B, I, W in the shown (else last) iteration, per clock; unmeasured types 1 s.
  ActionCosts model_costs, wall_costs;
  bool costs_measured = false;
  BubbleFormula formula;              // formula_bubble(kind, p, m, v, model_costs)
  std::vector<int> formula_peak;      // per pipeline rank: formula_peak_inflight
  std::vector<PipelineRankView> ranks;  // world ranks (rank = (replica * p + pipeline rank) * tp + tp rank)
  std::vector<PipelineRowView> rows;    // per pipeline rank: the chart's rows
  int replica = 0;                      // the replica the rows show: the focused rank's (0 without a focus)
  std::string replica_ranks;            // its world ranks, "ranks 0-3"
  const PipelineRankView& row(int pipe_rank) const { return ranks[static_cast<size_t>(rows[static_cast<size_t>(pipe_rank)].rank)]; }
};

struct RankMemory {
  MemoryStats stats;          // current, and peaks of the current iteration
  // GPU runs: the rank's device as the driver counts it (cudaMemGetInfo: used = total - free, every
  // context and process on the GPU); -1 on the CPU.
  int64_t device_used = -1, device_total = -1;
};

// The step history's bound (Snapshot::history): every step of the newest kHistoryExact, and at most
// kHistoryThinned older points.
constexpr size_t kHistoryExact = 8192, kHistoryThinned = 8192;

struct StepPoint {
  int64_t step = 0;
  float loss = 0;
  double accuracy = 0;
  double overlap = -1;
  double samples_per_sec = 0;
  float loss_scale = 0;  // fp16: the scale this step's gradients carried (0: no loss scaler)
  bool skipped = false;  // fp16: every rank skipped the optimizer step (inf/NaN in the gradients)
  int64_t samples = 0;   // over every rank and micro-batch (a joined rank adds none)
  double grad_norm = -1;  // --clip-grad-norm: the whole model's gradient norm before clipping; -1: none
  double clip_coef = -1;  // the factor every gradient was multiplied by (1: not clipped)
};

// Who trains on a sample in the data view: a rank, or in a mesh (--tp, a pipeline) a data-parallel
// replica, every rank of which (its TP partners, all its stages) reads the same batches.
struct DataOwnerView {
  std::string name;   // "rank 3", "replica 1"
  std::string ranks;  // a replica's world ranks, "ranks 4-7"; "" for a rank
};

struct DataView {
  bool valid = false;
  std::string name;
  int64_t n = 0;
  int classes = 0;
  std::vector<float> xy;          // (n, 2): the first two features
  std::vector<int32_t> label;     // (n,)
  // Which owner (an index into `owners`) the DistributedSampler gives each sample in the shown
  // epoch (-1: none; a padded duplicate shows its first owner).
  std::vector<int16_t> owner;
  std::vector<DataOwnerView> owners;  // the ranks, or (by_replica) the data-parallel replicas
  bool by_replica = false;
  int64_t epoch = 0;              // the epoch the assignment is for
  bool set_epoch = true;          // false: the assignment as if set_epoch were never called
};

struct RunConfigView {
  Strategy strategy = Strategy::Single;
  std::string model, data, optimizer, profile;
  Algorithm algo = Algorithm::Ring;    // --algo (Default: auto, the tuning model's pick per call)
  Protocol proto = Protocol::Default;  // --proto (Default: auto)
  int world = 1;
  int64_t batch = 0, accum = 1, steps = 0;
  int64_t bucket_cap_bytes = 0, first_bucket_bytes = 0;
  bool find_unused_parameters = false, sized_first_iteration = false;  // DDP: how iteration 1 is bucketed
  CommHookSpec comm_hook;                 // DDP: --comm-hook (its buckets all-reduced in 16 bits, or top-k)
  // What the memory planner needs to put the run beside the other strategies (plan_memory).
  Sharding sharding = Sharding::NoShard;  // the run's: fsdp's setting; ddp and single are NO_SHARD
  int64_t num_params = 0;                 // Ψ of the running model (under LoRA its trainable adapters)
  int64_t frozen_params = 0;              // LoRA: the frozen base weights and biases (0 without LoRA)
  OptimizerKind optimizer_kind = OptimizerKind::AdamW;
  bool sgd_momentum = false;              // SGD keeps a momentum buffer
  bool wrap_layers = true;                // FSDP units: one per Linear (else the whole model)
  int64_t largest_unit_params = 0;        // the largest unit: biggest Linear (weight + bias) or Ψ
  int units_in_flight = 1;                // 2 with BACKWARD_PRE (the next unit gathered early)
  int node_size = 0;                      // HYBRID_SHARD: ranks per shard group
  int fsdp_api = 1;                       // 1: FullyShardedDataParallel (flat), 2: fully_shard (per-parameter Shard(0))
  int reshard_after_forward = -1;         // FSDP2: -1 true, 0 false, N (FsdpOptions)
  std::string device = "cpu";             // where the ranks' tensors live
  Roof roof;                              // one rank's compute ceiling and memory slope (the Roofline view)
  std::string backend = "threads";        // threads | socket (a launched world) | cuda | nccl
  std::string attached;                   // HOST:PORT of the launched run's monitor; "" for a run in this window
  Precision precision = Precision::FP32;  // --precision (mixed: 16-bit parameters/gradients, fp32 master weights)
  Precision amp = Precision::FP32;        // --amp (torch.autocast: fp32 parameters/gradients, 16-bit activations)
  bool reduce_fp32 = false;               // --reduce-dtype fp32: gradients reduce in float32 (DDP buckets, FSDP)
  GptSpec gpt;                            // a GPT's shape, its vocabulary the data's (empty for an MLP)
  bool activation_checkpointing = false;  // --activation-checkpointing
  int lora_rank = 0;                      // --lora-rank (0: no LoRA)
  // Every setting the run changes from TrainConfig's defaults, as (flag, value) rows of
  // engine/train/settings.h: what an attached run was launched with, in the launch command's words.
  std::vector<std::pair<std::string, std::string>> settings;
};

// A collective's process group as the mesh view lights it.
struct MeshGroup {
  bool valid = false;  // some collective has run, or the stepper holds a send/recv
  std::string name;    // "tp0" (the label's name), "the world" (group 0), or "send 0->2" (a held pair)
  std::vector<int> ranks;  // global ranks in group order
  CollectiveOp op = CollectiveOp::AllReduce;
  uint64_t order = 0;  // its Event::order: the newest wins
};

// The mesh view: the run's DP x PP x TP layout (engine/core/mesh.h) and the model each rank slices.
struct MeshView {
  MeshShape shape;                 // resolve_mesh(world, tp, stages); dp = world when that fails
  bool sequence_parallel = false;
  std::vector<int64_t> dims;       // the model spec D0..Dk: Linear l maps dims[l] -> dims[l+1]
  GptSpec gpt;                     // a GPT's shape (dims empty); its stages are GptRanges
  // Linear layers of each (virtual) pipeline stage: p*v ranges, stage s holding ranges s, s+p, ...;
  // one range of every Linear without a pipeline.
  std::vector<StageRange> stages;
  std::string error;               // why the world is no mesh of the run's tp and stages, else ""
  // Per rank, what it holds of each Linear of its stage(s), weight then bias:
  // "0.weight rows 32-63 of 64 (column-parallel)", "0.bias 32-63 of 64", ...
  std::vector<std::vector<std::string>> slices;
  MeshGroup group;                 // the shown collective's group (label "tp0: 0,1", or the world), or the held send/recv's pair
};

// The All-to-all view: one group's newest all-to-all (the one running, else the last), as an n x n
// matrix over its group (an EP group "ep0: 0,1", a CP group, or the world) from its events: each
// receiver's RingStep names the sender and the bytes received; a rank's block to itself is kept, a
// local copy, its issue's kept_count (the plain all_to_all's one block of n, or all_to_all_v's own count).
struct AllToAllView {
  bool valid = false;
  bool in_flight = false;      // some member has not finished it
  uint64_t seq = 0;            // the group's counter (the world's for group 0)
  int32_t group = 0;           // CollectiveInfo::group; 0: the world
  std::string group_name;      // "ep0"; "" for the world
  std::vector<int> members;    // global ranks in group order (0 .. world-1 for the world)
  DType dtype = DType::F32;
  bool split_sizes = false;    // all_to_all_v (a size per pair); else the plain one, equal blocks
  int n = 0;                   // members.size()
  Algorithm algo = Algorithm::Pairwise;  // pairwise exchange or grouped send/recv (collective.h)
  int steps = 0;               // pairwise exchange: n - 1 (step k - 1 sends to r + k); grouped: 1
  int steps_done = 0;          // steps every member finished
  int newest_step = -1;        // the highest step any member finished (the cells lit as just moved)
  // (n, n), row: the sender's group rank, column: the receiver's. -1: not yet moved (unknown). The
  // diagonal is each member's own block, kept (copied locally, never sent), known from its issue.
  std::vector<int64_t> bytes;
  std::vector<int64_t> sent;   // n: what each member sends the others (from its issue, its own block left out); -1 before it
  int64_t total = 0;           // every pair's bytes moved so far between different ranks
  std::string label;           // "ep0 #3 all_to_all of float32, 4.1 kB"
  int64_t at(int src, int dst) const { return bytes[static_cast<size_t>(src * n + dst)]; }
  // The step that moves src -> dst: (dst - src) mod n, minus 1 (grouped: 0, every pair at once); -1
  // for the diagonal (a local copy).
  int step_of(int src, int dst) const {
    return src == dst ? -1 : algo == Algorithm::Grouped ? 0 : ((dst - src) % n + n) % n - 1;
  }
};

// The Experts view (--moe): what each MoE block's router did in a rank's last forward
// (GptCore::moe_routing) and its trend over the last forwards (GptCore::moe_history). Read by the
// Session while the run stands still (like the attention grid); `read` false until then.
struct ExpertsBlockView {
  int layer = 0;                       // the block
  int64_t tokens = 0, capacity = 0;    // capacity per expert; 0: dropless
  std::vector<int64_t> routed, kept;   // (E): tokens that chose each expert, and the ones it computed
  int64_t dropped = 0;
  double aux_loss = 0;
  std::vector<float> imbalance_history, aux_history;  // oldest first
};
struct ExpertsView {
  bool moe = false;                    // the run's GPT has MoE blocks
  int64_t experts = 0, top_k = 0;
  double capacity_factor = 0;          // --moe capacity=F (0: dropless)
  int ep = 1;                          // --ep: ranks an EP group spreads each block's experts over
  bool read = false;
  bool current = false;                // read at the world's present stand-still (false once it moves on)
  int64_t at_step = 0;                 // the run's step when it was read
  std::vector<std::vector<ExpertsBlockView>> ranks;  // per world rank, its MoE blocks in order
  // The global rank holding expert e for rank `rank`'s tokens: its EP group's member (e / (E / ep)).
  int owner(int rank, int64_t e) const {
    return ep > 1 ? rank / ep * ep + static_cast<int>(e / (experts / ep)) : rank;
  }
};

// The Context view (--cp): each CP rank's share of the sequence and, for ring attention, the pass it
// runs now or ran last (GptCore::cp_pass of GptCore::cp_block): per ring step whose K/V block it met
// and the causal (query, key) pairs it computed. Read by the Session while the run stands still.
struct ContextPassView {
  bool valid = false;                  // false: no pass of this block yet
  bool backward = false;
  int steps_done = 0;                  // ring steps computed; the block in flight follows the last
  std::vector<int> held;               // per step: the CP rank whose K/V block it met
  std::vector<int64_t> pairs;          // per step: causal pairs per sample and head
  std::vector<int64_t> sent_bytes;     // per step: bytes it sent after the step
  bool sending = false;                // in (or held before) the sends after its last computed step
};
struct ContextRankView {
  int rank = 0;                        // world rank
  std::vector<int64_t> positions;      // the positions it holds, in its order
  int block = -1;                      // the GPT block of the pass running now or last (-1: none yet)
  std::vector<ContextPassView> passes; // per GPT block: its latest pass (forward, or backward once it ran)
  std::vector<ContextPassView> earlier;  // per GPT block: its last pass the other way (finished; invalid: none)
  const ContextPassView& pass() const {
    static const ContextPassView none;
    return block >= 0 && block < static_cast<int>(passes.size()) ? passes[static_cast<size_t>(block)] : none;
  }
  // Block `l`'s last pass that way: its latest, or the earlier one; invalid when it has none.
  const ContextPassView& pass(int l, bool backward) const {
    static const ContextPassView none;
    if (l < 0 || l >= static_cast<int>(passes.size())) return none;
    const ContextPassView& latest = passes[static_cast<size_t>(l)];
    if (latest.valid && latest.backward == backward) return latest;
    const ContextPassView& e = l < static_cast<int>(earlier.size()) ? earlier[static_cast<size_t>(l)] : none;
    return e.valid && e.backward == backward ? e : none;
  }
};
struct ContextView {
  bool cp = false;                     // the run splits the sequence (--cp > 1)
  int degree = 1;
  CpLayout layout = CpLayout::Ring;
  int64_t ctx = 0, heads = 0;          // T, and the heads a TP rank holds
  bool read = false;
  int64_t at_step = 0;
  std::vector<std::vector<int>> groups;  // every CP group's world ranks, in CP-rank order
  std::vector<ContextRankView> ranks;    // per world rank
  // The CP group holding world rank r.
  const std::vector<int>* group_of(int r) const {
    for (const auto& g : groups)
      for (int m : g)
        if (m == r) return &g;
    return nullptr;
  }
};

struct Snapshot {
  uint64_t frame = 0;
  // An imported PyTorch profiler trace (dtlab --open), once fully loaded; null otherwise. Immutable:
  // shared with the views and the loader without a lock.
  std::shared_ptr<const ImportedTrace> trace;
  RunConfigView config;
  // run state
  bool running = false;           // the engine thread is alive
  bool finished = false;
  std::string error;              // the run's failure (watchdog diagnosis), if any
  int64_t step = 0, total_steps = 0;
  int32_t iteration = -1;         // rank 0's current iteration
  StepperState stepper;           // paused, speed, per rank and lane: blocked at which gate
  // What the stepper holds for the views: the focus's next item if it has one, else the pending
  // item (engine/trace/stepper.h); invalid while the world runs or has not settled. When it is a
  // collective, `collective` shows that one.
  PendingItem held;
  std::vector<std::string> compute_activity, comm_activity;  // per rank
  // events: per rank, the recent window (last few iterations), oldest first
  std::vector<std::vector<Event>> events;
  std::vector<std::string> labels;  // recorder labels (Event bucket.label ids)
  double clock_now_model = 0;     // furthest modeled time seen
  int64_t clock_now_wall_ns = 0;  // recorder's wall clock now
  // derived views
  CollectiveView collective;      // the current/last stepped collective
  TopologyView topology;          // the profile and the links the collective's shown step uses
  MeshView mesh;                  // the DP x PP x TP layout (the mesh view)
  std::vector<BucketView> buckets;  // rank 0's current assignment and states
  int bucket_generation = 0;
  std::vector<UnitView> units;      // FSDP: every unit, every rank
  PipelineView pipeline;            // pipeline runs
  std::vector<RankMemory> memory;   // per rank
  // Per step (rank 0's report: all-reduced means), bounded for long runs: every step of the newest
  // kHistoryExact, and older ones thinned to every second, fourth, ... (thin_history).
  std::vector<StepPoint> history;
  int64_t steps_reported = 0;        // every report of the run, kept in history or not
  int64_t steps_skipped = 0;         // fp16: of them, the steps every rank skipped
  int64_t last_skipped_step = -1;    // fp16: the last of them (1-based; -1: none)
  DataView data;
  std::vector<std::string> param_names;  // model parameters
  // The All-to-all view's: every process group's newest all-to-all, the newest first (its group
  // combo), and the one it shows unless the user picks a group: the newest of the group of the
  // operation the stepper holds (`alltoall_held`) when that group has had one, else the newest of all.
  std::vector<AllToAllView> alltoall_groups;
  AllToAllView alltoall;
  bool alltoall_held = false;
  ExpertsView experts;               // MoE routing, read while the run stands still (the Experts view)
  ContextView context;               // context parallelism's chunks and ring passes (the Context view)
};

}  // namespace dtlab::app
