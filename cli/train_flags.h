// The training flags dtlab-cli train and the dtlab window both take (--strategy, --world, --model,
// --batch, --lr, the DDP, FSDP and pipeline flags, --device, ...), defined once: their names, help,
// ranges and messages (add_train_flags), and the checks that turn them into a TrainConfig once
// parsing is done (finish_train_flags, choose_device). Each front end sets its own defaults first
// and adds its own flags beside these. Library dtlab_train_flags: no GUI headers, and the engine
// does not depend on it.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "cli/validators.h"
#include "engine/train/train.h"

namespace dtlab::cli {

// --unit-costs: every F, B, I and W of a pipeline costs this many modeled seconds.
constexpr double kUnitActionCost = 1e-3;
// The most ranks (--world, --stages x --dp) a run takes.
constexpr int kMaxRanks = 64;

// The flags as parsed, before finish_train_flags turns them into the config. The front end sets
// the defaults it wants (here and in the TrainConfig) before add_train_flags, whose help shows them.
struct TrainFlags {
  std::string model = "mlp:2,64,64,3";  // a spec or a preset (model_preset_spec)
  std::string optimizer = "adamw";
  double lr = 0;                        // --lr, when given; else the optimizer's default
  double bucket_cap_mb = 25, first_bucket_mb = 1;
  std::string sharding = "full", wrap = "layer", backward_prefetch = "pre";
  std::string schedule = "1f1b", split;
  bool unit_costs = false;
  std::vector<std::string> faults;
  std::string device, backend;          // "" when not given
  std::string algo, proto;              // --algo, --proto as given ("" when not given)
  // Whether a flag was given, and which flags belong to one strategy. A front end adds its own
  // flags of a strategy (dtlab-cli's --static-buckets, the lab's --compare) to that group, so
  // finish_train_flags refuses them with the others.
  CLI::Option *world = nullptr, *model_opt = nullptr, *steps = nullptr, *lr_opt = nullptr;
  CLI::Option *bucket_cap = nullptr, *first_bucket = nullptr, *node_size = nullptr;
  std::vector<CLI::Option*> ddp, fsdp, pipeline;
  std::vector<CLI::Option*> all;        // every flag added here, in the order of --help
  // LoRA (issue 17): --lora-rank, --lora-alpha, --lora-layers, --merge-lora
  int lora_rank = 0;
  CLI::Option *lora_rank_opt = nullptr, *lora_alpha_opt = nullptr, *lora_layers_opt = nullptr, *merge_lora_opt = nullptr;
  // Mixed precision (issue 17): --precision, --reduce-dtype
  std::string precision = "fp32", reduce_dtype;
  std::string strategy = "single";  // parsed into TrainConfig::strategy by finish_train_flags
};

// "tiny", "small", "deep" and "wide" as their mlp: specs; any other text as it is.
std::string model_preset_spec(const std::string& name);

// Adds the shared flags to `app`, bound to `f` and `c`.
void add_train_flags(CLI::App& app, TrainFlags& f, TrainConfig& c);

// After parsing: the model, optimizer, DDP buckets, faults, FSDP and pipeline settings into `c`,
// and the world of --strategy single (one rank) and of a pipeline (stages x dp unless --world is
// given). Throws dtlab::Error (one sentence: what is wrong, how to fix it) for bad values and for a
// strategy's flag given with another strategy.
void finish_train_flags(const TrainFlags& f, TrainConfig& c);

// Where the ranks run: --device and --backend as given, else engine/train/device_select.h's choice
// for `ranks_on_node` ranks on this machine (`fallback_device` stands in for an absent --device; ""
// takes DTLAB_DEVICE or the GPUs found). Sets c.device, c.backend and c.launched; returns the why
// for the run's header.
std::string choose_device(const TrainFlags& f, TrainConfig& c, int ranks_on_node, const std::string& fallback_device = "");

}  // namespace dtlab::cli
