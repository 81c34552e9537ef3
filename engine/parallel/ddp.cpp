#include "engine/core/arith.h"
#include "engine/parallel/ddp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

std::string join_names(const Model& m, const std::vector<int>& params) {
  std::string s;
  for (size_t i = 0; i < params.size(); i++)
    s += (i ? ", " : "") + m.parameters()[static_cast<size_t>(params[i])].name;
  return s;
}

}  // namespace

BucketAssignment compute_bucket_assignment_by_size(const std::vector<int64_t>& bytes,
                                                   const std::vector<int64_t>& limits,
                                                   const std::vector<int>& order) {
  DTLAB_CHECK(!limits.empty(), "bucket assignment needs at least one size limit");
  std::vector<int> walk = order;
  if (walk.empty())
    for (size_t i = 0; i < bytes.size(); i++) walk.push_back(static_cast<int>(i));
  DTLAB_CHECK(walk.size() == bytes.size(), "bucket assignment order does not cover every tensor");
  BucketAssignment out;
  std::vector<int> open;
  int64_t open_bytes = 0;
  size_t limit = 0;
  for (int i : walk) {
    DTLAB_CHECK(i >= 0 && static_cast<size_t>(i) < bytes.size(), "bucket assignment index out of range");
    open.push_back(i);
    open_bytes += bytes[static_cast<size_t>(i)];
    if (open_bytes >= limits[limit]) {
      out.buckets.push_back(std::move(open));
      out.size_limits.push_back(limits[limit]);
      open.clear();
      open_bytes = 0;
      if (limit + 1 < limits.size()) limit++;
    }
  }
  if (!open.empty()) {
    out.buckets.push_back(std::move(open));
    out.size_limits.push_back(limits[limit]);
  }
  if (order.empty()) {
    // Sort by smallest index (each bucket's first entry, since the walk was ascending).
    std::vector<size_t> idx(out.buckets.size());
    for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return *std::min_element(out.buckets[a].begin(), out.buckets[a].end()) <
             *std::min_element(out.buckets[b].begin(), out.buckets[b].end());
    });
    BucketAssignment sorted;
    for (size_t i : idx) {
      sorted.buckets.push_back(out.buckets[i]);
      sorted.size_limits.push_back(out.size_limits[i]);
    }
    out = std::move(sorted);
  }
  return out;
}

BucketAssignment initial_bucket_assignment(const std::vector<int64_t>& bytes,
                                           int64_t first_bucket_bytes, int64_t bucket_cap_bytes) {
  BucketAssignment a = compute_bucket_assignment_by_size(bytes, {first_bucket_bytes, bucket_cap_bytes});
  std::reverse(a.buckets.begin(), a.buckets.end());
  std::reverse(a.size_limits.begin(), a.size_limits.end());
  return a;
}

BucketAssignment rebuilt_bucket_assignment(const std::vector<int64_t>& bytes,
                                           const std::vector<int>& ready_order,
                                           int64_t first_bucket_bytes, int64_t bucket_cap_bytes) {
  DTLAB_CHECK(!ready_order.empty() || bytes.empty(), "a rebuild needs the gradient-ready order");
  return compute_bucket_assignment_by_size(bytes, {first_bucket_bytes, bucket_cap_bytes}, ready_order);
}

BucketAssignment construction_bucket_assignment(const std::vector<int64_t>& bytes, const DdpOptions& opt) {
  if (opt.find_unused_parameters || opt.sized_first_iteration)
    return initial_bucket_assignment(bytes, opt.first_bucket_bytes, opt.bucket_cap_bytes);
  // torch: bucket_size_limits = [sys.maxsize] when find_unused_parameters=False (or static_graph).
  return initial_bucket_assignment(bytes, INT64_MAX, INT64_MAX);
}

std::vector<int64_t> parameter_bytes(const Model& model) {
  std::vector<int64_t> bytes;
  const int64_t elem = dtype_size(model.param_dtype());
  for (const auto& p : model.parameters()) bytes.push_back(p.numel * elem);
  return bytes;
}

std::vector<std::string> describe_bucket_assignment(const Model& model, const BucketAssignment& a) {
  const std::vector<int64_t> bytes = parameter_bytes(model);
  std::vector<std::string> lines;
  for (size_t b = 0; b < a.buckets.size(); b++) {
    int64_t total = 0;
    for (int p : a.buckets[b]) total += bytes[static_cast<size_t>(p)];
    lines.push_back("bucket " + std::to_string(b) + ": " + join_names(model, a.buckets[b]) + " (" + human_bytes(total) + ")");
  }
  return lines;
}

const char* comm_hook_name(CommHook h) {
  return h == CommHook::Fp16 ? "fp16" : h == CommHook::Bf16 ? "bf16" : h == CommHook::TopK ? "topk" : h == CommHook::PowerSgd ? "powersgd" : "none";
}

const char* comm_hook_torch_name(const CommHookSpec& h) {
  switch (h.kind) {
    case CommHook::Fp16: return "fp16_compress_hook";
    case CommHook::Bf16: return "bf16_compress_hook";
    case CommHook::TopK: return h.error_feedback ? "topk (error feedback)" : "topk (no error feedback)";
    case CommHook::PowerSgd: return h.error_feedback ? "powerSGD_hook" : "powerSGD_hook (use_error_feedback=False)";
    case CommHook::None: break;
  }
  return "allreduce";
}

std::string comm_hook_text(const CommHookSpec& h) {
  const std::string off = h.error_feedback ? "" : ",error_feedback=false";  // (a cast hook keeps none to switch off)
  if (h.kind == CommHook::PowerSgd)
    return "powersgd:rank=" + std::to_string(h.powersgd_rank) + ",start=" + std::to_string(h.powersgd_start) + off;
  if (h.kind != CommHook::TopK) return comm_hook_name(h.kind);
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%g", h.topk_ratio);
  return std::string("topk:ratio=") + ratio + off;
}

namespace {

// A hook's arguments after its colon in `text` ("topk:ratio=0.1,error_feedback=false"), as key=value
// pairs. error_feedback=true|false is taken into `h` here (anything else refused with the fix, after
// `example`); every other pair goes to `take` (false: refused with `usage`, as is a pair without '='
// or a trailing comma).
template <class Take>
void parse_hook_args(const std::string& text, CommHookSpec& h, const std::string& usage, const char* example, Take take) {
  const size_t colon = text.find(':');
  std::string rest = colon == std::string::npos ? std::string() : text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string kv = rest.substr(0, comma);
    rest = comma == std::string::npos ? std::string() : rest.substr(comma + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || (comma != std::string::npos && rest.empty())) throw Error(usage);
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "error_feedback") {
      if (value != "true" && value != "false")
        throw Error("--comm-hook " + text + ": error_feedback takes true or false (false: nothing that was not sent is remembered, "
                    "torch's use_error_feedback=False), e.g. " + example);
      h.error_feedback = value == "true";
    } else if (!take(key, value)) {
      throw Error(usage);
    }
  }
}

}  // namespace

