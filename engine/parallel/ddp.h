// DistributedDataParallel, rebuilt from PyTorch's reducer (torch/csrc/distributed/c10d/reducer.cpp
// and nn/parallel/distributed.py) so the classroom sees its real behaviour:
//   - construction checks that every rank holds the same parameter shapes, broadcasts rank 0's
//     parameters, and assigns parameters to buckets with compute_bucket_assignment_by_size
//     (first bucket cap, then bucket cap; reversed, so bucket 0 holds the LAST parameters);
//   - during backward a hook fires per parameter as its gradient becomes final; the gradient is
//     multiplied by 1/world_size as it is copied into its bucket; a bucket whose gradients are all
//     in is launched, strictly in bucket order, as an asynchronous SUM all-reduce on the rank's
//     communication worker, so it overlaps the rest of backward;
//   - finalize_backward() waits for every bucket (the optimizer step needs the averaged gradients);
//   - gradient_as_bucket_view: each .grad IS its slice of the bucket (one gradient-sized buffer less);
//   - at construction, with find_unused_parameters=False (torch's default) the assignment is ONE
//     bucket holding every gradient (torch's _ddp_init_helper passes bucket_size_limits =
//     [sys.maxsize]: the model's definition order may not be the order gradients arrive in);
//     after the first synchronised backward the buckets are rebuilt once, sized {first bucket,
//     cap}, in the order gradients actually became ready (rank 0's order broadcast to all), unless
//     static buckets are asked for; with find_unused_parameters=True the sized assignment is used
//     from the start and never rebuilt. When the cap is given explicitly (bucket_cap_mb=...),
//     current torch makes the first bucket as large as the others; the callers apply that rule.
//     `sized_first_iteration` is dtlab's labeled option to see sized buckets in iteration 1 too;
//   - find_unused_parameters: parameters the forward did not use are marked ready at the start of
//     backward. Without it a bucket whose gradient never comes is never launched: backward ends
//     anyway, the reduction stays unfinished, and the NEXT forward fails with torch's "Expected to
//     have finished reduction in the prior iteration" error, naming the parameters. Ranks whose
//     forward did use them launched that all-reduce and wait in it: the hang, until the watchdog;
//   - no_sync (gradient accumulation): prepare_for_backward(false) lets gradients accumulate locally.
//
// Sources: docs/course_sources.md (torch/nn/parallel/distributed.py, _ddp_init_helper;
// torch/csrc/distributed/c10d/reducer.cpp, rebuild_buckets and ensure_prior_reduction_finished).
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"
#include "engine/core/optim.h"
#include "engine/core/tensor.h"
#include "engine/trace/context.h"

