// torch.nn.DataParallel, rebuilt from nn/parallel/data_parallel.py, replicate.py, scatter_gather.py,
// comm.py and _functions.py (and torch/csrc/cuda/comm.cpp under them), over dtlab's ranks: one
// thread per device, as parallel_apply runs one Python thread per replica and the autograd engine
// one thread per device. Only rank 0 holds the module, its .grad and the optimizer. Every forward:
//   1. scatter: the batch, on rank 0, is cut along dim 0 into torch.chunk's pieces; piece r is
//      copied to rank r (piece 0 stays where it is, a view);
//   2. replicate: every parameter is broadcast from rank 0 (broadcast_coalesced: flat buffers of at
//      most 10 MiB, take_tensors' grouping) into replica storage the other ranks allocate now;
//   3. parallel_apply: each rank runs its replica on its piece;
//   4. gather: each rank's output is copied into one (batch, C) tensor on rank 0, where the caller
//      computes the loss over the whole batch.
// backward, the autograd graph of Gather, the replicas and Broadcast:
//   5. Gather's backward scatters the output gradient in the same pieces;
//   6. each replica runs its backward;
//   7. Broadcast's backward is ReduceAddCoalesced: every gradient is summed onto rank 0 (buffers of
//      at most 10 MiB, _take_tensors' grouping), only once every replica's backward has finished,
//      and lands in the module's .grad; the replicas die with the graph (their storage is freed).
// Nothing of this overlaps backward: the reduce starts when the last gradient exists.
//
// The copies are PyTorch's copy path: comm.broadcast without NCCL copies the buffer from device 0
// to each device (Tensor.to), and reduce_add without NCCL copies each device's buffer to device 0
// and adds it there; dtlab's naive broadcast and reduce move exactly those bytes. With NCCL, torch
// hands both to nccl.broadcast and nccl.reduce, which pass the buffer along a ring: the same total,
// spread over the ranks. Scatter and gather are copies to and from device 0 in either case.
// Sends and receives are point to point (no stepper gate); the broadcasts and reduces are
// collectives, so the lab steps through them.
// LoRA: replicate() broadcasts the frozen weights and biases too (they are parameters of the module,
// without requires_grad), each coalesced group flattened into one buffer and unflattened on the
// replicas, as broadcast_coalesced does; only the adapters have gradients to reduce-add.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/model.h"
#include "engine/core/tensor.h"
#include "engine/trace/context.h"

namespace dtlab {

// broadcast_coalesced's and reduce_add_coalesced's buffer_size (torch.cuda.comm): 10 MiB.
inline constexpr int64_t kDpCoalesceBytes = 10485760;

// torch.chunk(rows, devices) along dim 0: pieces of ceil(rows / devices) rows, the last one smaller,
// and FEWER pieces than devices when the rows run out (7 rows on 4 devices: 2, 2, 2, 1; 5 rows on
// 4 devices: 2, 2, 1). DataParallel then replicates to that many devices only.
std::vector<int64_t> chunk_sizes(int64_t rows, int devices);

// The parameter groups replicate() broadcasts as one flat buffer each: torch::utils::take_tensors,
// which adds a tensor to the open group and closes the group once it holds `limit` bytes or more.
std::vector<std::vector<int>> broadcast_coalesced_groups(const std::vector<int64_t>& bytes, int64_t limit);
// The gradient groups ReduceAddCoalesced sums as one flat buffer each: torch._utils._take_tensors,
// which closes the open group BEFORE a tensor that would take it past `limit` bytes.
std::vector<std::vector<int>> reduce_add_coalesced_groups(const std::vector<int64_t>& bytes, int64_t limit);

// dtlab::Error, one sentence, unless every batch a DataLoader of `batch` rows over `n` samples gives
// (the last one partial unless drop_last) splits into `world` pieces: DataParallel would replicate
// onto fewer devices for a batch that does not, which dtlab's dp does not model.
void check_dp_pieces(int64_t n, int64_t batch, bool drop_last, int world);

struct DpOptions {
  int64_t coalesce_bytes = kDpCoalesceBytes;  // buffer_size of both coalescing steps
};

// One forward and backward (a micro-batch) on one rank.
struct DpIterationStats {
  int32_t iteration = -1;
  int replicas = 0;                    // devices that got a piece (torch.chunk's count)
  std::vector<int64_t> pieces;         // rows per device
  int64_t broadcasts = 0, reduces = 0; // collectives issued (one per coalesced group)
  int64_t parameter_bytes = 0;         // S: every parameter, float32 (the broadcasts' payloads summed)
  int64_t reduced_bytes = 0;           // the reduces' payloads summed (S again)
  double backward_begin = 0, backward_end = 0;  // compute lane, modeled
  double reduce_seconds = 0;           // the reduces on the comm lane, modeled
  double overlapped_seconds = 0;       // the part of reduce_seconds inside [backward_begin, backward_end]
  // Share of the gradient reduce hidden behind backward (1 when nothing was reduced, one device).
  double overlap() const { return reduce_seconds > 0 ? overlapped_seconds / reduce_seconds : 1.0; }
};

class DataParallel {
 public:
  // Collective: every rank constructs it at the same point, rank 0 with the module, the others with
  // a model of the same spec whose storage is released here (it holds nothing until a forward
  // replicates into it). `ctx` may be null (no events, no modeled clock).
  DataParallel(Model& model, Communicator& comm, RankContext* ctx, const DpOptions& opt = {});
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Every rank, every forward, with the same `rows` (the whole batch). Rank 0 passes the batch `x`
  // (rows, in_features) in its device's memory, the others null. Returns the gathered logits
  // (rows, out_features) on rank 0, null on the others.
  const float* forward(const float* x, int64_t rows);
  // A GPT's forward: rank 0 passes `rows` samples' token ids (rows x T, on the host), the others null;
  // the pieces are whole samples, and the gathered logits are (rows x T, V).
  const float* forward_tokens(const int64_t* idx, int64_t rows);
  // Every rank, after forward(): rank 0 passes the loss's gradient over the whole batch
  // (rows, out_features), the others null. Leaves rank 0's .grad plus the batch's gradient (summed
  // over the replicas) and frees the other ranks' replicas.
  void backward(const float* dlogits);