CommHookSpec parse_comm_hook(const std::string& text) {
  CommHookSpec h;
  if (text == "none") return h;
  if (text == "fp16" || text == "bf16") {
    h.kind = text == "fp16" ? CommHook::Fp16 : CommHook::Bf16;
    return h;
  }
  if (text == "topk" || text.rfind("topk:", 0) == 0) {
    h.kind = CommHook::TopK;
    const std::string usage = "--comm-hook " + text + ": write topk:ratio=F[,error_feedback=false] with F in (0, 1], the share of each "
                              "bucket's entries a rank sends, e.g. topk:ratio=0.01";
    parse_hook_args(text, h, usage, "topk:ratio=0.01,error_feedback=false", [&](const std::string& key, const std::string& val) {
      char* end = nullptr;
      const double r = std::strtod(val.c_str(), &end);
      if (key != "ratio" || val.empty() || *end != '\0' || !(r > 0 && r <= 1)) return false;
      h.topk_ratio = r;
      return true;
    });
    return h;
  }
  if (text == "powersgd" || text.rfind("powersgd:", 0) == 0) {
    h.kind = CommHook::PowerSgd;
    const std::string usage = "--comm-hook " + text + ": write powersgd:rank=R[,start=S][,error_feedback=false] with R >= 1 "
                              "(matrix_approximation_rank) and S >= 2 (start_powerSGD_iter: torch needs two plain iterations first), "
                              "e.g. powersgd:rank=1,start=2";
    parse_hook_args(text, h, usage, "powersgd:rank=1,start=2,error_feedback=false", [&](const std::string& key, const std::string& val) {
      char* end = nullptr;
      const long long v = std::strtoll(val.c_str(), &end, 10);
      if (val.empty() || *end != '\0') return false;
      if (key == "rank" && v >= 1 && v <= 1024) h.powersgd_rank = static_cast<int>(v);
      else if (key == "start" && v >= 2 && v <= 1000000000) h.powersgd_start = v;
      else return false;
      return true;
    });
    return h;
  }
  throw Error("--comm-hook " + text + " is not a communication hook; choose none, fp16 (torch's fp16_compress_hook), bf16 "
              "(bf16_compress_hook), topk:ratio=F (top-k with error feedback) or powersgd:rank=R,start=S (powerSGD_hook), "
              "each of the last two with ,error_feedback=false to drop what was not sent");
}

// ---------------------------------------------------------------------------------------------

DistributedDataParallel::DistributedDataParallel(Model& model, Communicator& comm, RankContext* ctx,
                                                 const DdpOptions& opt, bool reduce_fp32)
    : model_(model), comm_(comm), ctx_(ctx), opt_(opt), reduce_fp32_(reduce_fp32), world_(comm.world_size()) {
  if (opt_.bucket_cap_bytes < 1) throw Error("the DDP bucket cap must be at least 1 byte; raise --bucket-cap-mb");
  if (opt_.first_bucket_bytes < 1) throw Error("the first DDP bucket cap must be at least 1 byte; raise --first-bucket-mb");
  DTLAB_CHECK(!(opt_.gradient_as_bucket_view && model_.mixed() && reduce_fp32_),
              "gradient_as_bucket_view with float32 buckets for 16-bit gradients; drop one of them");
  const auto& ps = model_.parameters();
  for (const auto& p : ps) param_label_.push_back(ctx_ && ctx_->recorder() ? ctx_->recorder()->intern(p.name) : -1);
  kept_at_.assign(ps.size(), 0);
  for (int i : opt_.ignored) {
    DTLAB_CHECK(i >= 0 && i < static_cast<int>(ps.size()), "DDP: an ignored parameter index is out of range");
    kept_at_[static_cast<size_t>(i)] = -1;
  }
  for (int i = 0; i < static_cast<int>(ps.size()); i++)
    if (kept_at_[static_cast<size_t>(i)] >= 0) {
      kept_at_[static_cast<size_t>(i)] = static_cast<int>(kept_.size());
      kept_.push_back(i);
    }
  if (ctx_) ctx_->set_activity("constructing DDP: checking parameter shapes across ranks");
  verify_shapes();
  // Every rank starts from rank 0's parameters (torch's _sync_module_states): all at once, or each run
  // of the parameters it does not ignore.
  if (ctx_) ctx_->set_activity("constructing DDP: broadcasting parameters from rank 0");
  char* const params = model_.mixed() ? reinterpret_cast<char*>(model_.params16()) : reinterpret_cast<char*>(model_.params());
  const int64_t elem = dtype_size(model_.param_dtype());
  if (opt_.ignored.empty()) {
    comm_.broadcast(params, model_.num_params(), model_.param_dtype(), 0)->wait();
  } else {
    std::vector<std::pair<int64_t, int64_t>> runs;
    std::vector<int> by_offset = kept_;
    std::sort(by_offset.begin(), by_offset.end(), [&](int a, int b) { return ps[static_cast<size_t>(a)].offset < ps[static_cast<size_t>(b)].offset; });
    for (int i : by_offset) {
      const Parameter& q = ps[static_cast<size_t>(i)];
      if (!runs.empty() && runs.back().second == q.offset) runs.back().second += q.numel;
      else runs.push_back({q.offset, q.offset + q.numel});
    }
    for (const auto& [b, e] : runs) comm_.broadcast(params + b * elem, e - b, model_.param_dtype(), 0)->wait();
  }

  const std::vector<int64_t> bytes = kept_bytes();
  assign(from_kept(construction_bucket_assignment(bytes, opt_)));
  hook_ = [this](int p) { mark_ready(p); };
  if (ctx_) ctx_->set_activity("running");
}

std::vector<int64_t> DistributedDataParallel::kept_bytes() const {
  const std::vector<int64_t> all = parameter_bytes(model_);
  std::vector<int64_t> bytes;
  for (int i : kept_) bytes.push_back(all[static_cast<size_t>(i)]);
  return bytes;
}

BucketAssignment DistributedDataParallel::from_kept(BucketAssignment a) const {
  for (auto& b : a.buckets)
    for (int& p : b) p = kept_[static_cast<size_t>(p)];
  return a;
}

DistributedDataParallel::~DistributedDataParallel() {
  // Never leave the model pointing into buffers that are about to go away.
  if (opt_.gradient_as_bucket_view) {
    for (auto& p : model_.parameters()) p.grad = nullptr, p.grad16 = nullptr;
  }
}

