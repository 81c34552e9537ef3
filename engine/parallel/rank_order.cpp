#include "engine/parallel/rank_order.h"

#include <array>

#include "engine/core/check.h"

namespace dtlab {

namespace {

// The generator's dimensions from the fastest (tp) to the slowest (pp), and which of them the group
// spans: the dense layers' tp, cp, dp, pp or the experts' tp, ep, edp, pp.
struct Generator {
  std::array<int, 4> sizes{};
  std::array<bool, 4> in_group{};
};

Generator generator_of(const MegatronLayout& l, ParallelGroup g) {
  switch (g) {
    case ParallelGroup::TP: return {{l.tp, l.cp, l.dp, l.pp}, {true, false, false, false}};
    case ParallelGroup::CP: return {{l.tp, l.cp, l.dp, l.pp}, {false, true, false, false}};
    case ParallelGroup::DP: return {{l.tp, l.cp, l.dp, l.pp}, {false, false, true, false}};
    case ParallelGroup::PP: return {{l.tp, l.cp, l.dp, l.pp}, {false, false, false, true}};
    case ParallelGroup::DPCP: return {{l.tp, l.cp, l.dp, l.pp}, {false, true, true, false}};
    case ParallelGroup::EP: return {{l.tp, l.ep, l.expert_dp(), l.pp}, {false, true, false, false}};
    case ParallelGroup::EDP: return {{l.tp, l.ep, l.expert_dp(), l.pp}, {false, false, true, false}};
  }
  return {};
}

}  // namespace

const char* parallel_group_name(ParallelGroup g) {
  switch (g) {
    case ParallelGroup::TP: return "tp";
    case ParallelGroup::CP: return "cp";
    case ParallelGroup::DP: return "dp";
    case ParallelGroup::PP: return "pp";
    case ParallelGroup::DPCP: return "dp x cp";
    case ParallelGroup::EP: return "ep";
    case ParallelGroup::EDP: return "edp";
  }
  return "?";
}

void check_megatron_layout(const MegatronLayout& l) {
  if (l.tp < 1 || l.cp < 1 || l.ep < 1 || l.dp < 1 || l.pp < 1) throw Error("every parallel degree must be at least 1");
  if ((l.dp * l.cp) % l.ep != 0)
    throw Error("--ep " + std::to_string(l.ep) + " does not divide dp x cp = " + std::to_string(l.dp * l.cp) +
                "; Megatron carves each expert-parallel group out of the data- and context-parallel ranks, so pick a divisor of it");
}

std::vector<std::vector<int>> megatron_groups(const MegatronLayout& l, ParallelGroup g) {
  check_megatron_layout(l);
  const Generator gen = generator_of(l, g);
  int group_size = 1, groups = 1;
  for (int i = 0; i < 4; i++) (gen.in_group[i] ? group_size : groups) *= gen.sizes[i];
  std::vector<std::vector<int>> out(static_cast<size_t>(groups));
  for (auto& v : out) v.reserve(static_cast<size_t>(group_size));
  // Ranks ascend, so each group's members come out in order of their coordinate in the group, and the
  // group key (the other coordinates, the slowest most significant) orders groups by their lowest rank.
  for (int r = 0; r < l.world(); r++) {
    int rest = r, key = 0, key_scale = 1;
    for (int i = 0; i < 4; i++) {
      const int c = rest % gen.sizes[i];
      rest /= gen.sizes[i];
      if (!gen.in_group[i]) key += c * key_scale, key_scale *= gen.sizes[i];
    }
    out[static_cast<size_t>(key)].push_back(r);
  }
  return out;
}

GroupPlacement place_group(const MegatronLayout& l, ParallelGroup g, int gpus_per_node) {
  const int G = gpus_per_node > 0 ? gpus_per_node : 1;
  GroupPlacement p;
  for (const std::vector<int>& members : megatron_groups(l, g)) {
    p.groups++;
    p.size = static_cast<int>(members.size());
    if (members.size() > 1) p.stride = members[1] - members[0];
    p.spanning += members.front() / G != members.back() / G;  // ascending, so the ends decide
  }
  return p;
}

}  // namespace dtlab
