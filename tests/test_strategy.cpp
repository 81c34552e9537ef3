// The strategies as a type (engine/train/strategy.h) and the one table of what composes
// (engine/train/compose.h): parsing, the refusals every front end reads, the docs that list them,
// and the rule that strategy names are compared only where the setting is parsed.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "engine/core/check.h"
#include "engine/train/compose.h"
#include "engine/train/train.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_SUITE("strategy") {
  TEST_CASE("every strategy name parses back to it, anything else is one sentence naming them") {
    for (const StrategyTraits& t : strategy_table()) {
      CAPTURE(t.name);
      CHECK(parse_strategy(t.name) == t.kind);
      CHECK(&strategy_traits(t.kind) == &t);
    }
    CHECK(strategy_choices() == "single | ddp | dp | fsdp | pipeline");
    CHECK_THROWS_WITH(parse_strategy("tensor"), "--strategy 'tensor' is not a strategy; use single, ddp, dp, fsdp, pipeline");
  }

  TEST_CASE("a refused feature names the flag, the strategy, why and what to do instead") {
    TrainConfig c = test::demo_config("pipeline", 2, 16, 1);
    c.pipeline.stages = 2;
    CHECK(feature_refusal(c, Feature::Accumulation) ==
          "--accum with --strategy pipeline: the micro-batches are the pipeline's accumulation; use --microbatches");
    CHECK(feature_refusal(c, Feature::TensorParallel).empty());
    c.strategy = Strategy::Ddp;
    for (int i = 0; i < kFeatureCount; i++) {
      const Feature f = static_cast<Feature>(i);
      CAPTURE(feature_flag(f));
      // DDP runs with everything it can hold (--moe and --cp need a GPT, and this run's model is an MLP).
      if (f != Feature::SaveSharded && f != Feature::Moe && f != Feature::ContextParallel) CHECK(feature_refusal(c, f).empty());
    }
    // A combination's refusal holds whatever the strategy: autocast on the GPT.
    c.device = "cuda";
    c.backend = "nccl";
    CHECK(feature_refusal(c, Feature::TensorParallel).empty());  // TP runs on GPUs
    c.precision = Precision::BF16;
    CHECK(feature_refusal(c, Feature::MixedPrecision).empty());  // and 16 bits
    c.strategy = Strategy::Pipeline;
    c.tp = 2;
    c.sequence_parallel = true;
    CHECK(feature_refusal(c, Feature::SequenceParallel).empty());  // an MLP's stages send their TP rank's rows
    c.model = ModelSpec::parse("gpt-tiny");
    c.precision = Precision::FP32;
    c.amp = Precision::BF16;
    CHECK(feature_refusal(c, Feature::MixedPrecision).empty());  // autocast on the GPT's stages
  }

  TEST_CASE("validation throws the table's sentence, the first feature the run turns on") {
    TrainConfig c = test::demo_config("pipeline", 2, 16, 1);
    c.accum = 2;
    CHECK(test::error_of(c) == feature_refusal(c, Feature::Accumulation));
    c.accum = 1;
    CHECK(test::error_of(c).empty());
  }

  TEST_CASE("the refusals: how many remain, how many only wait for the engine, and the docs list each") {
    const std::vector<RefusalLine> all = all_refusals();
    int pending = 0;
    for (const RefusalLine& r : all) pending += r.pending;
    MESSAGE(all.size() << " refusals, " << pending << " of them not built yet");
    const std::string doc = read_text(std::filesystem::path(DTLAB_SOURCE_DIR) / "docs" / "composition.md");
    REQUIRE(!doc.empty());
    for (const RefusalLine& r : all) {
      CAPTURE(r.sentence);
      CHECK(doc.find(r.sentence) != std::string::npos);
    }
    // The docs' count is the table's.
    CHECK(doc.find(std::to_string(all.size()) + " refusals, " + std::to_string(pending) + " not built yet") != std::string::npos);
  }

  TEST_CASE("strategy names are compared only where the setting is parsed") {
    // `x.strategy == "ddp"` anywhere in the engine, the CLI or the lab would bypass the table.
    const std::regex compare(R"re(strategy\s*[!=]=\s*"|"(single|ddp|dp|fsdp|pipeline)"\s*[!=]=)re");
    int found = 0;
    for (const char* dir : {"engine", "cli", "app"})
      for (const auto& e : std::filesystem::recursive_directory_iterator(std::filesystem::path(DTLAB_SOURCE_DIR) / dir)) {
        const std::string ext = e.path().extension().string();
        if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
        const std::string text = read_text(e.path());
        for (auto it = std::sregex_iterator(text.begin(), text.end(), compare); it != std::sregex_iterator(); ++it) {
          MESSAGE(e.path().string() << ": " << it->str());
          found++;
        }
      }
    CHECK(found == 0);
  }
}