void DistributedDataParallel::verify_shapes() {
  // torch's _verify_param_shape_across_processes: every rank shares a signature of its
  // parameters; a mismatch is a usage error, named with the first rank that differs.
  const auto& ps = model_.parameters();
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the shapes
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; i++) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& p : ps) {
    mix(p.shape.size());
    for (int64_t d : p.shape) mix(static_cast<uint64_t>(d));
  }
  int64_t mine[2] = {static_cast<int64_t>(ps.size()), static_cast<int64_t>(h >> 1)};
  std::vector<int64_t> all(static_cast<size_t>(2 * world_));
  // In the memory the communicator moves (a GPU's for cuda and nccl), then back on the host.
  Device& dev = model_.device();
  Tensor in({2}, MemCategory::Other, nullptr, DType::I64, dev), out({2 * world_}, MemCategory::Other, nullptr, DType::I64, dev);
  dev.upload(in.raw(), mine, sizeof mine);
  comm_.all_gather(out.raw(), in.raw(), 2, DType::I64)->wait();
  dev.download(all.data(), out.raw(), out.nbytes());
  for (int r = 1; r < world_; r++) {
    if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
    throw Error("DDP: rank " + std::to_string(r) + "'s model has " + std::to_string(all[2 * r]) +
                " parameters with shapes that differ from rank 0's (" + std::to_string(all[0]) +
                " parameters); every rank must wrap the same model");
  }
}

void DistributedDataParallel::assign(const BucketAssignment& a) {
  auto& ps = model_.parameters();
  std::vector<DdpBucket> fresh(a.buckets.size());
  bucket_of_.assign(ps.size(), -1);
  slot_of_.assign(ps.size(), -1);
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  for (size_t b = 0; b < a.buckets.size(); b++) {
    DdpBucket& bk = fresh[b];
    bk.params = a.buckets[b];
    bk.size_limit = a.size_limits[b];
    for (size_t s = 0; s < bk.params.size(); s++) {
      const int p = bk.params[s];
      DTLAB_CHECK(bucket_of_[static_cast<size_t>(p)] < 0, "a parameter assigned to two buckets");
      bucket_of_[static_cast<size_t>(p)] = static_cast<int>(b);
      slot_of_[static_cast<size_t>(p)] = static_cast<int>(s);
      bk.offsets.push_back(bk.numel);
      bk.numel += ps[static_cast<size_t>(p)].numel;
    }
    bk.bytes = bk.numel * dtype_size(bucket_dtype());
    bk.buffer = Tensor({bk.numel}, MemCategory::CommBuffers, mem, bucket_dtype(), model_.device());
    if (casts())  // the hook's 16-bit tensor, all-reduced in the bucket's place
      bk.compressed = Tensor({bk.numel}, MemCategory::CommBuffers, mem, opt_.comm_hook.kind == CommHook::Fp16 ? DType::F16 : DType::BF16,
                             model_.device());
    if (opt_.comm_hook.kind == CommHook::TopK) {
      bk.topk = std::min<int64_t>(bk.numel, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(opt_.comm_hook.topk_ratio * static_cast<double>(bk.numel)))));
      bk.topk_values = Tensor({bk.topk}, MemCategory::CommBuffers, mem, DType::F32, model_.device());
      bk.topk_indices = Tensor({bk.topk}, MemCategory::CommBuffers, mem, DType::I64, model_.device());
      bk.gathered_values = Tensor({bk.topk * world_}, MemCategory::CommBuffers, mem, DType::F32, model_.device());
      bk.gathered_indices = Tensor({bk.topk * world_}, MemCategory::CommBuffers, mem, DType::I64, model_.device());
    }
    bk.names = join_names(model_, bk.params);
    bk.label = ctx_ && ctx_->recorder() ? ctx_->recorder()->intern(bk.names) : -1;
  }
  for (size_t p = 0; p < ps.size(); p++)
    DTLAB_CHECK(bucket_of_[p] >= 0 || ignored(static_cast<int>(p)), "parameter " + ps[p].name + " is in no bucket");
  if (opt_.gradient_as_bucket_view) {
    // Each .grad becomes its slice of the bucket, keeping what it holds (torch copies the old
    // gradient into the new view on a rebuild). Mixed precision: the buckets are in the gradients'
    // 16-bit dtype (torch's buckets take their gradients' dtype), so grad16 is the view.
    const int64_t elem = dtype_size(bucket_dtype());
    for (size_t p = 0; p < ps.size(); p++) {
      if (ignored(static_cast<int>(p))) continue;
      DdpBucket& bk = fresh[static_cast<size_t>(bucket_of_[p])];
      void* view = static_cast<char*>(bk.buffer.raw()) + bk.offsets[static_cast<size_t>(slot_of_[p])] * elem;
      void* old = model_.mixed() ? static_cast<void*>(ps[p].grad16) : static_cast<void*>(ps[p].grad);
      if (old) model_.device().copy(view, old, ps[p].numel * elem);
      if (model_.mixed()) ps[p].grad16 = static_cast<uint16_t*>(view);
      else ps[p].grad = static_cast<float*>(view);
    }
    model_.release_gradient_storage();
  }
  buckets_ = std::move(fresh);  // frees the previous buckets after the copy above
  assignment_ = a;
  ready_.assign(ps.size(), 0);
  for (int b = 0; b < static_cast<int>(buckets_.size()); b++) record_bucket(EventKind::BucketAssigned, b);
}

void DistributedDataParallel::record_bucket(EventKind kind, int bucket, int param, int64_t seq) {
  if (!ctx_ || !ctx_->recorder()) return;
  const DdpBucket& bk = buckets_[static_cast<size_t>(bucket)];
  const int64_t now = ctx_->recorder()->now_ns();
  const double t = ctx_->compute_clock();
  Event e(kind, Lane::Compute, now, now, t, t);
  e.bucket.bucket = static_cast<int16_t>(bucket);
  e.bucket.num_buckets = static_cast<int16_t>(buckets_.size());
  e.bucket.param = param;
  e.bucket.generation = generation_;
  e.bucket.num_params = static_cast<int32_t>(bk.params.size());
  if (param >= 0) {
    e.bucket.label = param_label_[static_cast<size_t>(param)];
    e.bucket.bytes = model_.parameters()[static_cast<size_t>(param)].numel * dtype_size(model_.param_dtype());
  } else {
    e.bucket.label = bk.label;
    e.bucket.bytes = bk.bytes;
  }
  e.bucket.seq = seq >= 0 ? static_cast<uint64_t>(seq) : bk.work ? bk.work->seq() : 0;
  e.bucket.collectives = kind == EventKind::BucketLaunch ? hook_collectives() : 1;
  ctx_->record(e);
}

