// `dtlab-cli train --strategy pipeline`: its flags, and what the run prints about the pipeline (the
// stages in the header; bubbles, in-flight micro-batches and activation memory per rank at the end,
// each beside its formula). Kept apart from cmd_train.cpp, which only calls these.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "engine/train/train.h"

namespace dtlab::cli {

struct PipelineArgs {
  std::string schedule = "1f1b", split;
  bool unit_costs = false;
  std::vector<CLI::Option*> options;  // every pipeline flag, to refuse them with another strategy
};

void add_pipeline_flags(CLI::App& app, PipelineArgs& a, TrainConfig& c);
// After parsing: fills c.pipeline, and the world (stages x dp) unless --world was given. Throws
// dtlab::Error (one sentence) for a pipeline flag without --strategy pipeline.
void finish_pipeline_config(const PipelineArgs& a, TrainConfig& c, bool world_given);
void print_pipeline_header(std::ostream& out, const Trainer& trainer);
void print_pipeline_summary(std::ostream& out, const Trainer& trainer, const TrainSummary& s);
nlohmann::json pipeline_json(const TrainSummary& s);

}  // namespace dtlab::cli
