// Context parallelism (--cp; docs/strategies.md, "Context parallelism"; sources in
// docs/course_sources.md §6h): the GPT's sequence split over the ranks of a CP group, attention
// meeting the others' keys by ring steps or all-to-alls (engine/core/gpt.h, GptCore). Groups follow
// Megatron's order, cp next to tp: in the mesh's data-parallel dimension (dp x cp ranks, tp fastest)
// a CP group is `cp` consecutive data-parallel indices, which read the same batches. DDP and FSDP
// then reduce gradients over all dp x cp ranks (Megatron's dp-cp group): every CP rank's loss is the
// mean over its T/c positions of the batch, so the average over the group is the whole sequence's.
#pragma once
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/mesh.h"
#include "engine/core/model.h"

namespace dtlab {

// The GPT's ring steps and all-to-alls over a CP process group.
class GroupContextParallelComm : public ContextParallelComm {
 public:
  explicit GroupContextParallelComm(Communicator& group) : group_(group) {}
  void send_recv(void* recv, int from, const void* send, int to, int64_t n, DType dtype, int layer) override;
  void all_to_all(void* out, const void* in, int64_t count, DType dtype, int layer) override;
  void all_reduce(void* data, int64_t n, DType dtype, int layer) override;
  Communicator& group() const { return group_; }

 private:
  Communicator& group_;
};

// The ranks of `rank`'s CP group in mesh `m` (whose dp dimension is data-parallel replicas x cp), in
// group-rank order; and the rank's place in it (its dp index mod cp).
std::vector<int> cp_group_ranks(const MeshShape& m, int cp, int rank);
inline int cp_rank_of(const MeshShape& m, int cp, int rank) { return mesh_coord(m, rank).dp % cp; }

// Bytes one ring-attention send moves: a K/V block (or its dK/dV), 2 x B x T/c x C/t elements.
int64_t ring_attention_block_bytes(int64_t B, int64_t T, int64_t C, int cp, int tp, int64_t elem_bytes);

}  // namespace dtlab