void DistributedDataParallel::before_forward() {
  if (!unfinished_.empty()) throw CommError(unfinished_);
  if (!rebuild_due_) return;
  rebuild_due_ = false;
  // Rank 0's gradient-ready order decides, broadcast to every rank (torch's sync_bucket_indices).
  const int P = static_cast<int>(kept_.size());  // (the order of the parameters DDP reduces, as their kept_ positions)
  if (ctx_) ctx_->set_activity("rebuilding DDP buckets: broadcasting rank 0's gradient order");
  std::vector<int64_t> order(static_cast<size_t>(P), -1);
  for (size_t i = 0; i < ready_order_.size() && i < order.size(); i++) order[i] = kept_at_[static_cast<size_t>(ready_order_[i])];
  Device& dev = model_.device();
  Tensor staged({P}, MemCategory::Other, nullptr, DType::I64, dev);
  dev.upload(staged.raw(), order.data(), staged.nbytes());
  comm_.broadcast(staged.raw(), P, DType::I64, 0)->wait();
  dev.download(order.data(), staged.raw(), staged.nbytes());
  std::vector<int> ready(order.begin(), order.end());
  std::vector<int> sorted = ready;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < P; i++)
    DTLAB_CHECK(sorted[static_cast<size_t>(i)] == i, "rank 0's gradient-ready order misses a parameter");
  generation_++;
  const std::vector<int64_t> bytes = kept_bytes();
  assign(from_kept(rebuilt_bucket_assignment(bytes, ready, opt_.first_bucket_bytes, opt_.bucket_cap_bytes)));
  if (ctx_) ctx_->set_activity("running");
}

void DistributedDataParallel::prepare_for_backward(bool sync) {
  if (opt_.find_unused_parameters) {  // every forward's use counts, no_sync's included (autograd_hook)
    used_local_.resize(kept_.size(), 0.0f);
    for (size_t k = 0; k < kept_.size(); k++)
      if (model_.parameter_used(kept_[k])) used_local_[k] = 1.0f;
  }
  syncing_ = sync;
  if (!sync) return;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& bk : buckets_) {
    bk.pending = static_cast<int>(bk.params.size());
    bk.launched = false;
    bk.work.reset();
  }
  next_launch_ = 0;
  pass_iteration_ = ctx_ ? ctx_->iteration() : -1;
  stats_ = DdpIterationStats{};
  stats_.iteration = pass_iteration_;
  stats_.backward_begin = ctx_ ? ctx_->compute_clock() : 0;
  if (opt_.find_unused_parameters) {
    // torch walks the autograd graph from the outputs; what it cannot reach is ready at once.
    for (int p = 0; p < static_cast<int>(model_.parameters().size()); p++)
      if (!model_.parameter_used(p) && !ignored(p)) mark_ready(p);
  }
}

void DistributedDataParallel::mark_ready(int p) {
  if (!syncing_ || ignored(p)) return;  // no_sync: gradients accumulate in .grad; an ignored one is not DDP's
  DTLAB_CHECK(!ready_[static_cast<size_t>(p)],
              "DDP: parameter " + model_.parameters()[static_cast<size_t>(p)].name +
                  " was marked ready twice in one backward pass");
  ready_[static_cast<size_t>(p)] = 1;
  const int b = bucket_of_[static_cast<size_t>(p)];
  DdpBucket& bk = buckets_[static_cast<size_t>(b)];
  Parameter& prm = model_.parameters()[static_cast<size_t>(p)];
  const int64_t at = bk.offsets[static_cast<size_t>(slot_of_[static_cast<size_t>(p)])];
  // A compression hook divides in its own dtype, after the cast (torch's reducer leaves the division
  // to a registered hook).
  const float scale = opt_.comm_hook.kind != CommHook::None ? 1.0f : 1.0f / static_cast<float>(world_);
  // Average as it goes in: grad / world_size, then a SUM all-reduce (torch's div_factor). On a GPU
  // this is a kernel on the compute stream behind the layer's backward; the bucket's all-reduce is
  // then ordered after it by an event (the communicator's), not by a host wait. A 16-bit gradient is
  // divided in float and rounded into a 16-bit bucket (or kept in float32 for an fp32 reduce).
  if (model_.mixed()) {
    const HalfFormat f = model_.half_format();
    Device& dev = model_.device();
    if (bk.buffer.dtype() == DType::F32 && !opt_.gradient_as_bucket_view) {  // widened into the fp32 bucket
      float* dst = bk.buffer.f32() + at;
      dev.widen_half(dst, prm.grad16, prm.numel, f);
      dev.scale(dst, prm.numel, scale);
    } else {  // divided in float and rounded once: in place (the view is the gradient), or into the 16-bit bucket
      if (wide_.numel() < prm.numel) wide_ = Tensor({prm.numel}, MemCategory::Other, nullptr, DType::F32, dev);
      dev.widen_half(wide_.f32(), prm.grad16, prm.numel, f);
      dev.scale(wide_.f32(), prm.numel, scale);
      dev.narrow_half(opt_.gradient_as_bucket_view ? prm.grad16 : bk.buffer.u16() + at, wide_.f32(), prm.numel, f);
    }
  } else if (opt_.gradient_as_bucket_view) {
    model_.device().scale(bk.buffer.f32() + at, prm.numel, scale);
  } else {
    model_.device().scale_copy(bk.buffer.f32() + at, prm.grad, prm.numel, scale);
  }
  if (generation_ == 0 && opt_.rebuild_buckets && !opt_.find_unused_parameters) ready_order_.push_back(p);
  record_bucket(EventKind::GradReady, b, p);
  const bool full = --bk.pending == 0;
  if (full) record_bucket(EventKind::BucketReady, b);
  // A stepped run can stop here, with the gradient in its bucket (the Buckets view fills cell by
  // cell, and shows the bucket ready at its last gradient, before the launch).
  if (ctx_) {
    const int64_t total = static_cast<int64_t>(bk.offsets.size());
    ctx_->gate_grad(p, prm.name + " landed in bucket " + std::to_string(b) + " (" + std::to_string(total - bk.pending) +
                           " of " + std::to_string(total) + " gradients" + (full ? ": the bucket is ready)" : ")"));
  }
  if (full) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // "Ignore this bucket if it's not its turn": all-reduces go out strictly in bucket order, so
  // every rank issues them in the same order whatever order its gradients arrived in.
  while (next_launch_ < static_cast<int>(buckets_.size()) &&
         buckets_[static_cast<size_t>(next_launch_)].pending == 0) {
    DdpBucket& bk = buckets_[static_cast<size_t>(next_launch_)];
    // The launch is recorded before the call: a stepped world pauses at the all-reduce's gate inside
    // it, and the Buckets view then shows the bucket launched (its collective's number is the next).
    bk.launched = true;
    record_bucket(EventKind::BucketLaunch, next_launch_, -1, static_cast<int64_t>(comm_.collectives_issued()));
    if (casts()) {
      compress(bk);
      bk.work = comm_.all_reduce(bk.compressed.raw(), bk.numel, bk.compressed.dtype(), ReduceOp::Sum);
    } else if (opt_.comm_hook.kind == CommHook::PowerSgd) {
      power_sgd(bk, next_launch_);
    } else if (opt_.comm_hook.kind == CommHook::TopK) {
      sparsify(bk);
      bk.work = comm_.all_gather(bk.gathered_values.raw(), bk.topk_values.raw(), bk.topk, DType::F32);
      bk.work2 = comm_.all_gather(bk.gathered_indices.raw(), bk.topk_indices.raw(), bk.topk, DType::I64);
    } else {
      bk.work = comm_.all_reduce(bk.buffer.raw(), bk.numel, bk.buffer.dtype(), ReduceOp::Sum);
    }
    next_launch_++;
  }
  if (opt_.find_unused_parameters && next_launch_ == static_cast<int>(buckets_.size())) launch_used_map();
}