namespace dtlab {

inline constexpr int64_t kDefaultFirstBucketBytes = int64_t{1} << 20;  // torch kDefaultFirstBucketBytes
inline constexpr int64_t kDefaultBucketBytesCap = int64_t{25} << 20;   // bucket_cap_mb=25

struct BucketAssignment {
  std::vector<std::vector<int>> buckets;  // parameter indices, bucket 0 first
  std::vector<int64_t> size_limits;       // the limit each bucket was filled against
};

// torch's compute_bucket_assignment_by_size for one dtype and device. Walks the tensors in `order`
// (empty: 0, 1, ..., n-1), adding bytes[i] to the open bucket; when its total reaches the current
// limit (>=) the bucket closes and the next limit applies (the last one repeats). Leftovers form a
// last bucket. With an empty `order` the buckets are then sorted by their smallest index; with an
// explicit order (the gradient-ready order of a rebuild) they stay in walk order.
BucketAssignment compute_bucket_assignment_by_size(const std::vector<int64_t>& bytes,
                                                   const std::vector<int64_t>& limits,
                                                   const std::vector<int>& order = {});
// DDP's assignment at construction: the above over the parameters in model order with limits
// {first_bucket_bytes, bucket_cap_bytes}, reversed (bucket 0 holds the last parameters).
BucketAssignment initial_bucket_assignment(const std::vector<int64_t>& bytes,
                                           int64_t first_bucket_bytes, int64_t bucket_cap_bytes);
// What DDP assigns at construction: one bucket of every gradient (limit INT64_MAX, torch's
// sys.maxsize) unless find_unused_parameters or sized_first_iteration ask for the sized assignment.
struct DdpOptions;
BucketAssignment construction_bucket_assignment(const std::vector<int64_t>& bytes, const DdpOptions& opt);
// True for the one unlimited bucket of a find_unused_parameters=False first iteration.
inline bool is_unlimited_bucket(int64_t size_limit) { return size_limit == INT64_MAX; }
// The rebuild after iteration 1: the same limits over the gradient-ready order, not reversed.
BucketAssignment rebuilt_bucket_assignment(const std::vector<int64_t>& bytes,
                                           const std::vector<int>& ready_order,
                                           int64_t first_bucket_bytes, int64_t bucket_cap_bytes);

// Gradient bytes of each parameter, in model order: what the assignment walks (2 per element for a
// 16-bit model).
std::vector<int64_t> parameter_bytes(const Model& model);
// "bucket 0: 4.bias, 4.weight (780 B)" per bucket, for printing.
std::vector<std::string> describe_bucket_assignment(const Model& model, const BucketAssignment& a);

// DDP communication hooks (torch's register_comm_hook; docs/course_sources.md §6e): how each bucket
// is all-reduced. Fp16 and Bf16 are torch's fp16_compress_hook and bf16_compress_hook: the bucket's
// sum of gradients cast to the 16-bit dtype, divided there by the world size, all-reduced in 16 bits,
// and cast back into the bucket, half the bytes of a float32 all-reduce. TopK is top-k
// sparsification with error feedback (Stich, Cordonnier and Jaggi 2018, "Sparsified SGD with
// Memory"; docs/course_sources.md §6e): each rank adds its remembered error to the bucket, keeps the
// ceil(ratio x n) entries of largest magnitude (the lower index first on a tie), remembers the rest
// as its new error, and all-gathers the kept values (float32) and their indices (int64); every rank
// then adds every rank's entries into a zeroed bucket and divides by the world size.
// PowerSgd is torch's powerSGD_hook with PowerSGDState's defaults but rank and start (Vogels, Karimireddy
// and Jaggi 2019; docs/course_sources.md §6e): for `start` iterations a plain average; then each rank adds
// its error to the bucket, all-reduces the tensors not worth compressing ((n + m) r x 2 >= n m) as they
// are, and approximates each n x m gradient matrix M by P Q^T: Q (m x r, warm-started; drawn from torch's
// randn under a seed from numpy's RandomState(0) the first time) orthogonalized, P = M Q all-reduced
// (a sum) and orthogonalized, Q = M^T P all-reduced and divided by the world size, M = P Q^T; the error
// is what the rank held minus that average. (n + m) r floats per matrix instead of n m.
// error_feedback=false (TopK, PowerSgd; torch's PowerSGDState(use_error_feedback=False)): no error is
// kept, added or charged; top-k keeps the largest entries of the gradient alone and the rest is lost.
enum class CommHook : uint8_t { None, Fp16, Bf16, TopK, PowerSgd };
struct CommHookSpec {
  CommHook kind = CommHook::None;
  double topk_ratio = 0.01;  // TopK: the share of each bucket's entries a rank sends
  int powersgd_rank = 1;            // PowerSgd: matrix_approximation_rank
  int64_t powersgd_start = 1000;    // PowerSgd: start_powerSGD_iter (torch's default; > 1)
  bool error_feedback = true;       // TopK, PowerSgd: remember what was not sent (use_error_feedback)
  bool operator==(const CommHookSpec&) const = default;
};
const char* comm_hook_name(CommHook h);        // "none", "fp16", "bf16", "topk", "powersgd"
// "allreduce", "fp16_compress_hook", "bf16_compress_hook", "topk (error feedback)", "powerSGD_hook"; without
// error feedback "topk (no error feedback)", "powerSGD_hook (use_error_feedback=False)"
const char* comm_hook_torch_name(const CommHookSpec& h);
// What --comm-hook takes: "fp16", "topk:ratio=0.01", "powersgd:rank=1,start=2", with
// ",error_feedback=false" when it is off.
std::string comm_hook_text(const CommHookSpec& h);
// dtlab::Error naming the choices for anything else.
CommHookSpec parse_comm_hook(const std::string& text);

struct DdpOptions {
  int64_t bucket_cap_bytes = kDefaultBucketBytesCap;
  int64_t first_bucket_bytes = kDefaultFirstBucketBytes;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool rebuild_buckets = true;  // false: keep the construction-time buckets (--static-buckets)
  // Sized buckets from iteration 1 instead of torch's single first-iteration bucket (a lab option,
  // labeled as such; older torch releases behaved this way).
  bool sized_first_iteration = false;
  CommHookSpec comm_hook;  // --comm-hook
  // Parameters DDP leaves alone (torch's _ddp_params_and_buffers_to_ignore): not broadcast at
  // construction, in no bucket, never averaged; expert parallelism reduces its experts itself
  // (engine/parallel/expert_parallel.h). Indices into model.parameters().
  std::vector<int> ignored;
};

struct DdpBucket {
  std::vector<int> params;       // indices into model.parameters(), in layout order
  std::vector<int64_t> offsets;  // element offset of each parameter in `buffer`
  int64_t numel = 0;
  int64_t bytes = 0;
  int64_t size_limit = 0;
  Tensor buffer;                 // CommBuffers: the flat gradients, all-reduced in place
  Tensor compressed;             // a compression hook's 16-bit copy of `buffer`, all-reduced instead
  // TopK: this rank's kept values (float32) and indices (int64), and every rank's, all-gathered.
  Tensor topk_values, topk_indices, gathered_values, gathered_indices;
  int64_t topk = 0;              // entries each rank sends
  int64_t sent = 0;              // PowerSgd: the bytes this pass's collectives moved for the bucket
  WorkPtr work2;                 // TopK: the indices' all-gather (`work` gathers the values)
  std::string names;             // "4.bias, 4.weight"
  int32_t label = -1;            // `names` interned in the recorder
  // this backward pass
  int pending = 0;               // gradients not yet ready
  bool launched = false;
  WorkPtr work;
};

// One synchronised backward pass, on the modeled clock of the rank's hardware profile.
struct DdpIterationStats {
  int32_t iteration = -1;
  double backward_begin = 0, backward_end = 0;  // compute lane
  double comm_seconds = 0;        // the buckets' all-reduces on the comm lane
  double overlapped_seconds = 0;  // the part of comm_seconds inside [backward_begin, backward_end]
  double wall_comm_seconds = 0;
  int64_t bytes = 0;              // all-reduced this pass
  int64_t uncompressed_bytes = 0; // what the buckets hold (bytes, but for a compression hook)
  // Share of communication hidden behind backward compute (1 when there was no communication).
  double overlap() const { return comm_seconds > 0 ? overlapped_seconds / comm_seconds : 1.0; }
};

class DistributedDataParallel {
 public:
  // Collective: every rank constructs its DDP at the same point. `ctx` may be null (no events,
  // no modeled clock, no pause-aware stall). Mixed precision (a 16-bit model): buckets hold and
  // all-reduce the gradients in the training dtype (torch's DDP on a bf16 model; NCCL sums in 16 bits);
  // reduce_fp32 all-reduces them in float32 instead (--reduce-dtype fp32, as FSDP's
  // MixedPrecision(reduce_dtype=float32) or a widening comm hook), rounding the average back into the
  // 16-bit gradients. No effect on a float32 model. With gradient_as_bucket_view each grad16 is its
  // slice of a 16-bit bucket (the model's 16-bit gradient buffer is freed); not with reduce_fp32.
  DistributedDataParallel(Model& model, Communicator& comm, RankContext* ctx, const DdpOptions& opt,
                          bool reduce_fp32 = false);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Before each forward: throws torch's "Expected to have finished reduction in the prior
  // iteration" error when the last synchronised backward left a bucket unlaunched; otherwise
  // rebuilds the buckets once, when due (a collective on every rank).
  void before_forward();
  // Before each backward; sync = false inside no_sync() (gradients accumulate locally). With
  // find_unused_parameters, marks the parameters the last forward did not use as ready, and notes
  // which it used (the local-used map, whose all-reduce follows the last bucket's).
  void prepare_for_backward(bool sync = true);
  // Pass to Model::backward().
  const Model::GradReadyHook& grad_ready_hook() const { return hook_; }
  // After backward: on a synchronised pass waits for every launched bucket and leaves each
  // parameter's .grad holding the average over ranks. A bucket that never became ready (a
  // parameter without gradient) is not waited for, as in torch: the gradients stay local and the
  // next before_forward() throws. Throws CommError when a collective failed.
  void finalize_backward();

