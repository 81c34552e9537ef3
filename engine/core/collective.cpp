// Printable names for the collective enums. Collective names use the PyTorch profiler's spellings so a
// dtlab trace and a torch.profiler trace of the same training step read alike.
#include "engine/core/collective.h"

#include <string>

#include "engine/core/check.h"

namespace dtlab {

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllReduce: return "allreduce";
    case CollectiveOp::ReduceScatter: return "reduce_scatter";
    case CollectiveOp::AllGather: return "allgather";
    case CollectiveOp::Broadcast: return "broadcast";
    case CollectiveOp::Reduce: return "reduce";
    case CollectiveOp::Barrier: return "barrier";
    case CollectiveOp::Send: return "send";
    case CollectiveOp::Recv: return "recv";
    case CollectiveOp::AllToAll: return "all_to_all";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::Default: return "default";
    case Algorithm::Ring: return "ring";
    case Algorithm::Tree: return "tree";
    case Algorithm::Naive: return "naive";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view text) {
  for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive, Algorithm::Default})
    if (text == algorithm_name(a)) return a;
  throw Error("algorithm '" + std::string(text) + "' is not known; use ring, tree or naive");
}

void check_algorithm(CollectiveOp op, Algorithm algo) {
  if (algo == Algorithm::Default) return;
  const char* allowed = nullptr;
  switch (op) {
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllGather:
      if (algo != Algorithm::Ring) allowed = "ring";
      break;
    case CollectiveOp::Broadcast:
    case CollectiveOp::Reduce:
      if (algo == Algorithm::Ring) allowed = "tree or naive";
      break;
    default: break;
  }
  if (allowed)
    throw Error(std::string(collective_name(op)) + " does not run the " + algorithm_name(algo) +
                " algorithm; use " + allowed);
}

}  // namespace dtlab