void DistributedDataParallel::launch_used_map() {
  const int64_t n = static_cast<int64_t>(kept_.size());
  used_local_.resize(static_cast<size_t>(n), 0.0f);
  if (used_map_.numel() != n) used_map_ = Tensor({n}, MemCategory::CommBuffers, nullptr, DType::F32, model_.device());
  model_.device().upload(used_map_.raw(), used_local_.data(), used_map_.nbytes());
  used_work_ = comm_.all_reduce(used_map_.f32(), n, DType::F32, ReduceOp::Sum);
}

void DistributedDataParallel::shadow_backward() {
  std::vector<Tensor> zeros;
  std::vector<WorkPtr> works;
  zeros.reserve(4 * buckets_.size());  // (never reallocated: the works read them)
  for (size_t b = 0; b < buckets_.size(); b++) {
    if (opt_.comm_hook.kind == CommHook::PowerSgd) {  // torch's join hook runs the comm hook on zeroed buckets
      DdpBucket& zb = buckets_[b];
      zb.buffer.zero();
      power_sgd(zb, static_cast<int>(b));
      zb.work->wait();
      continue;
    }
    const DdpBucket& bk = buckets_[b];
    if (opt_.comm_hook.kind == CommHook::TopK) {  // zeros at index 0: they add nothing
      zeros.emplace_back(Shape{bk.topk}, MemCategory::CommBuffers, nullptr, DType::F32, model_.device());
      zeros.back().zero();
      Tensor& vals = zeros.back();
      zeros.emplace_back(Shape{bk.topk * world_}, MemCategory::CommBuffers, nullptr, DType::F32, model_.device());
      works.push_back(comm_.all_gather(zeros.back().raw(), vals.raw(), bk.topk, DType::F32));
      zeros.emplace_back(Shape{bk.topk}, MemCategory::CommBuffers, nullptr, DType::I64, model_.device());
      zeros.back().zero();
      Tensor& idx = zeros.back();
      zeros.emplace_back(Shape{bk.topk * world_}, MemCategory::CommBuffers, nullptr, DType::I64, model_.device());
      works.push_back(comm_.all_gather(zeros.back().raw(), idx.raw(), bk.topk, DType::I64));
      continue;
    }
    const DType dt = casts() ? bk.compressed.dtype() : bk.buffer.dtype();  // what the others send
    zeros.emplace_back(Shape{bk.numel}, MemCategory::CommBuffers, nullptr, dt, model_.device());
    zeros.back().zero();
    works.push_back(comm_.all_reduce(zeros.back().raw(), bk.numel, dt, ReduceOp::Sum));
  }
  for (WorkPtr& w : works) w->wait();
  if (opt_.find_unused_parameters) {  // _match_unused_params_allreduce: this rank used nothing
    std::fill(used_local_.begin(), used_local_.end(), 0.0f);
    launch_used_map();
    used_work_->wait();
    used_work_.reset();
  }
}

void DistributedDataParallel::sync_final_model(bool last_joiner) {
  const float source = all_reduce_value(comm_, last_joiner ? static_cast<float>(comm_.rank()) : -1.0f, ReduceOp::Max, model_.device());
  DTLAB_CHECK(source >= 0, "sync_final_model: no rank says it joined last");
  void* params = model_.mixed() ? static_cast<void*>(model_.params16()) : static_cast<void*>(model_.params());
  comm_.broadcast(params, model_.num_params(), model_.param_dtype(), static_cast<int>(source))->wait();
}

void DistributedDataParallel::finalize_backward() {
  if (!syncing_) return;
  syncing_ = false;
  stats_.backward_end = ctx_ ? ctx_->compute_clock() : 0;
  used_global_.clear();
  if (used_work_) {  // every bucket launched, and the local-used map after them
    used_work_->wait();
    used_work_.reset();
    used_global_.resize(kept_.size());
    model_.device().download(used_global_.data(), used_map_.raw(), used_map_.nbytes());
    std::fill(used_local_.begin(), used_local_.end(), 0.0f);  // the next synchronised pass starts a new map
  }
  for (int b = 0; b < static_cast<int>(buckets_.size()); b++) {
    DdpBucket& bk = buckets_[static_cast<size_t>(b)];
    if (!bk.launched) {
      leave_unfinished(b);
      return;
    }
    bk.work->wait();
    if (bk.work2) bk.work2->wait();
    const WorkTimes t = bk.work->times();
    stats_.comm_seconds += t.model_end - t.model_begin;
    stats_.overlapped_seconds += overlap_of(t.model_begin, t.model_end, stats_.backward_begin, stats_.backward_end);
    stats_.wall_comm_seconds += static_cast<double>(t.wall_end_ns - t.wall_begin_ns) * 1e-9;
    // What this rank sent: the 16-bit bucket, or its top-k values and indices.
    const int64_t moved = casts()                                        ? bk.compressed.nbytes()
                          : opt_.comm_hook.kind == CommHook::TopK     ? bk.topk_values.nbytes() + bk.topk_indices.nbytes()
                          : opt_.comm_hook.kind == CommHook::PowerSgd ? bk.sent
                                                                      : bk.bytes;
    stats_.bytes += moved;
    stats_.uncompressed_bytes += bk.bytes;
    if (casts()) decompress(bk);
    if (opt_.comm_hook.kind == CommHook::TopK) densify(bk);
    if (ctx_ && ctx_->recorder()) {
      Event e(EventKind::BucketAllReduce, Lane::Comm, t.wall_begin_ns, t.wall_end_ns, t.model_begin, t.model_end);
      e.bucket = BucketInfo{static_cast<int16_t>(b), static_cast<int16_t>(buckets_.size()), -1, bk.label,
                            generation_, static_cast<int32_t>(bk.params.size()), moved, bk.work->seq(), 0};
      ctx_->record(e);
    }
    if (!opt_.gradient_as_bucket_view) copy_back(bk);
  }
  if (generation_ == 0 && opt_.rebuild_buckets && !opt_.find_unused_parameters &&
      ready_order_.size() == kept_.size())
    rebuild_due_ = true;
}

namespace {

// A bucket's values in float32 on the host (a 16-bit model's widened exactly), and back.
std::vector<float> host_floats(const Tensor& t, HalfFormat f) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F32) {
    t.device().download(v.data(), t.raw(), t.nbytes());
  } else {
    std::vector<uint16_t> h(v.size());
    t.device().download(h.data(), t.raw(), t.nbytes());
    half_to_floats(v.data(), h.data(), t.numel(), f);
  }
  return v;
}

