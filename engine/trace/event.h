// Trace events: everything the engine does that a view can show. One plain struct for every kind
// (fixed size, no allocation when recording), tagged by EventKind; fields not used by a kind are 0.
// Times: `wall_ns` since the recorder started (steady clock); `model_begin`/`model_end` in seconds
// on the modeled clock of the hardware profile (cost_model.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/collective.h"  // CollectiveOp, Algorithm, ReduceOp
#include "engine/core/memory.h"
#include "engine/core/observer.h"  // ComputeKind
#include "engine/core/pipeline_action.h"  // ActionType
#include "engine/core/tensor.h"  // DType

namespace dtlab {

enum class EventKind : uint8_t {
  Compute,         // a compute op, [begin, end]; `compute` says which
  CollectiveIssue, // the rank's compute thread issued the op (instant)
  Collective,      // the comm worker ran it, [begin, end]
  RingStep,        // one step of a ring/tree/naive algorithm, nested in its Collective, [begin, end]
  MemAlloc,        // instant; `mem`
  MemFree,         // instant; `mem`
  Iteration,       // one training iteration, [begin, end]
  Gate,            // the rank waited at a stepper gate, [begin, end]
  // DDP's reducer (engine/parallel/ddp.h); `bucket`
  BucketAssigned,  // a bucket of the current assignment (instant; at construction and rebuild)
  GradReady,       // a parameter's gradient is final for this backward pass (instant)
  BucketReady,     // every gradient of the bucket is in it (instant)
  BucketLaunch,    // the bucket's all-reduce is issued (instant, just before the call; `seq` names the collective, the first of `collectives`)
  BucketAllReduce, // the bucket's all-reduce on the comm lane, [begin, end]
  // FSDP's units (engine/parallel/fsdp.h); `fsdp`
  FsdpUnit,        // a unit's verb (layout, unshard, reshard, reduce) and its state after it (instant)
  // The pipeline runtime (engine/parallel/pipeline.h); `pipe`
  PipelineAction,  // one schedule action (F, B, I or W of a stage and micro-batch), [begin, end]
  // Mixed precision's loss scaler (engine/train/grad_scaler.h); `scaler`
  LossScale,       // the step's decision after the ranks agreed on inf/NaN (instant)
  // --clip-grad-norm (engine/train/grad_clip.h); `clip`
  GradClip,        // the whole model's gradient norm and the factor every gradient took (instant)
  // new values go at the end
};

enum class Lane : uint8_t { Compute, Comm };
enum class RingPhase : uint8_t { None, ReduceScatter, AllGather, Reduce, Broadcast, Gather };

const char* event_kind_name(EventKind k);
const char* compute_kind_name(ComputeKind k);  // "forward", "backward", "loss", ...
const char* ring_phase_name(RingPhase p);      // "reduce-scatter", "all-gather", ...

// A process group's label text (CollectiveInfo::group names it): "tp0: 0,1", its name and global
// ranks in group-rank order. parse_group_label reads it back; false for any other text.
std::string group_label(std::string_view name, const std::vector<int>& ranks);
bool parse_group_label(std::string_view text, std::string& name, std::vector<int>& ranks);
// "tp0: ranks 0,1", how views name a group (the label text when it does not parse).
std::string describe_group_label(std::string_view text);

struct ComputeInfo {
  ComputeKind kind;
  int16_t layer;   // Sequential index, or -1
  double flops;    // what the cost model charges
  double bytes;    // what the op reads and writes at least once (engine/core/op_cost.h); 0: not counted
};

struct CollectiveInfo {
  CollectiveOp op;
  Algorithm algo;  // resolved (never Default)
  ReduceOp reduce;
  DType dtype;
  int16_t root;    // broadcast/reduce root, send/recv peer, else -1
  int16_t group_size;
  uint64_t seq;    // per-rank collective sequence number (same on every rank for one collective)
  int64_t in_count, out_count;  // elements ("In msg nelems", "Out msg nelems")
  int64_t bytes;   // payload size S used for algbw (nccl-tests convention); all_to_all_v: what leaves the rank
  Protocol proto;  // what the tuning model picked or the run forced (Default: not tuned)
  // All-to-all: true for all_to_all_v (a size per pair, `in_count` the elements it sends in all);
  // false for the plain one (equal blocks: in_count / group_size elements to each rank).
  bool split_sizes;
  // The process group it ran in: 0 for the whole world, else 1 + the TraceRecorder label id of its
  // name and global ranks ("tp0: 0,1"). A group's `seq` counts that group's collectives.
  int32_t group;
  // All-to-all: the elements of this rank's block to itself, which it copies locally and never sends
  // (in_count - kept_count leave it); 0 for the other ops.
  int64_t kept_count;
};

struct RingStepInfo {
  uint64_t seq;    // the collective's sequence number
  RingPhase phase;
  int16_t step;    // 0 .. steps-1 within the collective
  int16_t steps;   // total steps of this algorithm (2(n-1) for ring all-reduce)
  int16_t chunk;   // chunk index moved (or -1)
  int16_t src, dst;
  int64_t bytes;   // bytes this rank received in this step
  int32_t group;   // the collective's process group, as CollectiveInfo::group (0: the world)
};

// DDP bucket events. Names (the bucket's parameter list, or one parameter's name) are interned in
// the recorder: TraceRecorder::label(label).
struct BucketInfo {
  int16_t bucket;       // index in launch order (bucket 0 is all-reduced first)
  int16_t num_buckets;
  int32_t param;        // GradReady: index into the model's parameters(); else -1
  int32_t label;        // TraceRecorder label id: "2.weight" (GradReady) or "2.bias, 2.weight"
  int32_t generation;   // assignment: 0 at construction, 1 after the rebuild
  int32_t num_params;   // parameters in the bucket
  int64_t bytes;        // GradReady: the parameter's gradient bytes; else the bucket's
  uint64_t seq;         // BucketLaunch / BucketAllReduce: the all-reduce's collective number
  // BucketLaunch: the collectives a comm hook issues for the bucket, numbered seq, seq + 1, ... (top-k: 2
  // all-gathers; PowerSGD: 3 all-reduces once it compresses); 0 or 1: the one all-reduce.
  int32_t collectives;
};

// FSDP2's per-unit training state (torch TrainingState) and the verbs that move it.
enum class FsdpState : uint8_t { Idle, Forward, PreBackward, PostBackward };
enum class FsdpVerb : uint8_t {
  Layout,        // at construction: the unit's flat parameter (numel, chunk, label = its parameters)
  Unshard,       // its all-gather was issued (seq)
  Unsharded,     // the all-gather finished: the full parameters are bound
  Reshard,       // the gathered parameters were freed
  ReduceGrad,    // its gradient's reduce-scatter (all-reduce when not sharded) was issued (seq)
  GradReduced,   // that reduction finished and was post-divided
  State,         // the unit's state changed with nothing moved (a root unit that stays gathered)
};
const char* fsdp_state_name(FsdpState s);  // "IDLE", "FORWARD", "PRE_BACKWARD", "POST_BACKWARD"
const char* fsdp_verb_name(FsdpVerb v);    // "layout", "unshard", ...

struct FsdpInfo {
  int16_t unit, num_units;
  FsdpState state;      // after the verb
  FsdpVerb verb;
  int16_t shard_world;  // ranks a flat parameter is split over (the node group for HYBRID_SHARD)
  int32_t label;        // Layout: "0.weight, 0.bias" (TraceRecorder label id)
  int64_t numel, chunk; // the unit's flat parameter and its shard size (ceil(numel/shard_world))
  uint64_t seq;         // Unshard/ReduceGrad: the collective's number on the world (UINT64_MAX: a group's);
                        // Reshard: N when FSDP2's reshard_after_forward=N kept a 1/N shard, else UINT64_MAX
};

// A pipeline action on the compute lane: from the moment its input is there (the received
// activation or gradient) to the end of its compute, its send issued. The gaps between a rank's
// actions are its bubbles; the Recv collectives on the comm lane show what it waited for.
struct PipelineActionInfo {
  int16_t stage;         // model-order stage, 0 .. num_stages-1 (on rank stage % ranks)
  int16_t mb;            // micro-batch
  ActionType type;       // Forward, Backward, BackwardInput or BackwardWeight
  int16_t step;          // the action's time step in the schedule's grid (format_schedule's row)
  int16_t index;         // its position in this rank's action list
  int16_t num_stages;    // p*v
  int16_t microbatches;  // m
  int16_t ranks;         // p: ranks per pipeline
  int16_t replica;       // data-parallel replica (world rank / (p x tp))
  int64_t bytes;         // activation or gradient bytes it sent (0: none, e.g. the last stage's F)
};

// fp16 GradScaler: the scale this step's gradients carried, whether this rank found an inf or NaN in
// them, whether the ranks skipped the step (any rank found one), and the scale the next step uses.
struct LossScaleInfo {
  float scale;
  float next_scale;
  uint8_t found_inf;  // this rank's own finding
  uint8_t skipped;    // agreed by every rank
  int64_t growth_tracker;  // steps in a row without inf/NaN after this one
};

// --clip-grad-norm: clip_grad_norm_'s total norm (before clipping, the same on every rank) and the
// factor min(1, max_norm / (norm + 1e-6)) the step's gradients were multiplied by.
struct GradClipInfo {
  double total_norm;
  float max_norm;
  float coef;
};

struct MemInfo {
  MemCategory category;
  int64_t bytes;        // size of this allocation or free
  int64_t current;      // category total after it
  int64_t total;        // all categories after it
};

struct Event {
  uint64_t order = 0;     // global sequence across ranks: the order events were recorded
  int64_t wall_begin_ns = 0, wall_end_ns = 0;
  double model_begin = 0, model_end = 0;
  int32_t rank = 0;
  int32_t iteration = -1;
  EventKind kind = EventKind::Compute;
  Lane lane = Lane::Compute;
  union {
    ComputeInfo compute;
    CollectiveInfo coll;
    RingStepInfo step;
    MemInfo mem;
    BucketInfo bucket;
    FsdpInfo fsdp;
    PipelineActionInfo pipe;
    LossScaleInfo scaler;
    GradClipInfo clip;
  };
  Event() : coll{} {}
  // A span [begin, end] on both clocks (an instant when begin == end); the payload is the caller's.
  Event(EventKind k, Lane l, int64_t wall_begin, int64_t wall_end, double model_b, double model_e)
      : wall_begin_ns(wall_begin), wall_end_ns(wall_end), model_begin(model_b), model_end(model_e),
        kind(k), lane(l), coll{} {}
};

}  // namespace dtlab
