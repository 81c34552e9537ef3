#include "engine/core/arith.h"
#include "engine/parallel/data_parallel.h"

#include <algorithm>

#include "engine/core/half.h"
#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

// Point-to-point tags: Scatter of the input, Gather of the output, Scatter of the output gradient.
constexpr int kTagInput = 1, kTagOutput = 2, kTagGrad = 3;

// Grows `t` to hold `numel` elements of `dt` (like the model's activations: sized once for the
// largest forward, reused for smaller ones), charged to the rank as activations.
void ensure(Tensor& t, int64_t numel, MemoryTracker* mem, Device& dev, DType dt = DType::F32) {
  if (!t.empty() && t.numel() >= numel && t.dtype() == dt) return;
  t = Tensor();  // free before allocating, as a caching allocator would reuse the block
  t = Tensor({std::max<int64_t>(numel, 1)}, MemCategory::Activations, mem, dt, dev);
}

}  // namespace

std::vector<int64_t> chunk_sizes(int64_t rows, int devices) {
  DTLAB_CHECK(devices >= 1, "chunk_sizes needs at least one device");
  std::vector<int64_t> out;
  if (rows <= 0) return out;
  const int64_t each = (rows + devices - 1) / devices;  // torch.chunk: split_size = ceil(rows / chunks)
  for (int64_t at = 0; at < rows; at += each) out.push_back(std::min(each, rows - at));
  return out;
}

