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
    case Algorithm::DoubleTree: return "dbtree";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::InNetwork: return "nvls";
    case Algorithm::Pairwise: return "pairwise";
    case Algorithm::Grouped: return "grouped";
  }
  return "?";
}

const char* algorithm_display_name(Algorithm a) {
  switch (a) {
    case Algorithm::Tree: return "binomial tree";
    case Algorithm::DoubleTree: return "double binary tree";
    case Algorithm::InNetwork: return "in-network (NVLS/SHARP)";
    case Algorithm::Pairwise: return "pairwise exchange";
    case Algorithm::Grouped: return "grouped send/recv";
    default: return algorithm_name(a);
  }
}

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::Default: return "default";
    case Protocol::Simple: return "simple";
    case Protocol::LL: return "ll";
    case Protocol::LL128: return "ll128";
  }
  return "?";
}

Protocol parse_protocol(std::string_view text) {
  for (Protocol p : {Protocol::Simple, Protocol::LL, Protocol::LL128, Protocol::Default})
    if (text == protocol_name(p)) return p;
  throw Error("protocol '" + std::string(text) + "' is not known; use simple, ll or ll128");
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
  if (text == algorithm_name(Algorithm::Default)) return Algorithm::Default;
  std::vector<std::string> names;
  for (Algorithm a : kAlgorithms) {
    if (text == algorithm_name(a)) return a;
    names.push_back(algorithm_name(a));
  }
  throw Error("algorithm '" + std::string(text) + "' is not known; use " + choice_list(names));
}

std::string algorithm_choices(const CollectiveTraits& t) {
  std::vector<std::string> names;
  for (Algorithm a : kAlgorithms)
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