void store_floats(Tensor& t, const std::vector<float>& v, HalfFormat f) {
  if (t.dtype() == DType::F32) {
    t.device().upload(t.raw(), v.data(), t.nbytes());
  } else {
    std::vector<uint16_t> h(v.size());
    half_from_floats(h.data(), v.data(), t.numel(), f);
    t.device().upload(t.raw(), h.data(), t.nbytes());
  }
}

}  // namespace

// torch's _compress_hook: `bucket.buffer().to(dtype).div_(world_size)`, then the all-reduce (a sum),
// then `bucket.buffer().copy_(result)`. Each step rounds once: the cast, the division (computed in
// float, rounded to the 16-bit dtype), the ring's sums, and the copy back into a 16-bit bucket of the
// other format. A GPU's bucket is cast on the host (downloaded, cast, uploaded): these hooks' kernels
// are not built.
void DistributedDataParallel::compress(DdpBucket& bk) {
  const HalfFormat to = opt_.comm_hook.kind == CommHook::Fp16 ? HalfFormat::FP16 : HalfFormat::BF16;
  const std::vector<float> v = host_floats(bk.buffer, model_.half_format());
  std::vector<uint16_t> c(v.size());
  const float w = static_cast<float>(world_);
  for (size_t k = 0; k < v.size(); k++) c[k] = half_from_float(half_to_float(half_from_float(v[k], to), to) / w, to);
  model_.device().upload(bk.compressed.raw(), c.data(), bk.compressed.nbytes());
}

void DistributedDataParallel::decompress(DdpBucket& bk) {
  const HalfFormat from = opt_.comm_hook.kind == CommHook::Fp16 ? HalfFormat::FP16 : HalfFormat::BF16;
  store_floats(bk.buffer, host_floats(bk.compressed, from), model_.half_format());
}

// Top-k with error feedback (Stich et al. 2018's memory, kept in gradient units: a hook sees no
// learning rate). On the host, as the cast hooks; the error stays float32 whatever the bucket's dtype.
// Without error feedback no error exists: the top-k of the gradient alone, the rest dropped.
void DistributedDataParallel::sparsify(DdpBucket& bk) {
  const auto& ps = model_.parameters();
  const bool feedback = opt_.comm_hook.error_feedback;
  if (feedback && error_.empty()) {
    error_ = Tensor({model_.num_params()}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr, DType::F32, cpu_device());
    error_.zero();
  }
  std::vector<float> v = host_floats(bk.buffer, model_.half_format());
  float* err = feedback ? error_.f32() : nullptr;
  for (size_t s = 0; s < bk.params.size() && err; s++) {
    const Parameter& p = ps[static_cast<size_t>(bk.params[s])];
    for (int64_t i = 0; i < p.numel; i++) v[static_cast<size_t>(bk.offsets[s] + i)] += err[p.offset + i];
  }
  std::vector<int64_t> order(static_cast<size_t>(bk.numel));
  for (int64_t i = 0; i < bk.numel; i++) order[static_cast<size_t>(i)] = i;
  auto before = [&](int64_t a, int64_t b) {  // larger magnitude first, the lower index on a tie
    const float x = std::fabs(v[static_cast<size_t>(a)]), y = std::fabs(v[static_cast<size_t>(b)]);
    return x > y || (x == y && a < b);
  };
  std::nth_element(order.begin(), order.begin() + (bk.topk - 1), order.end(), before);
  std::vector<int64_t> kept(order.begin(), order.begin() + bk.topk);
  std::sort(kept.begin(), kept.end());
  std::vector<float> values(kept.size());
  for (size_t j = 0; j < kept.size(); j++) {
    values[j] = v[static_cast<size_t>(kept[j])];
    v[static_cast<size_t>(kept[j])] = 0.0f;  // sent: no longer part of the error
  }
  for (size_t s = 0; s < bk.params.size() && err; s++) {
    const Parameter& p = ps[static_cast<size_t>(bk.params[s])];
    for (int64_t i = 0; i < p.numel; i++) err[p.offset + i] = v[static_cast<size_t>(bk.offsets[s] + i)];
  }
  Device& dev = model_.device();
  dev.upload(bk.topk_values.raw(), values.data(), bk.topk_values.nbytes());
  dev.upload(bk.topk_indices.raw(), kept.data(), bk.topk_indices.nbytes());
}

void DistributedDataParallel::densify(DdpBucket& bk) {
  Device& dev = model_.device();
  std::vector<float> values(static_cast<size_t>(bk.topk * world_));
  std::vector<int64_t> indices(values.size());
  dev.download(values.data(), bk.gathered_values.raw(), bk.gathered_values.nbytes());
  dev.download(indices.data(), bk.gathered_indices.raw(), bk.gathered_indices.nbytes());
  std::vector<float> sum(static_cast<size_t>(bk.numel), 0.0f);
  for (size_t j = 0; j < values.size(); j++) {  // rank by rank, each rank's entries in index order
    const int64_t at = indices[j];
    DTLAB_CHECK(at >= 0 && at < bk.numel, "a top-k index outside its bucket");
    sum[static_cast<size_t>(at)] += values[j];
  }
  const float w = static_cast<float>(world_);
  for (float& x : sum) x /= w;
  store_floats(bk.buffer, sum, model_.half_format());
}

namespace {

// torch's _orthogonalize_gram_schmidt (epsilon 0) on one rows x cols matrix, row-major: each column
// normalized, then projected out of the columns after it. A zero column divides to NaN, as torch's does.
void gram_schmidt(float* a, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < cols; i++) {
    double ss = 0;
    for (int64_t k = 0; k < rows; k++) ss += static_cast<double>(a[k * cols + i]) * a[k * cols + i];
    const float norm = static_cast<float>(std::sqrt(ss));
    for (int64_t k = 0; k < rows; k++) a[k * cols + i] /= norm;
    for (int64_t j = i + 1; j < cols; j++) {
      double dot = 0;
      for (int64_t k = 0; k < rows; k++) dot += static_cast<double>(a[k * cols + i]) * a[k * cols + j];
      const float d = static_cast<float>(dot);
      for (int64_t k = 0; k < rows; k++) a[k * cols + j] -= d * a[k * cols + i];
    }
  }
}

