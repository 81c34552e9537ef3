// Every run setting, declared once: its flag, JSON key, type, range, help and group, and how it
// reads and writes a TrainConfig (with any conversion: MiB to bytes, a preset to a model spec).
// The flags of dtlab-cli train and of the lab (cli/train_flags.h), the JSON an attached viewer
// receives (engine/train/config_json.h) and the Run panel's summary all walk the rows of
// settings(), so a new setting is one row in settings.cpp. Flags that change no TrainConfig field (--json, --log-every, the
// lab's window flags) stay with their front end.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/train/train.h"

namespace dtlab {

// The most ranks (--world, --stages x --dp) a run takes.
constexpr int kMaxRanks = 64;
// --unit-costs: every F, B, I and W of a pipeline costs this many modeled seconds.
constexpr double kUnitActionCost = 1e-3;

// A section of --help and of the Run panel. A strategy's group (ddp, fsdp, pipeline) and LoRA's
// have a gate: their flags are refused, with the group's sentence, unless it is open.
enum class SettingGroup : uint8_t { Run, Ddp, Fsdp, Pipeline, Mesh, Comm, Precision, Lora, Faults, Placement, Output };

// What a flag takes; the CLI picks its validator from it.
enum class SettingType : uint8_t {
  Flag,        // no value: given is true, its off_flag false
  Int,         // a whole number in [min, max]
  Real,        // a finite number in [min, max]
  Text,        // text the row parses (a model spec, a name checked later)
  Choice,      // one of a few names; the row's parser names them when it fails
  InputPath,   // a path that must exist
  OutputPath,  // a path written at the end: not empty
  IntList,     // whole numbers in [min, max], comma-separated or repeated
  TextList,    // one item per occurrence (--fault)
};

// Which front ends take the flag: dtlab-cli train and the lab, dtlab-cli train only, or none (a
// field the front end or the launcher fills, which only travels in JSON: the socket rank).
enum class SettingScope : uint8_t { Both, Cli, Json };

// A setting's value as its flag writes it: one item for a scalar ("2" for a 2 MiB bucket cap;
// "true" for a flag that is on), one per element of a list, none when the setting is off (no
// --skip-layer, no --reduce-dtype).
using SettingValue = std::vector<std::string>;

struct Setting {
  const char* flag;         // "--bucket-cap-mb"; "" for a JSON-only field
  const char* key;          // JSON path, sections joined by '.': "ddp.bucket_cap_bytes"
  SettingType type;
  SettingGroup group;
  SettingScope scope;
  std::string help;         // --help's text
  double min = 0, max = 0;  // Int, Real, IntList: the flag's range
  bool show_default = false;  // --help shows the front end's default
  const char* off_flag = "";  // a Flag's negation ("--no-shuffle")
  const char* example = "";   // a value unlike the default, in the flag's form: what the tests give
  std::function<SettingValue(const TrainConfig&)> get;
  // dtlab::Error (one sentence naming the flag, how to fix it) for a value the row refuses.
  std::function<void(TrainConfig&, const SettingValue&)> set;
  // The field(s) in their own units (bytes, not MiB); to_json leaves `out` null to write nothing.
  std::function<void(const TrainConfig&, nlohmann::json& out)> to_json;
  std::function<void(TrainConfig&, const nlohmann::json&)> from_json;
};

// Every setting, in --help's order. The order is also the order finish_train_flags applies them
// in, so a row may read an earlier one (--lr after --optimizer, --node-size after --sharding).
const std::vector<Setting>& settings();
// The row of `flag` ("--batch"), or null.
const Setting* find_setting(std::string_view flag);

struct SettingGroupInfo {
  SettingGroup group;
  const char* title;  // --help's section: "DDP"
  // Whether the group's flags apply to `c`, and the refusal's end after the flag's name when not
  // (" configures DDP; add --strategy ddp --world N"). Null: always open.
  bool (*open)(const TrainConfig& c);
  const char* refusal;
  const char* gate_flag;  // the flag that opens it, itself never refused ("--lora-rank"); "" for none
};
const SettingGroupInfo& setting_group(SettingGroup g);

// The value as one text: items joined by ','; "" when off.
std::string setting_text(const Setting& s, const TrainConfig& c);

// The settings of `c` that differ from a default TrainConfig's, as (flag or key, value) rows: what
// the Run panel shows of a launched run's configuration.
std::vector<std::pair<std::string, std::string>> changed_settings(const TrainConfig& c);

// "tiny", "small", "deep" and "wide" as their mlp: specs; any other text as it is.
std::string model_preset_spec(const std::string& name);

}  // namespace dtlab
