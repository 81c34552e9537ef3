// What `dtlab-cli train --strategy pipeline` prints about the pipeline (the stages in the header;
// bubbles, in-flight micro-batches and activation memory per rank at the end, each beside its
// formula). Kept apart from cmd_train.cpp, which only calls these; the flags are in train_flags.h.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "engine/train/train.h"

namespace dtlab::cli {

void print_pipeline_header(std::ostream& out, const Trainer& trainer);
void print_pipeline_summary(std::ostream& out, const Trainer& trainer, const TrainSummary& s);
nlohmann::json pipeline_json(const TrainSummary& s);

}  // namespace dtlab::cli