// torch.randn(n) on the CPU after torch.manual_seed (its mt19937): 16 or more values are uniforms of 24
// bits turned into normals 16 at a time by Box-Muller (normal_fill; a tail redraws the last 16), fewer
// come one by one from normal_distribution<double> (53-bit uniforms, the second value of each pair cached).
std::vector<float> torch_randn(std::mt19937& g, int64_t n) {
  std::vector<float> d(static_cast<size_t>(n));
  auto u24 = [&] { return static_cast<float>(static_cast<double>(g() & ((1u << 24) - 1)) * std::ldexp(1.0, -24)); };
  if (n >= 16) {
    auto fill16 = [](float* x) {
      for (int j = 0; j < 8; j++) {
        const float u1 = 1 - x[j], u2 = x[j + 8];
        const float radius = std::sqrt(-2 * std::log(u1)), theta = 2.0f * static_cast<float>(M_PI) * u2;
        x[j] = radius * std::cos(theta);
        x[j + 8] = radius * std::sin(theta);
      }
    };
    for (float& x : d) x = u24();
    for (int64_t i = 0; i + 16 <= n; i += 16) fill16(d.data() + i);
    if (n % 16 != 0) {
      float* tail = d.data() + n - 16;
      for (int i = 0; i < 16; i++) tail[i] = u24();
      fill16(tail);
    }
    return d;
  }
  auto u53 = [&] {
    const uint64_t hi = g(), lo = g();
    return static_cast<double>(((hi << 32) | lo) & ((1ULL << 53) - 1)) * std::ldexp(1.0, -53);
  };
  bool cached = false;
  double next = 0;
  for (float& x : d) {
    if (cached) {
      x = static_cast<float>(next);
      cached = false;
      continue;
    }
    const double u1 = u53(), u2 = u53();
    const double radius = std::sqrt(-2.0 * std::log1p(-u2)), theta = 2.0 * M_PI * u1;
    next = radius * std::sin(theta);
    cached = true;
    x = static_cast<float>(radius * std::cos(theta));
  }
  return d;
}

// numpy's RandomState.randint(1_000_000_000): 30-bit masked draws until one is in range.
uint32_t numpy_randint_1e9(std::mt19937& g) {
  uint32_t v;
  do v = g() & ((1u << 30) - 1);
  while (v > 999999999u);
  return v;
}

}  // namespace

// torch's powerSGD_hook (ddp_comm_hooks/powerSGD_hook.py), step by step, on the host in float32 (as the
// cast hooks; the factors are small); the three all-reduces move the bucket's device memory.
void DistributedDataParallel::power_sgd(DdpBucket& bk, int index) {
  Device& dev = model_.device();
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  const HalfFormat hf = model_.half_format();
  const float w = static_cast<float>(world_);
  const bool last = index + 1 == static_cast<int>(buckets_.size());  // GradBucket.is_last(): the iteration's last
  std::vector<float> v = host_floats(bk.buffer, hf);
  if (psgd_iter_ < opt_.comm_hook.powersgd_start) {  // default._allreduce_fut: divide, then all-reduce
    for (float& x : v) x /= w;
    store_floats(bk.buffer, v, hf);
    bk.work = comm_.all_reduce(bk.buffer.raw(), bk.numel, bk.buffer.dtype(), ReduceOp::Sum);
    bk.sent = bk.bytes;
    if (last) psgd_iter_++;
    return;
  }
  if (psgd_.size() <= static_cast<size_t>(index)) psgd_.resize(static_cast<size_t>(index) + 1);
  PowerSgdBucket& st = psgd_[static_cast<size_t>(index)];
  // Error feedback: the remembered error added in, and what the rank then holds kept. Without it
  // (use_error_feedback=False) torch keeps no error_dict entry: nothing is added, allocated or stored.
  const bool feedback = opt_.comm_hook.error_feedback;
  if (feedback && st.error.empty()) {
    st.error = Tensor({bk.numel}, MemCategory::CommBuffers, mem, DType::F32, cpu_device());
    st.error.zero();
  }
  float* err = feedback ? st.error.f32() : nullptr;
  for (int64_t i = 0; i < bk.numel && err; i++) v[static_cast<size_t>(i)] += err[i];
  const std::vector<float> held = v;
  // Which tensors are worth compressing, as n x m matrices (tensor.view(shape[0], -1)).
  struct Mat {
    int64_t at, n, m, r;
  };
  std::vector<Mat> mats, plain;
  const auto& ps = model_.parameters();
  const int64_t rank = opt_.comm_hook.powersgd_rank;
  for (size_t s = 0; s < bk.params.size(); s++) {
    const Parameter& p = ps[static_cast<size_t>(bk.params[s])];
    const int64_t n = p.shape.empty() ? 1 : p.shape.front(), m = n > 0 ? p.numel / n : 0;
    const int64_t r = std::min({n, m, rank});
    const bool worth = (n + m) * r * 2 < n * m;  // _should_compress with min_compression_rate 2
    (worth ? mats : plain).push_back({bk.offsets[s], n, m, r});
  }
  // torch groups the matrices by shape (in the order each shape first appears) before laying out P and Q.
  std::vector<Mat> grouped;
  for (size_t i = 0; i < mats.size(); i++) {
    bool seen = false;
    for (size_t j = 0; j < i; j++) seen = seen || (mats[j].n == mats[i].n && mats[j].m == mats[i].m);
    if (seen) continue;
    for (size_t j = i; j < mats.size(); j++)
      if (mats[j].n == mats[i].n && mats[j].m == mats[i].m) grouped.push_back(mats[j]);
  }
  int64_t np = 0, nq = 0, nu = 0;
  for (const Mat& a : grouped) np += a.n * a.r, nq += a.m * a.r;
  for (const Mat& a : plain) nu += a.n * a.m;
  const bool fresh = !st.started;  // warm start: Q is drawn only the first time
  if (fresh) {
    st.p.assign(static_cast<size_t>(np), 0.0f);
    st.q.assign(static_cast<size_t>(nq), 0.0f);
    st.started = true;
    std::mt19937 g(numpy_randint_1e9(psgd_rng_));  // torch.manual_seed(state.rng.randint(1_000_000_000))
    int64_t qo = 0;
    for (const Mat& a : grouped) {
      const std::vector<float> draw = torch_randn(g, a.m * a.r);
      std::copy(draw.begin(), draw.end(), st.q.begin() + qo);
      qo += a.m * a.r;
    }
  }
  {
    int64_t qo = 0;
    for (const Mat& a : grouped) {
      gram_schmidt(st.q.data() + qo, a.m, a.r);
      qo += a.m * a.r;
    }
  }
  // P = M Q for every matrix.
  int64_t po = 0, qo = 0;
  for (const Mat& a : grouped) {
    const float* M = held.data() + a.at;
    for (int64_t i = 0; i < a.n; i++)
      for (int64_t c = 0; c < a.r; c++) {
        double acc = 0;
        for (int64_t k = 0; k < a.m; k++) acc += static_cast<double>(M[i * a.m + k]) * st.q[static_cast<size_t>(qo + k * a.r + c)];
        st.p[static_cast<size_t>(po + i * a.r + c)] = static_cast<float>(acc);
      }
    po += a.n * a.r, qo += a.m * a.r;
  }
  // The three all-reduces, each waited for before the next step needs it: the uncompressed tensors (then
  // averaged into the bucket), P (a sum), Q (then averaged).
  auto all_reduce = [&](std::vector<float>& host, int64_t n) {
    Tensor t({n}, MemCategory::CommBuffers, mem, DType::F32, dev);
    if (n > 0) dev.upload(t.raw(), host.data(), n * static_cast<int64_t>(sizeof(float)));
    WorkPtr work = comm_.all_reduce(t.raw(), n, DType::F32, ReduceOp::Sum);
    work->wait();
    if (n > 0) dev.download(host.data(), t.raw(), n * static_cast<int64_t>(sizeof(float)));
    return work;
  };
  std::vector<float> u(static_cast<size_t>(nu));
  int64_t uo = 0;
  for (const Mat& a : plain) {
    std::copy(held.begin() + a.at, held.begin() + a.at + a.n * a.m, u.begin() + uo);
    uo += a.n * a.m;
  }
  all_reduce(u, nu);
  uo = 0;
  for (const Mat& a : plain) {
    for (int64_t i = 0; i < a.n * a.m; i++) v[static_cast<size_t>(a.at + i)] = u[static_cast<size_t>(uo + i)] / w;
    uo += a.n * a.m;
  }
  all_reduce(st.p, np);
  po = qo = 0;
  for (const Mat& a : grouped) {  // P orthogonalized, then Q = M^T P
    gram_schmidt(st.p.data() + po, a.n, a.r);
    const float* M = held.data() + a.at;
    for (int64_t k = 0; k < a.m; k++)
      for (int64_t c = 0; c < a.r; c++) {
        double acc = 0;
        for (int64_t i = 0; i < a.n; i++) acc += static_cast<double>(M[i * a.m + k]) * st.p[static_cast<size_t>(po + i * a.r + c)];
        st.q[static_cast<size_t>(qo + k * a.r + c)] = static_cast<float>(acc);
      }
    po += a.n * a.r, qo += a.m * a.r;
  }
  bk.work = all_reduce(st.q, nq);
  for (float& x : st.q) x /= w;
  po = qo = 0;
  for (const Mat& a : grouped) {  // M = P Q^T
    for (int64_t i = 0; i < a.n; i++)
      for (int64_t k = 0; k < a.m; k++) {
        double acc = 0;
        for (int64_t c = 0; c < a.r; c++)
          acc += static_cast<double>(st.p[static_cast<size_t>(po + i * a.r + c)]) * st.q[static_cast<size_t>(qo + k * a.r + c)];
        v[static_cast<size_t>(a.at + i * a.m + k)] = static_cast<float>(acc);
      }
    po += a.n * a.r, qo += a.m * a.r;
  }
  for (int64_t i = 0; i < bk.numel && err; i++) err[i] = held[static_cast<size_t>(i)] - v[static_cast<size_t>(i)];
  store_floats(bk.buffer, v, hf);
  bk.sent = (nu + np + nq) * static_cast<int64_t>(sizeof(float));
  if (last) psgd_iter_++;
}