namespace {

// Consecutive tensors in groups of about `limit` bytes. close_after: add the tensor, then close the
// group once it holds `limit` or more (take_tensors); otherwise close the group first when the
// tensor would take it past `limit` (_take_tensors).
std::vector<std::vector<int>> group_by_size(const std::vector<int64_t>& bytes, int64_t limit, bool close_after) {
  DTLAB_CHECK(limit >= 1, "the coalescing buffer must hold at least 1 byte");
  std::vector<std::vector<int>> out(1);
  int64_t size = 0;
  for (size_t i = 0; i < bytes.size(); i++) {
    if (!close_after && size > 0 && size + bytes[i] > limit) out.emplace_back(), size = 0;
    out.back().push_back(static_cast<int>(i));
    size += bytes[i];
    if (close_after && size >= limit && i + 1 < bytes.size()) out.emplace_back(), size = 0;
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

std::vector<std::vector<int>> broadcast_coalesced_groups(const std::vector<int64_t>& bytes, int64_t limit) {
  return group_by_size(bytes, limit, true);
}

std::vector<std::vector<int>> reduce_add_coalesced_groups(const std::vector<int64_t>& bytes, int64_t limit) {
  return group_by_size(bytes, limit, false);
}

void check_dp_pieces(int64_t n, int64_t batch, bool drop_last, int world) {
  const int64_t last = drop_last ? 0 : n % batch;  // a full batch of B x world rows splits evenly
  if (last == 0) return;
  const int pieces = static_cast<int>(chunk_sizes(last, world).size());
  if (pieces == world) return;
  throw Error("--strategy dp: the last batch of each epoch holds " + std::to_string(last) + " of the " + std::to_string(n) +
              " samples, which torch.chunk cuts into " + std::to_string(pieces) + " pieces for " + std::to_string(world) +
              " devices, leaving " + (world - pieces == 1 ? "one device" : std::to_string(world - pieces) + " devices") +
              " without a replica (DataParallel then replicates onto fewer devices, which dtlab's dp does not model); "
              "pass --drop-last or pick another --batch");
}

// ---------------------------------------------------------------------------------------------

DataParallel::DataParallel(Model& model, Communicator& comm, RankContext* ctx, const DpOptions& opt)
    : model_(model), comm_(comm), ctx_(ctx), opt_(opt), rank_(comm.rank()), world_(comm.world_size()) {
  if (opt_.coalesce_bytes < 1) throw Error("the DataParallel coalescing buffer must hold at least 1 byte");
  // A 16-bit module (model.to(torch.bfloat16)) replicates, gathers and reduce-adds its 16-bit
  // tensors: every payload is 2 bytes an element, and the coalescing groups count those bytes.
  const int64_t esize = dtype_size(model_.param_dtype());
  const auto& ps = model_.parameters();
  if (model_.lora()) {
    for (int i = 0; i < model_.num_layers(); i++) {
      const Layer& L = model_.layer(i);
      if (L.kind != LayerKind::Linear) continue;
      module_.push_back({true, L.weight});
      module_.push_back({true, L.bias});
      if (L.lora_a >= 0) module_.push_back({false, L.lora_a}), module_.push_back({false, L.lora_b});
    }
  } else {
    for (int i = 0; i < static_cast<int>(ps.size()); i++) module_.push_back({false, i});
  }
  std::vector<int64_t> bytes, grad_bytes;
  for (const ModuleTensor& m : module_) bytes.push_back(tensor(m).numel * esize);
  for (const Parameter& p : ps) grad_bytes.push_back(p.numel * esize);
  bcast_groups_ = broadcast_coalesced_groups(bytes, opt_.coalesce_bytes);
  reduce_groups_ = reduce_add_coalesced_groups(grad_bytes, opt_.coalesce_bytes);
  for (const std::vector<int>& g : bcast_groups_)
    if (!model_.lora()) contiguous_ = contiguous_ && range_of(g).contiguous;
  if (rank_ == 0) {
    DTLAB_CHECK(model_.owns_parameters(), "DataParallel's rank 0 holds the module's parameters");
  } else if (model_.owns_parameters()) {
    // Only device 0 holds the module; a replica exists from a forward's broadcast to its backward.
    model_.release_parameter_storage();
    model_.release_frozen_storage();
  }
}

const Parameter& DataParallel::tensor(const ModuleTensor& m) const {
  return m.frozen ? model_.base_parameters()[static_cast<size_t>(m.index)] : model_.parameters()[static_cast<size_t>(m.index)];
}

// broadcast_coalesced under LoRA: each group's tensors flattened into one buffer (rank 0 copies
// them in), one broadcast per buffer, unflattened on the replicas once the broadcasts are done.
void DataParallel::broadcast_staged(std::vector<WorkPtr>& works, std::vector<Tensor>& staging) {
  Device& dev = model_.device();
  const DType dt = model_.param_dtype();
  const int64_t esize = dtype_size(dt);
  for (const std::vector<int>& g : bcast_groups_) {
    int64_t n = 0;
    for (int i : g) n += tensor(module_[static_cast<size_t>(i)]).numel;
    staging.emplace_back(Shape{n}, MemCategory::CommBuffers, ctx_ ? ctx_->memory() : nullptr, dt, dev);
    char* buf = static_cast<char*>(staging.back().raw());
    if (rank_ == 0)
      for (int i : g) {
        const Parameter& p = tensor(module_[static_cast<size_t>(i)]);
        dev.copy(buf, model_.mixed() ? static_cast<const void*>(p.data16) : static_cast<const void*>(p.data), p.numel * esize);
        buf += p.numel * esize;
      }
    works.push_back(comm_.broadcast(staging.back().raw(), n, dt, 0, Algorithm::Naive));
    stats_.broadcasts++;
    stats_.parameter_bytes += n * esize;
  }
}

void DataParallel::unpack_staged(std::vector<Tensor>& staging) {
  Device& dev = model_.device();
  const int64_t esize = dtype_size(model_.param_dtype());
  if (rank_ != 0 && !staging.empty())
    for (size_t k = 0; k < bcast_groups_.size(); k++) {
      const char* buf = static_cast<const char*>(staging[k].raw());
      for (int i : bcast_groups_[k]) {
        const Parameter& p = tensor(module_[static_cast<size_t>(i)]);
        dev.copy(model_.mixed() ? static_cast<void*>(p.data16) : static_cast<void*>(p.data), buf, p.numel * esize);
        buf += p.numel * esize;
      }
    }
  staging.clear();
}

DataParallel::Range DataParallel::range_of(const std::vector<int>& group) const {
  const auto& ps = model_.parameters();
  const Parameter& first = ps[static_cast<size_t>(group.front())];
  const Parameter& last = ps[static_cast<size_t>(group.back())];
  // Side by side when each parameter starts where the one before it in the group ends.
  bool contiguous = true;
  int64_t count = 0, end = first.offset;
  for (int i : group) {
    const Parameter& p = ps[static_cast<size_t>(i)];
    contiguous = contiguous && p.offset == end;
    end = p.offset + p.numel;
    count += p.numel;
  }
  return {first.offset, contiguous ? last.offset + last.numel - first.offset : count, contiguous};
}

void DataParallel::move_grads(const std::vector<int>& group, void* buf, bool into_buf) {
  Device& dev = model_.device();
  const int64_t esize = dtype_size(model_.param_dtype());
  char* at = static_cast<char*>(buf);
  for (int i : group) {
    const Parameter& p = model_.parameters()[static_cast<size_t>(i)];
    void* grad = model_.mixed() ? static_cast<void*>(p.grad16) : static_cast<void*>(p.grad);
    if (into_buf) dev.copy(at, grad, p.numel * esize);
    else dev.copy(grad, at, p.numel * esize);
    at += p.numel * esize;
  }
}

int64_t DataParallel::per_sample_out() const {
  const ModelSpec& s = model_.spec();
  return s.is_gpt() ? s.gpt.ctx * s.gpt.vocab : s.out_features();
}

int64_t DataParallel::piece_offset(int r) const {
  int64_t at = 0;
  for (int i = 0; i < r; i++) at += pieces_[static_cast<size_t>(i)];
  return at;
}

void DataParallel::wait_all(std::vector<WorkPtr>& works) {
  for (WorkPtr& w : works) w->wait();
  works.clear();
}

const float* DataParallel::forward(const float* x, int64_t rows) {
  DTLAB_CHECK(!model_.is_gpt(), "a GPT's DataParallel forward takes tokens: forward_tokens()");
  return run_forward(x, rows);
}

const float* DataParallel::forward_tokens(const int64_t* idx, int64_t rows) {
  DTLAB_CHECK(model_.is_gpt(), "forward_tokens() on a DataParallel module that is not a GPT");
  return run_forward(idx, rows);
}

const float* DataParallel::run_forward(const void* in, int64_t rows) {
  DTLAB_CHECK(!in_forward_, "DataParallel::forward() called twice without backward()");
  DTLAB_CHECK(rows >= 1, "DataParallel::forward() needs at least one row");
  DTLAB_CHECK((rank_ == 0) == (in != nullptr), "DataParallel::forward(): rank 0, and only rank 0, passes the batch");
  // Per sample: D input elements (a GPT's T token ids, int64) and C outputs (a GPT's T x V logits).
  const bool tokens = model_.is_gpt();
  const int64_t D = model_.spec().in_features(), C = per_sample_out();
  const float* x = tokens ? nullptr : static_cast<const float*>(in);
  stats_ = DpIterationStats{};
  stats_.iteration = ctx_ ? ctx_->iteration() : -1;
  rows_ = rows;
  pieces_ = chunk_sizes(rows, world_);
  stats_.replicas = replicas();
  stats_.pieces = pieces_;
  in_forward_ = true;
  if (world_ == 1) {  // one device: DataParallel calls the module itself
    x_ = x;
    return tokens ? model_.forward_tokens(static_cast<const int64_t*>(in), rows) : model_.forward(x, rows);
  }
  if (replicas() < world_)
    throw Error("DataParallel: a batch of " + std::to_string(rows) + " rows splits into " + std::to_string(replicas()) +
                " pieces (torch.chunk), fewer than the " + std::to_string(world_) +
                " devices, and dtlab's DataParallel replicates onto every device; use larger batches or fewer ranks");
  Device& dev = model_.device();
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  const int64_t mine = pieces_[static_cast<size_t>(rank_)];
  std::vector<WorkPtr> works;
  // A 16-bit module takes the batch as x.to(dtype): rank 0 rounds it once and scatters 16-bit pieces
  // (its own piece the module rounds the same way); a replica widens its piece for the module's
  // float32 entry point, which rounds it again to the same values.
  const bool half = model_.mixed();
  const DType dt = model_.param_dtype();
  const DType in_dt = tokens ? DType::I64 : dt;  // a GPT's pieces are its samples' token ids
  const bool half_in = half && !tokens;          // (which no dtype rounds)

  // 1. Scatter: piece r of the batch to rank r; rank 0's piece is a view of the batch.
  if (ctx_) ctx_->set_activity(rank_ == 0 ? "DataParallel: scattering the batch to the devices"
                                          : "DataParallel: receiving my piece of the batch from rank 0");
  if (rank_ == 0) {
    const void* src = in;
    if (half_in) {
      ensure(x16_, rows * D, mem, dev, dt);
      dev.narrow_half(x16_.u16(), x, rows * D, model_.half_format());
      src = x16_.raw();
    }
    for (int r = 1; r < world_; r++)
      works.push_back(comm_.send(static_cast<const char*>(src) + piece_offset(r) * D * dtype_size(in_dt), pieces_[static_cast<size_t>(r)] * D,
                                 in_dt, r, kTagInput));
    x_ = x;
    tok_ = static_cast<const int64_t*>(tokens ? in : nullptr);
  } else {
    ensure(x_piece_, mine * D, mem, dev, tokens ? DType::I64 : DType::F32);
    if (half_in) ensure(x16_, mine * D, mem, dev, dt);
    works.push_back(comm_.recv(half_in ? x16_.raw() : x_piece_.raw(), mine * D, in_dt, 0, kTagInput));
    x_ = tokens ? nullptr : x_piece_.f32();
    tok_ = tokens ? static_cast<const int64_t*>(x_piece_.raw()) : nullptr;
  }

  // 2. Replicate: every parameter from rank 0, one broadcast per coalesced buffer, into storage the
  // other ranks allocate for this forward's replica.
  if (ctx_) ctx_->set_activity("DataParallel: replicating the module (broadcast of every parameter from rank 0)");
  if (rank_ != 0) model_.restore_storage(nullptr), model_.restore_frozen_storage();
  std::vector<Tensor> staging;
  if (model_.lora() || !contiguous_) {
    broadcast_staged(works, staging);
  } else {
    for (const std::vector<int>& g : bcast_groups_) {  // the flat parameters are the buffers themselves
      const Range rg = range_of(g);
      void* at = half ? static_cast<void*>(model_.params16() + rg.offset) : static_cast<void*>(model_.params() + rg.offset);
      works.push_back(comm_.broadcast(at, rg.count, dt, 0, Algorithm::Naive));
      stats_.broadcasts++;
      stats_.parameter_bytes += rg.count * dtype_size(dt);
    }
  }
  wait_all(works);
  unpack_staged(staging);
  if (half_in && rank_ != 0) dev.widen_half(x_piece_.f32(), x16_.u16(), mine * D, model_.half_format());
  if (rank_ != 0) model_.zero_grad();  // the replica's gradients start from nothing

  // 3. parallel_apply: this rank's replica on its piece.
  if (ctx_) ctx_->set_activity("DataParallel: forward of my replica");
  const float* out = tokens ? model_.forward_tokens(tok_, mine) : model_.forward(x_, mine);

  // 4. Gather: every piece's output into one (rows, C) tensor on rank 0.
  if (ctx_) ctx_->set_activity(rank_ == 0 ? "DataParallel: gathering the outputs" : "DataParallel: sending my output to rank 0");
  // A 16-bit module's outputs are 16-bit tensors: the replicas send them as such, and rank 0 widens
  // the gathered logits for the float32 loss (the module's own output is widened the same way).
  if (rank_ == 0) {
    ensure(gathered_, rows * C, mem, dev);
    dev.copy(gathered_.f32(), out, mine * C * static_cast<int64_t>(sizeof(float)));  // torch's gather copies every piece in
    if (half) ensure(out16_, rows * C, mem, dev, dt);
    for (int r = 1; r < world_; r++)
      works.push_back(comm_.recv(half ? static_cast<void*>(out16_.u16() + piece_offset(r) * C)
                                      : static_cast<void*>(gathered_.f32() + piece_offset(r) * C),
                                 pieces_[static_cast<size_t>(r)] * C, dt, r, kTagOutput));
    wait_all(works);
    if (half)
      dev.widen_half(gathered_.f32() + mine * C, out16_.u16() + mine * C, (rows - mine) * C, model_.half_format());
    if (ctx_) ctx_->set_activity("running");
    return gathered_.f32();
  }
  if (half) {
    ensure(out16_, mine * C, mem, dev, dt);
    dev.narrow_half(out16_.u16(), out, mine * C, model_.half_format());  // exact: the values are 16-bit ones
  }
  works.push_back(comm_.send(half ? out16_.raw() : static_cast<const void*>(out), mine * C, dt, 0, kTagOutput));
  wait_all(works);
  if (ctx_) ctx_->set_activity("DataParallel: waiting for the output gradient from rank 0");
  return nullptr;
}

void DataParallel::backward(const float* dlogits) {
  DTLAB_CHECK(in_forward_, "DataParallel::backward() without a forward()");
  DTLAB_CHECK((rank_ == 0) == (dlogits != nullptr), "DataParallel::backward(): rank 0, and only rank 0, passes the gradient");
  in_forward_ = false;
  if (world_ == 1) {
    stats_.backward_begin = ctx_ ? ctx_->compute_clock() : 0;
    model_.backward(dlogits);
    stats_.backward_end = ctx_ ? ctx_->compute_clock() : 0;
    return;
  }
  const int64_t C = per_sample_out();
  const int64_t mine = pieces_[static_cast<size_t>(rank_)];
  std::vector<WorkPtr> works;
  MemoryTracker* mem = ctx_ ? ctx_->memory() : nullptr;
  const bool half = model_.mixed();
  const DType dt = model_.param_dtype();

  // 5. Gather's backward: the output gradient scattered in the forward's pieces (rank 0's a view). A
  // 16-bit module's output gradient is a 16-bit tensor: rounded once on rank 0 (as the module rounds
  // its own piece), widened on the replica for the module's float32 entry point.
  if (rank_ == 0) {
    if (ctx_) ctx_->set_activity("DataParallel: scattering the output gradient");
    const void* src = dlogits;
    if (half) {
      ensure(d16_, rows_ * C, mem, model_.device(), dt);
      model_.device().narrow_half(d16_.u16(), dlogits, rows_ * C, model_.half_format());
      src = d16_.raw();
    }
    for (int r = 1; r < world_; r++)
      works.push_back(comm_.send(static_cast<const char*>(src) + piece_offset(r) * C * dtype_size(dt), pieces_[static_cast<size_t>(r)] * C,
                                 dt, r, kTagGrad));
  } else {
    ensure(dlogits_piece_, mine * C, mem, model_.device());
    if (half) ensure(d16_, mine * C, mem, model_.device(), dt);
    works.push_back(comm_.recv(half ? d16_.raw() : dlogits_piece_.raw(), mine * C, dt, 0, kTagGrad));
  }
  wait_all(works);
  if (half && rank_ != 0) model_.device().widen_half(dlogits_piece_.f32(), d16_.u16(), mine * C, model_.half_format());

  // 6. Each replica's backward.
  if (ctx_) ctx_->set_activity("DataParallel: backward of my replica");
  stats_.backward_begin = ctx_ ? ctx_->compute_clock() : 0;
  model_.backward(rank_ == 0 ? dlogits : dlogits_piece_.f32());
  stats_.backward_end = ctx_ ? ctx_->compute_clock() : 0;

  // 7. Broadcast's backward, ReduceAddCoalesced: every gradient summed onto rank 0's .grad, which
  // already holds its own replica's (and earlier micro-batches') gradient.
  if (ctx_) ctx_->set_activity("DataParallel: reduce-adding the gradients onto rank 0");
  // A group whose gradients do not lie side by side in the flat buffer (a GPT keeps ln_f beside its
  // embeddings) is flattened into a staging buffer first and, on rank 0, unflattened after the sum:
  // reduce_add_coalesced's own flatten and unflatten.
  std::vector<Tensor> staged(reduce_groups_.size());
  for (size_t k = 0; k < reduce_groups_.size(); k++) {
    const std::vector<int>& g = reduce_groups_[k];
    const Range rg = range_of(g);
    void* at = half ? static_cast<void*>(model_.grads16() + rg.offset) : static_cast<void*>(model_.grads() + rg.offset);
    if (!rg.contiguous) {
      staged[k] = Tensor({rg.count}, MemCategory::CommBuffers, mem, dt, model_.device());
      at = staged[k].raw();
      move_grads(g, at, true);
    }
    works.push_back(comm_.reduce(at, rg.count, dt, ReduceOp::Sum, 0, Algorithm::Naive));
    stats_.reduces++;
    stats_.reduced_bytes += rg.count * dtype_size(dt);
  }
  for (WorkPtr& w : works) {
    w->wait();
    const WorkTimes t = w->times();
    stats_.reduce_seconds += t.model_end - t.model_begin;
    stats_.overlapped_seconds += overlap_of(t.model_begin, t.model_end, stats_.backward_begin, stats_.backward_end);
  }
  works.clear();
  if (rank_ == 0)
    for (size_t k = 0; k < reduce_groups_.size(); k++)
      if (!staged[k].empty()) move_grads(reduce_groups_[k], staged[k].raw(), false);
  // The replica dies with the autograd graph that held it.
  if (rank_ != 0) model_.release_parameter_storage(), model_.release_frozen_storage();
  if (ctx_) ctx_->set_activity("running");
}

std::vector<std::string> DataParallel::describe() const {
  const auto& ps = model_.parameters();
  // A group's names and size; `module`: indices into module_ (broadcast), else into parameters().
  auto text = [&](const std::vector<int>& g, bool module) {
    std::string names;
    int64_t n = 0;
    for (size_t i = 0; i < g.size(); i++) {
      const Parameter& p = module ? tensor(module_[static_cast<size_t>(g[i])]) : ps[static_cast<size_t>(g[i])];
      names += (i ? ", " : "") + p.name;
      n += p.numel;
    }
    return names + (module ? " (" : " gradients (") + human_bytes(n * dtype_size(model_.param_dtype())) + ")";
  };
  std::vector<std::string> lines;
  for (const auto& g : bcast_groups_) lines.push_back("replicate: broadcast " + text(g, true) + " from rank 0");
  for (const auto& g : reduce_groups_) lines.push_back("backward: reduce-add " + text(g, false) + " onto rank 0");
  return lines;
}

}  // namespace dtlab