  // torch.distributed.algorithms.Join with DDP's join hook (docs/course_sources.md §19), on a rank
  // whose data ran out. shadow_backward() is _match_all_reduce_for_bwd_pass: one all-reduce of zeros
  // per bucket, in bucket order, all launched and then waited, matching the bucket all-reduces of the
  // ranks still training (their average still divides by the whole world: torch's default
  // divide_by_initial_world_size=True); this rank's gradients are untouched. With
  // find_unused_parameters it then all-reduces a map of zeros (_match_unused_params_allreduce):
  // it used no parameter.
  void shadow_backward();
  // The join hook's post-hook, _sync_final_model, once every rank has joined: the ranks agree on the
  // highest rank among the last joiners (an all-reduce MAX) and broadcast its parameters, so a rank
  // that joined early (and stopped stepping) ends with the trained model. A collective on every rank.
  void sync_final_model(bool last_joiner);

  // For Optimizer::step: each parameter with its current .grad (inside the buckets with
  // gradient_as_bucket_view).
  std::vector<Optimizer::Segment> optimizer_segments();
  std::vector<Optimizer::Segment16> optimizer_segments16();  // mixed precision: data16 and grad16

  const std::vector<DdpBucket>& buckets() const { return buckets_; }
  int generation() const { return generation_; }  // 0, or 1 after the rebuild
  bool rebuilt() const { return generation_ > 0; }
  const DdpIterationStats& last_stats() const { return stats_; }
  const DdpOptions& options() const { return opt_; }
  std::vector<std::string> describe_buckets() const { return describe_bucket_assignment(model_, assignment_); }

