// Every run setting of engine/train/settings.h round-trips: through the flags dtlab-cli train and the
// lab parse (cli/train_flags.h) and through the JSON an attached viewer receives
// (engine/train/config_json.h). And no flag of `dtlab-cli train --help` that changes the run lives
// outside the table, so a flag added beside it fails here.
#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/train_flags.h"
#include "engine/core/check.h"
#include "engine/train/config_json.h"
#include "engine/train/settings.h"
#include "tests/cli_util.h"

using namespace dtlab;

namespace {

using Args = std::vector<std::string>;

// `args` through the flags dtlab-cli train adds and the checks it makes after parsing.
TrainConfig parse_train(const Args& args) {
  CLI::App app{"settings test"};
  cli::TrainFlags f;
  TrainConfig c;
  cli::add_train_flags(app, f, c, SettingScope::Cli);
  app.parse(Args(args.rbegin(), args.rend()));  // CLI11 takes the arguments reversed
  cli::finish_train_flags(f, c);
  return c;
}

// What a row needs beside it to be accepted: its group's gate, and the few rows that read another.
Args context_of(const Setting& s) {
  const std::string flag = s.flag;
  Args a;
  if (s.group == SettingGroup::Ddp || flag == "--fault") a = {"--strategy", "ddp", "--world", "2"};
  if (flag == "--world") a = {"--strategy", "ddp"};
  if (s.group == SettingGroup::Fsdp) a = {"--strategy", "fsdp", "--world", "2"};
  if (s.group == SettingGroup::Pipeline) a = {"--strategy", "pipeline"};
  if (s.group == SettingGroup::Lora && flag != setting_group(SettingGroup::Lora).gate_flag) a = {"--lora-rank", "2"};
  if (flag == "--node-size") a.insert(a.end(), {"--sharding", "hybrid"});
  if (flag == "--reshard-after-forward" || flag == "--prefetch") a.insert(a.end(), {"--fsdp-api", "2"});
  if (flag == "--merge-lora") a.insert(a.end(), {"--save", "merged.safetensors"});
  if (flag == "--reduce-dtype") a.insert(a.end(), {"--precision", "bf16"});
  if (flag == "--momentum") a.insert(a.end(), {"--optimizer", "sgd"});
  return a;
}

// The row's example as its value: a list's items are comma-separated, except --fault's one item.
SettingValue example_value(const Setting& s) {
  if (s.type != SettingType::IntList) return {s.example};
  SettingValue v;
  std::stringstream in(s.example);
  for (std::string item; std::getline(in, item, ',');) v.push_back(item);
  return v;
}

std::string joined(const Args& args) {
  std::string s;
  for (const std::string& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

// The option names of a --help text: "--world" of "  --world INT:INT in [1..64]=1 ...".
std::set<std::string> help_flags(const std::string& help) {
  std::set<std::string> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line[start] != '-') continue;
    std::string names = line.substr(start, line.find(' ', start) - start);
    std::stringstream parts(names);
    for (std::string name; std::getline(parts, name, ',');) {
      name = name.substr(0, name.find_first_of("{="));
      if (name.rfind("--", 0) == 0) flags.insert(name);
    }
  }
  return flags;
}

}  // namespace