  bool is_module() const { return rank_ == 0; }  // holds the module, its .grad and the optimizer
  int replicas() const { return static_cast<int>(pieces_.size()); }
  const std::vector<int64_t>& pieces() const { return pieces_; }  // this forward's rows per device
  const DpIterationStats& last_stats() const { return stats_; }
  const std::vector<std::vector<int>>& broadcast_groups() const { return bcast_groups_; }
  const std::vector<std::vector<int>>& reduce_groups() const { return reduce_groups_; }
  // "replicate: broadcast 0.weight, ..., 4.bias (18 KiB) from rank 0" per group, for printing.
  std::vector<std::string> describe() const;

 private:
  struct Range {
    int64_t offset = 0, count = 0;  // elements of the flat parameter / gradient buffer
    bool contiguous = true;         // else `count` elements in parameters apart (staged)
  };
  const float* run_forward(const void* in, int64_t rows);
  // A group's gradients to (into_buf) or from a flat buffer, in the group's order.
  void move_grads(const std::vector<int>& group, void* buf, bool into_buf);
  int64_t per_sample_out() const;  // output elements per sample: C, or a GPT's T x V
  // The module's parameters in torch's module.parameters() order, what replicate() broadcasts: the
  // model's parameters, or under LoRA each Linear's frozen weight and bias, then its lora_A and
  // lora_B (peft's LoraLayer registers base_layer first).
  struct ModuleTensor {
    bool frozen = false;  // Model::base_parameters()[index], else parameters()[index]
    int index = 0;
  };
  const Parameter& tensor(const ModuleTensor& m) const;
  void broadcast_staged(std::vector<WorkPtr>& works, std::vector<Tensor>& staging);
  void unpack_staged(std::vector<Tensor>& staging);
  Range range_of(const std::vector<int>& group) const;
  int64_t piece_offset(int r) const;
  void wait_all(std::vector<WorkPtr>& works);

  Model& model_;
  Communicator& comm_;
  RankContext* ctx_;
  DpOptions opt_;
  int rank_, world_;
  std::vector<ModuleTensor> module_;
  std::vector<std::vector<int>> bcast_groups_, reduce_groups_;  // indices into module_ and parameters()
  std::vector<int64_t> pieces_;     // this forward's
  int64_t rows_ = 0;
  Tensor x_piece_, dlogits_piece_;  // ranks > 0: what rank 0 sends them
  Tensor x16_, out16_, d16_;        // a 16-bit module's payloads: the batch, the outputs, their gradient
  Tensor gathered_;                 // rank 0: (rows, C)
  const float* x_ = nullptr;        // this rank's piece of the input
  const int64_t* tok_ = nullptr;    // a GPT's: its samples' token ids
  bool contiguous_ = true;          // every broadcast group lies side by side in the flat buffer
  bool in_forward_ = false;
  DpIterationStats stats_;
};

}  // namespace dtlab