 private:
  void verify_shapes();
  void assign(const BucketAssignment& a);
  void mark_ready(int p);
  void launch_ready_buckets();
  void leave_unfinished(int bucket);
  void record_bucket(EventKind kind, int bucket, int param = -1, int64_t seq = -1);  // seq: the all-reduce's, before it exists
  void copy_back(const DdpBucket& bk);
  DType bucket_dtype() const;
  // The collectives the next launched bucket issues, numbered from its launch's seq: 1, top-k's 2
  // all-gathers, or PowerSGD's 3 all-reduces once it compresses (psgd_iter_ before its increment).
  int hook_collectives() const;
  // A compression hook: the bucket cast into bk.compressed and divided by the world size there
  // (before its all-reduce), and the all-reduced average cast back into the bucket (after it).
  void compress(DdpBucket& bk);
  void decompress(DdpBucket& bk);
  void sparsify(DdpBucket& bk);    // TopK, before the all-gathers
  void densify(DdpBucket& bk);     // TopK, after them
  // PowerSgd: the whole hook at the bucket's launch (its three all-reduces depend on one another);
  // bk.work is the last one.
  void power_sgd(DdpBucket& bk, int index);
  struct PowerSgdBucket {
    Tensor error;                 // the rank's remembered error, float32 on the host (the Memory view's; none without error feedback)
    std::vector<float> p, q;      // the warm-started factors, every compressed matrix's in bucket order
    bool started = false;
  };
  std::vector<PowerSgdBucket> psgd_;  // per bucket index, as torch's error_dict, p_memory_dict, q_memory_dict
  int64_t psgd_iter_ = 0;             // PowerSGDState.iter: backward passes seen
  std::mt19937 psgd_rng_{0};          // numpy's RandomState(0) (random_seed): MT19937 seeded as init_genrand(0)
  bool casts() const { return opt_.comm_hook.kind == CommHook::Fp16 || opt_.comm_hook.kind == CommHook::Bf16; }
  Tensor wide_;                    // mixed precision: one parameter's gradient widened to float32 for its division
  Tensor error_;                   // TopK: the remembered error, float32, flat in parameters() order (none without error feedback)

  Model& model_;
  Communicator& comm_;
  RankContext* ctx_;
  DdpOptions opt_;
  bool reduce_fp32_;
  int world_;
  std::vector<DdpBucket> buckets_;
  BucketAssignment assignment_;           // what buckets_ was built from
  std::vector<int> bucket_of_, slot_of_;  // per parameter
  // The parameters DDP reduces (all but DdpOptions::ignored), and each parameter's place among them
  // (-1: ignored): the bucket assignments walk only these, as torch's reducer never sees the others.
  std::vector<int> kept_, kept_at_;
  bool ignored(int p) const { return kept_at_[static_cast<size_t>(p)] < 0; }
  // An assignment over kept_ positions, in parameter indices.
  BucketAssignment from_kept(BucketAssignment a) const;
  std::vector<int64_t> kept_bytes() const;  // parameter_bytes() of kept_, in its order
  std::vector<int32_t> param_label_;
  std::vector<char> ready_;               // per parameter, this pass
  // find_unused_parameters: torch's local_used_map. Which kept parameters this rank's forwards used
  // since the last synchronised backward (no_sync's micro-batches included), all-reduced once the
  // last bucket has launched (Reducer::all_reduce_local_used_map) and read in finalize_backward: a
  // parameter no rank used keeps its .grad untouched. torch's map is int32; this one carries the same
  // counts (at most the world size, exact) in float32, 4 bytes each as there, because the
  // process-group communicators reduce floating-point types only.
  void launch_used_map();
  std::vector<float> used_local_;         // per kept parameter: 1 if used
  Tensor used_map_;                       // its device copy, the all-reduce's buffer
  WorkPtr used_work_;                     // the map's all-reduce in flight (null when none)
  std::vector<float> used_global_;        // after finalize: how many ranks used each kept parameter
  int next_launch_ = 0;
  bool syncing_ = false;                  // inside a synchronised backward
  int generation_ = 0;
  bool rebuild_due_ = false;
  std::vector<int> ready_order_;          // the first synchronised pass's gradient order
  std::string unfinished_;                // why the last reduction did not finish ("" when it did)
  int32_t pass_iteration_ = -1;
  DdpIterationStats stats_;
  Model::GradReadyHook hook_;
};

}  // namespace dtlab
