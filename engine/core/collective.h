// What the collectives are, below every layer that names them: the op, reduction and algorithm enums
// and their printable names. The communicator (engine/comm) runs them; events and the cost model
// (engine/trace) describe them; both include this leaf header, never each other for these names.
#pragma once
#include <cstdint>
#include <string_view>

namespace dtlab {

enum class ReduceOp : uint8_t { Sum, Avg, Max };
enum class CollectiveOp : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Barrier,
  Send,
  Recv,
  AllToAll,
  // new values go at the end
};
// Default: the communicator's configured algorithm for that op (ring for all-reduce,
// reduce-scatter and all-gather; tree for broadcast and reduce).
enum class Algorithm : uint8_t { Default, Ring, Tree, Naive };

// PyTorch profiler spellings ("allreduce", "reduce_scatter", "allgather", "broadcast", ...).
const char* collective_name(CollectiveOp op);
const char* algorithm_name(Algorithm a);  // "default", "ring", "tree", "naive"
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"
Algorithm parse_algorithm(std::string_view text);  // dtlab::Error on unknown names
// dtlab::Error unless the op runs that algorithm: all-reduce ring|tree|naive; reduce-scatter and
// all-gather ring; broadcast and reduce tree|naive; Default is always fine.
void check_algorithm(CollectiveOp op, Algorithm algo);

}  // namespace dtlab
