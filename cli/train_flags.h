// The training flags dtlab-cli train and the dtlab window both take (--strategy, --world, --model,
// --batch, --lr, the DDP, FSDP and pipeline flags, --device, ...): one CLI11 flag per row of
// engine/train/settings.h (add_train_flags), with the row's name, help, range and conversion, and
// the checks across rows once parsing is done (finish_train_flags, choose_device). Each front end
// sets its own defaults in the TrainConfig first and adds its own flags beside these. Library
// dtlab_train_flags: no GUI headers, and the engine does not depend on it.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cli/validators.h"
#include "engine/train/settings.h"
#include "engine/train/train.h"

namespace dtlab::cli {

using dtlab::kMaxRanks;
using dtlab::kUnitActionCost;
using dtlab::model_preset_spec;

// The flags as parsed, before finish_train_flags sets them on the config. Not movable once
// add_train_flags has bound CLI11 to its slots.
struct TrainFlags {
  // One per row added: the row, its CLI11 option and what was parsed into it.
  struct Slot {
    const Setting* setting = nullptr;
    CLI::Option* option = nullptr;
    std::string text;                // a one-value flag
    std::vector<std::string> items;  // a list
    bool on = false;                 // a Flag (false: its off_flag was given)
  };
  std::vector<Slot> slots;
  std::vector<CLI::Option*> all;  // every flag added here, in the order of --help
  // A front end's own flags of a setting group (the lab's --compare is a pipeline flag): refused
  // with the group's sentence like the table's.
  std::vector<std::pair<SettingGroup, CLI::Option*>> grouped;

  // The option of `flag` ("--world"), or null when it was not added.
  CLI::Option* option(std::string_view flag) const;
  bool given(std::string_view flag) const;
  // What was parsed for `flag`, in the row's form ("" when not given).
  std::string text(std::string_view flag) const;
};

// Adds a flag to `app` for every row of the table that `scope` takes (Both: the lab; Cli:
// dtlab-cli train, which takes Both's rows and its own), its --help default read from `c`.
void add_train_flags(CLI::App& app, TrainFlags& f, const TrainConfig& c, SettingScope scope);

// After parsing: each given flag's row sets `c`, in the table's order (a strategy's flag given with
// another strategy is refused with its group's sentence), then the checks across rows: the profile
// and a forced algorithm, LoRA's spec, the world of --strategy single (one rank) and of a pipeline
// (stages x dp x tp unless --world is given). Throws dtlab::Error (one sentence: what is wrong, how
// to fix it).
void finish_train_flags(const TrainFlags& f, TrainConfig& c);

// The arguments that give `s` the value it has in `c` ("--bucket-cap-mb", "2"; a list as one
// comma-separated value, --fault once per item; a Flag that is off by its off_flag), or none when
// the row's value is off. The inverse of parsing, for tests and for printing a run's command line.
std::vector<std::string> setting_args(const Setting& s, const TrainConfig& c);

// Where the ranks run: --device and --backend as given, else engine/train/device_select.h's choice
// for `ranks_on_node` ranks on this machine (`fallback_device` stands in for an absent --device; ""
// takes DTLAB_DEVICE or the GPUs found). Sets c.device, c.backend and c.launched; returns the why
// for the run's header.
std::string choose_device(const TrainFlags& f, TrainConfig& c, int ranks_on_node, const std::string& fallback_device = "");

}  // namespace dtlab::cli
