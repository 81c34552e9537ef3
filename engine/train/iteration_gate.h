// The start of an iteration, the same in every training loop (train.cpp, train_pipeline.cpp,
// train_dp.cpp): pass the rank's iteration gate, where a stepped world holds it, or stop when the
// run was aborted while it waited.
#pragma once
#include <cstdint>
#include <string>

#include "engine/comm/communicator.h"
#include "engine/trace/context.h"

namespace dtlab {

// ctx may be null (no stepper: nothing to pass).
inline void enter_iteration(RankContext* ctx, int rank, int32_t iter) {
  if (ctx && !ctx->begin_iteration(iter))
    throw CommError("rank " + std::to_string(rank) + " stopped before iteration " + std::to_string(iter) + ": the run was aborted");
}

}  // namespace dtlab