int DistributedDataParallel::hook_collectives() const {
  switch (opt_.comm_hook.kind) {
    case CommHook::TopK: return 2;  // the values' and the indices' all-gathers
    case CommHook::PowerSgd: return psgd_iter_ < opt_.comm_hook.powersgd_start ? 1 : 3;  // whole tensors, P, Q
    default: return 1;
  }
}

DType DistributedDataParallel::bucket_dtype() const {
  return model_.mixed() && !reduce_fp32_ ? model_.param_dtype() : DType::F32;
}

// The averaged gradients back into each .grad (rounded to 16 bits from a float32 bucket).
void DistributedDataParallel::copy_back(const DdpBucket& bk) {
  auto& ps = model_.parameters();
  for (size_t s = 0; s < bk.params.size(); s++) {
    // "If a parameter is globally unused, we keep its grad untouched" (the reducer's
    // copy_bucket_to_grad): no rank's forward used it since the last synchronised backward.
    if (!used_global_.empty() && used_global_[static_cast<size_t>(kept_at_[static_cast<size_t>(bk.params[s])])] == 0.0f) continue;
    Parameter& prm = ps[static_cast<size_t>(bk.params[s])];
    const int64_t at = bk.offsets[s];
    if (!model_.mixed())
      model_.device().copy(prm.grad, bk.buffer.f32() + at, prm.numel * static_cast<int64_t>(sizeof(float)));
    else if (bk.buffer.dtype() == DType::F32)
      model_.device().narrow_half(prm.grad16, bk.buffer.f32() + at, prm.numel, model_.half_format());
    else
      model_.device().copy(prm.grad16, bk.buffer.u16() + at, prm.numel * 2);
  }
}

void DistributedDataParallel::leave_unfinished(int bucket) {
  // torch: backward ends without this bucket (its hook never fired), nothing is copied back, and
  // the reducer remembers that the reduction did not finish; the next forward raises. The buckets
  // launched before it are waited for above, so this rank leaves no collective half-issued when
  // every rank skipped the same parameters; a rank whose forward used them launched more and
  // waits in that all-reduce instead (the hang the watchdog names).
  const DdpBucket& bk = buckets_[static_cast<size_t>(bucket)];
  std::vector<int> missing;
  for (size_t b = static_cast<size_t>(bucket); b < buckets_.size(); b++)
    for (int p : buckets_[b].params)
      if (!ready_[static_cast<size_t>(p)]) missing.push_back(p);
  std::string later;
  for (int b = bucket + 1; b < static_cast<int>(buckets_.size()); b++)
    later += (later.empty() ? "" : ", ") + std::to_string(b);
  unfinished_ = "rank " + std::to_string(comm_.rank()) + ": DDP expected to have finished reduction in the prior iteration before starting a new one "
                "(torch's error): in iteration " + std::to_string(pass_iteration_) + " " +
                (missing.size() == 1 ? "parameter " : "parameters ") + join_names(model_, missing) +
                " received no gradient (the forward did not use them), so bucket " + std::to_string(bucket) +
                " of " + std::to_string(buckets_.size()) + " (" + bk.names + ")" +
                (later.empty() ? "" : " and bucket " + later + " after it") +
                " never launched its all-reduce; pass --find-unused-parameters (DDP's "
                "find_unused_parameters=True) or make every parameter take part in the loss";
  if (ctx_) ctx_->set_activity("DDP bucket " + std::to_string(bucket) + " never became ready: the reduction is unfinished");
}

std::vector<Optimizer::Segment> DistributedDataParallel::optimizer_segments() {
  std::vector<Optimizer::Segment> segs;
  for (auto& p : model_.parameters()) segs.push_back({p.data, p.grad, p.offset, p.numel});
  return segs;
}

std::vector<Optimizer::Segment16> DistributedDataParallel::optimizer_segments16() {
  std::vector<Optimizer::Segment16> segs;
  for (auto& p : model_.parameters()) segs.push_back({p.data16, p.grad16, p.offset, p.numel});
  return segs;
}


}  // namespace dtlab
