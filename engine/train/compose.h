// What a run's configuration composes: the features it turns on (engine/train/strategy.h), and
// every refusal of one of them, read from two tables: the strategy's row, then the combinations of
// features that do not run together (kCombinations in compose.cpp). Validation throws the first
// refusal; the lab greys a control out with its sentence; docs/composition.md lists the tables.
#pragma once
#include <string>
#include <vector>

#include "engine/train/strategy.h"

namespace dtlab {

struct TrainConfig;

// The features `c` turns on, in the order they are checked.
std::vector<Feature> features_used(const TrainConfig& c);

// One sentence refusing feature `f` in `c` (which need not turn it on: the lab asks before a
// control is touched), or empty when `c` with `f` runs.
std::string feature_refusal(const TrainConfig& c, Feature f);

// dtlab::Error with the first refusal of a feature `c` turns on.
void check_composition(const TrainConfig& c);

// Every refusal the tables hold, one line each ("dp x --precision: not built yet, ..."): the docs'
// list, and the count a test watches.
struct RefusalLine {
  std::string what, sentence;
  bool pending = false;
};
std::vector<RefusalLine> all_refusals();

}  // namespace dtlab
