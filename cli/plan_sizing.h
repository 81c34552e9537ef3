// dtlab-cli plan's sizing mode (--global-batch, --dp, --pp, --zero, --recompute, --mfu): the whole
// calculator of engine/parallel/sizing.h printed as one table by section, or as JSON.
#pragma once
#include "cli/cli.h"
#include "engine/parallel/sizing.h"

namespace dtlab::cli {

void print_sizing(const SizingInput& in, const SizingPlan& p, bool json, Streams& io);

}  // namespace dtlab::cli
