// Lookups in the collective table and printable names for the collective enums. Collective names use
// the PyTorch profiler's spellings so a dtlab trace and a torch.profiler trace of the same training
// step read alike.
#include "engine/core/collective.h"

#include <vector>

#include "engine/core/check.h"  // Error
#include "engine/core/format.h"

namespace dtlab {

std::optional<CollectiveOp> find_collective(std::string_view name) {
  for (const CollectiveTraits& t : kCollectiveTable)
    if (name == t.name) return t.op;
  return std::nullopt;
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

std::string algorithm_choices(const CollectiveTraits& t) {
  std::vector<std::string> names;
  for (Algorithm a : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
    if (t.runs(a)) names.push_back(algorithm_name(a));
  return choice_list(names);
}

void check_algorithm(CollectiveOp op, Algorithm algo) {
  const CollectiveTraits& t = collective_traits(op);
  if (algo == Algorithm::Default || t.algorithms == 0 || t.runs(algo)) return;
  throw Error(std::string(t.name) + " does not run the " + algorithm_name(algo) + " algorithm; use " +
              algorithm_choices(t));
}

}  // namespace dtlab