TEST_SUITE("settings") {
  TEST_CASE("every row with a flag: a value unlike the default, as flags, parses back to the same field") {
    int rows = 0;
    for (const Setting& s : settings()) {
      if (!*s.flag) continue;
      const std::string flag = s.flag;
      CAPTURE(flag);
      const Args context = context_of(s);
      const TrainConfig base = parse_train(context);
      TrainConfig want = base;
      s.set(want, example_value(s));
      CHECK(setting_text(s, want) != setting_text(s, base));
      const Args given = cli::setting_args(s, want);
      REQUIRE(!given.empty());
      Args args = context;
      args.insert(args.end(), given.begin(), given.end());
      CAPTURE(joined(args));
      const TrainConfig got = parse_train(args);
      CHECK(setting_text(s, got) == setting_text(s, want));
      rows++;
    }
    CHECK(rows > 50);
  }

  TEST_CASE("every row: a value unlike the default survives the viewer's JSON, with the rest of the configuration") {
    for (const Setting& s : settings()) {
      const std::string key = s.key;
      CAPTURE(key);
      TrainConfig want = *s.flag ? parse_train(context_of(s)) : TrainConfig{};
      const std::string before = setting_text(s, want);
      s.set(want, example_value(s));
      CHECK(setting_text(s, want) != before);
      const std::string json = train_config_to_json(want);
      const TrainConfig back = train_config_from_json(json);
      CHECK(setting_text(s, back) == setting_text(s, want));
      CHECK(train_config_to_json(back) == json);
    }
  }

  TEST_CASE("the keys are one per row, and so are the flags") {
    std::set<std::string> keys, flags;
    for (const Setting& s : settings()) {
      const std::string key = s.key;
      CAPTURE(key);
      CHECK(keys.insert(s.key).second);
      if (*s.flag) CHECK(flags.insert(s.flag).second);
      CHECK(!s.help.empty());
      CHECK(*s.example);
      CHECK((s.scope == SettingScope::Json) == !*s.flag);
    }
  }

  TEST_CASE("an older run's JSON, without the newer keys, loads with their defaults") {
    const TrainConfig c = train_config_from_json(
        R"({"strategy":"ddp","world_size":2,"model":"mlp:2,8,3","ddp":{"bucket_cap_bytes":1234},"optimizer":{"kind":"sgd","lr":0.5}})");
    const TrainConfig defaults;
    CHECK(c.strategy == Strategy::Ddp);
    CHECK(c.ddp.bucket_cap_bytes == 1234);
    CHECK(c.optimizer.kind == OptimizerKind::SGD);
    CHECK(c.optimizer.lr == 0.5);
    CHECK(c.tp == defaults.tp);
    CHECK(c.lora.rank == 0);
    CHECK(c.precision == Precision::FP32);
    CHECK(!c.reduce_fp32);
    CHECK(c.inject_overflow_steps.empty());
    CHECK_THROWS_WITH_AS(train_config_from_json(R"({"ddp": 5})"), doctest::Contains("'ddp' must be an object"), Error);
    CHECK_THROWS_WITH_AS(train_config_from_json(R"({"lora": {"layers": [0, 2.5]}})"),
                         doctest::Contains("'lora.layers' is not a whole number in range"), Error);
  }

  TEST_CASE("a group's flag without its gate is refused with the group's sentence") {
    for (const Setting& s : settings()) {
      const SettingGroupInfo& g = setting_group(s.group);
      if (!*s.flag || !g.open || s.flag == std::string(g.gate_flag)) continue;
      const std::string flag = s.flag;
      CAPTURE(flag);
      const Args args = s.type == SettingType::Flag ? Args{std::string(s.example) == "true" ? s.flag : s.off_flag} : Args{s.flag, s.example};
      CHECK_THROWS_WITH_AS(parse_train(args), (flag + g.refusal).c_str(), Error);
    }
  }

  TEST_CASE("every flag of dtlab-cli train that changes the run is a row of the table") {
    const test::CliResult r = test::run_cli({"train", "--help"});
    REQUIRE(r.code == 0);
    const std::set<std::string> flags = help_flags(r.out);
    // How dtlab-cli reports, not what runs.
    const std::set<std::string> not_settings = {"--help", "--json", "--log-every"};
    for (const std::string& flag : flags) {
      CAPTURE(flag);
      if (not_settings.count(flag) == 0) CHECK(find_setting(flag) != nullptr);
    }
    for (const Setting& s : settings()) {
      const std::string flag = s.flag;
      CAPTURE(flag);
      if (s.scope != SettingScope::Json) CHECK(flags.count(s.flag) == 1);
    }
  }

  TEST_CASE("the Run panel's rows: the settings a configuration changes, in the flags' words") {
    TrainConfig c;
    c.strategy = Strategy::Ddp;
    c.ddp.bucket_cap_bytes = 2 << 20;
    c.lora.rank = 4;
    const auto rows = changed_settings(c);
    REQUIRE(rows.size() == 3);
    CHECK(rows[0] == std::pair<std::string, std::string>{"--strategy", "ddp"});
    CHECK(rows[1] == std::pair<std::string, std::string>{"--bucket-cap-mb", "2"});
    CHECK(rows[2] == std::pair<std::string, std::string>{"--lora-rank", "4"});
  }
}
