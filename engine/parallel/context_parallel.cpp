#include "engine/parallel/context_parallel.h"

namespace dtlab {

void GroupContextParallelComm::send_recv(void* recv, int from, const void* send, int to, int64_t n, DType dtype, int) {
  group_.ring_send_recv(send, n, to, 0, recv, n, from, 0, dtype)->wait();
}

void GroupContextParallelComm::all_to_all(void* out, const void* in, int64_t count, DType dtype, int) {
  group_.all_to_all(out, in, count, dtype)->wait();
}

void GroupContextParallelComm::all_reduce(void* data, int64_t n, DType dtype, int) {
  group_.all_reduce(data, n, dtype, ReduceOp::Sum)->wait();
}

std::vector<int> cp_group_ranks(const MeshShape& m, int cp, int rank) {
  MeshCoord at = mesh_coord(m, rank);
  const int first = at.dp / cp * cp;
  std::vector<int> ranks;
  for (int i = 0; i < cp; i++) {
    at.dp = first + i;
    ranks.push_back(mesh_rank(m, at));
  }
  return ranks;
}

int64_t ring_attention_block_bytes(int64_t B, int64_t T, int64_t C, int cp, int tp, int64_t elem_bytes) {
  return 2 * B * (T / cp) * (C / tp) * elem_bytes;
}

}  // namespace dtlab
