#include "cli/train_flags.h"

#include <limits>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/train/device_probe.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/tuning.h"

namespace dtlab::cli {

namespace {

bool takes(SettingScope front_end, const Setting& s) {
  return s.scope == SettingScope::Both || (s.scope == SettingScope::Cli && front_end == SettingScope::Cli);
}

// A row's range as whole numbers; the widest rows (no range of their own) span int64_t.
int64_t whole(double v) {
  if (v <= static_cast<double>(std::numeric_limits<int64_t>::min())) return std::numeric_limits<int64_t>::min();
  if (v >= static_cast<double>(std::numeric_limits<int64_t>::max())) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(v);
}

CLI::Option* add_flag_of(CLI::App& app, const Setting& s, TrainFlags::Slot& slot, const TrainConfig& c) {
  if (s.type == SettingType::Flag) {
    const std::string names = *s.off_flag ? std::string(s.flag) + ",!" + s.off_flag : std::string(s.flag);
    return app.add_flag(names, slot.on, s.help);
  }
  const bool list = s.type == SettingType::IntList || s.type == SettingType::TextList;
  CLI::Option* o = list ? app.add_option(s.flag, slot.items, s.help) : app.add_option(s.flag, slot.text, s.help);
  switch (s.type) {
    case SettingType::Int:
    case SettingType::IntList:
      o->check(whole_number(whole(s.min), whole(s.max)))->type_name("INT");
      if (list) o->delimiter(',');
      break;
    case SettingType::Real: o->check(real_number(s.min, s.max))->type_name("FLOAT"); break;
    case SettingType::InputPath: o->check(existing_path()); break;
    case SettingType::OutputPath: o->check(output_path()); break;
    default: break;
  }
  if (s.show_default) o->default_str(setting_text(s, c));
  return o;
}

SettingValue parsed_value(const TrainFlags::Slot& slot) {
  switch (slot.setting->type) {
    case SettingType::Flag: return {slot.on ? "true" : "false"};
    case SettingType::IntList:
    case SettingType::TextList: return slot.items;
    default: return {slot.text};
  }
}

// A flag of a group that does not apply to `c` (a DDP flag without --strategy ddp).
void refuse_outside_group(const TrainConfig& c, SettingGroup group, const std::string& flag) {
  const SettingGroupInfo& g = setting_group(group);
  if (g.open && !g.open(c) && flag != g.gate_flag) throw Error(flag + g.refusal);
}

const TrainFlags::Slot* slot_of(const TrainFlags& f, std::string_view flag) {
  for (const TrainFlags::Slot& s : f.slots)
    if (flag == s.setting->flag) return &s;
  return nullptr;
}

}  // namespace

CLI::Option* TrainFlags::option(std::string_view flag) const {
  const Slot* s = slot_of(*this, flag);
  return s ? s->option : nullptr;
}

bool TrainFlags::given(std::string_view flag) const {
  const CLI::Option* o = option(flag);
  return o && o->count() > 0;
}

std::string TrainFlags::text(std::string_view flag) const {
  const Slot* s = slot_of(*this, flag);
  return s && s->option->count() > 0 ? join(parsed_value(*s), ",") : "";
}

void add_train_flags(CLI::App& app, TrainFlags& f, const TrainConfig& c, SettingScope scope) {
  DTLAB_CHECK(f.slots.empty(), "add_train_flags binds CLI11 to the slots once; give it a fresh TrainFlags");
  size_t n = 0;
  for (const Setting& s : settings()) n += takes(scope, s) ? 1 : 0;
  f.slots.resize(n);  // never again: CLI11 holds the slots' addresses
  size_t i = 0;
  for (const Setting& s : settings()) {
    if (!takes(scope, s)) continue;
    TrainFlags::Slot& slot = f.slots[i++];
    slot.setting = &s;
    slot.option = add_flag_of(app, s, slot, c);
    slot.option->group(setting_group(s.group).title);
    f.all.push_back(slot.option);
  }
}

void finish_train_flags(const TrainFlags& f, TrainConfig& c) {
  for (const TrainFlags::Slot& slot : f.slots) {
    if (slot.option->count() == 0) continue;
    refuse_outside_group(c, slot.setting->group, slot.setting->flag);
    slot.setting->set(c, parsed_value(slot));
  }
  for (const auto& [group, o] : f.grouped)
    if (o->count() > 0) refuse_outside_group(c, group, o->get_name());
  // (An empty --moe reads as "off" in a config's JSON; given as a flag it is a slip.)
  if (f.given("--moe") && !c.moe.on()) throw Error("--moe was given no experts; write it as --moe experts=E,top_k=K (e.g. experts=4,top_k=2)");
  // Naming "this" profile measures the machine (about 0.3 s; a second under ASan): only when a
  // forced algorithm needs its figures, so a refused flag still answers at once.
  if (c.algo == Algorithm::InNetwork || c.profile != "this") check_forced_choice(find_profile(c.profile), CollectiveOp::AllReduce, c.algo, c.proto);
  if (f.given("--lora-rank")) {
    check_lora_spec(c.model, c.lora);
    if (c.merge_lora && c.save_path.empty()) throw Error("--merge-lora says what --save writes; add --save PATH.safetensors");
  }
  // A GPT reads text: the shipped one unless --data says which (an explicit spiral is refused by the run).
  if (c.model.is_gpt() && !f.given("--data")) c.data = "text";
  check_fsdp_options(c);
  if (c.strategy == Strategy::Pipeline && !f.given("--world")) c.world_size = c.pipeline.stages * c.pipeline.dp * c.cp * c.tp;
  if (c.strategy == Strategy::Single) {
    if (f.given("--world") && c.world_size != 1)
      throw Error("--strategy single runs one rank, but --world is " + std::to_string(c.world_size) +
                  "; drop --world, set it to 1, or use --strategy ddp");
    c.world_size = 1;
    if (!c.faults.empty()) throw Error("--fault injects into the ranks' collectives; add --strategy ddp (or fsdp) --world N");
  }
}

std::vector<std::string> setting_args(const Setting& s, const TrainConfig& c) {
  const SettingValue v = s.get(c);
  if (!*s.flag || v.empty()) return {};
  switch (s.type) {
    case SettingType::Flag:
      if (v[0] == "true") return {s.flag};
      return *s.off_flag ? std::vector<std::string>{s.off_flag} : std::vector<std::string>{};
    case SettingType::TextList: {
      std::vector<std::string> args;
      for (const std::string& item : v) args.insert(args.end(), {s.flag, item});
      return args;
    }
    default: return {s.flag, join(v, ",")};
  }
}

std::string choose_device(const TrainFlags& f, TrainConfig& c, int ranks_on_node, const std::string& fallback_device) {
  DeviceQuery q;
  q.device = f.given("--device") ? c.device : fallback_device;
  q.backend = f.given("--backend") ? c.backend : "";
  q.strategy = c.strategy;
  q.ranks_on_node = ranks_on_node;
  probe_devices(q);
  const DeviceChoice dc = resolve_device(q);
  c.device = dc.device;
  c.backend = dc.backend;
  c.launched = dc.launched;
  return dc.why;
}

}  // namespace dtlab::cli
