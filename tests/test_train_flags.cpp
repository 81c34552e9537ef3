// The training flags dtlab-cli train and the dtlab window share (cli/train_flags.h): both parsers
// accept and refuse the same inputs, with the same sentence, and the one limit only the lab has
// (the ranks it draws) says so.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/train_flags.h"
#include "engine/core/check.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#if DTLAB_HAVE_GUI
#include "app/options.h"
#endif

using namespace dtlab;

namespace {

using Args = std::vector<std::string>;

const char* const kCliHelp = "; run 'dtlab-cli train --help' for the list of flags";

// dtlab-cli train's sentence for bad input, without the program name and the pointer to --help;
// "" when the run went through (exit 0).
std::string cli_sentence(const Args& args, int* code) {
  Args full{"train"};
  full.insert(full.end(), args.begin(), args.end());
  const test::CliResult r = test::run_cli(full);
  *code = r.code;
  std::string s = r.err;
  if (s.rfind("dtlab-cli: ", 0) == 0) s.erase(0, 11);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (const size_t at = s.find(kCliHelp); at != std::string::npos && at + std::string(kCliHelp).size() == s.size()) s.erase(at);
  return s;
}

#if DTLAB_HAVE_GUI
// The lab's sentence for the same flags (as a lesson's scenario gets it: no program name).
std::string app_sentence(const Args& args, int* code) {
  std::vector<std::string> argv_text{"dtlab"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  app::AppOptions o;
  std::string error;
  *code = app::parse_app_options(static_cast<int>(argv.size()), argv.data(), o, &error);
  return error;
}
#endif

std::string joined(const Args& args) {
  std::string s;
  for (const std::string& a : args) s += (s.empty() ? "" : " ") + a;
  return s;
}

}  // namespace

TEST_SUITE("train flags") {
  TEST_CASE("bad values: dtlab-cli train and the lab refuse them with the same sentence, exit 2") {
    const struct {
      Args args;
      std::string expect;
    } cases[] = {
        {{"--world", "0"}, "--world: 0 is out of range; use 1 to 64"},
        {{"--world", "x"}, "--world: 'x' is not a whole number"},
        {{"--batch", "0"}, "--batch: 0 is out of range; use 1 to 1048576"},
        {{"--batch", "1.5"}, "--batch: '1.5' is not a whole number"},
        {{"--steps", "0"}, "--steps: 0 is out of range"},
        {{"--accum", "0"}, "--accum: 0 is out of range"},
        {{"--lr", "0"}, "--lr: 0 is out of range"},
        {{"--lr", "nan"}, "--lr: 'nan' is not a number"},
        {{"--seed", "-1"}, "--seed: -1 is out of range; use 0 to 4294967295"},
        {{"--seed", "4294967296"}, "--seed: 4294967296 is out of range"},
        {{"--timeout", "0"}, "--timeout: 0 is out of range"},
        {{"--skip-layer", "-2"}, "--skip-layer: -2 is out of range"},
        {{"--skip-every", "0"}, "--skip-every: 0 is out of range"},
        {{"--skip-ranks", "1,64"}, "--skip-ranks: 64 is out of range; use 0 to 63"},
        {{"--node-size", "0"}, "--node-size: 0 is out of range; use 1 to 64"},
        {{"--stages", "0"}, "--stages: 0 is out of range; use 1 to 64"},
        {{"--microbatches", "5000"}, "--microbatches: 5000 is out of range; use 1 to 4096"},
        {{"--chunks", "65"}, "--chunks: 65 is out of range; use 1 to 64"},
        {{"--dp", "0"}, "--dp: 0 is out of range"},
        {{"--bucket-cap-mb", "-1"}, "--bucket-cap-mb: -1 is out of range"},
        {{"--strategy", "ddp", "--bucket-cap-mb", "0.0000001"}, "--bucket-cap-mb is too small: a bucket must hold at least 1 byte"},
        {{"--strategy", "ddp", "--first-bucket-mb", "0"}, "--first-bucket-mb is too small: a bucket must hold at least 1 byte"},
        {{"--strategy", "fsdp", "--bucket-cap-mb", "1"}, "--bucket-cap-mb configures DDP; add --strategy ddp --world N"},
        {{"--strategy", "dp", "--find-unused-parameters"}, "--find-unused-parameters configures DDP; add --strategy ddp"},
        {{"--strategy", "ddp", "--sharding", "full"}, "--sharding configures FSDP; add --strategy fsdp --world N"},
        {{"--strategy", "ddp", "--forward-prefetch"}, "--forward-prefetch configures FSDP; add --strategy fsdp --world N"},
        {{"--strategy", "fsdp", "--node-size", "2"}, "--node-size sets HYBRID_SHARD's shard group; add --sharding hybrid"},
        {{"--strategy", "fsdp", "--wrap", "block"}, "--wrap block is not a wrap policy; use layer (one unit per Linear) or model"},
        {{"--strategy", "fsdp", "--sharding", "half"}, "half"},
        {{"--strategy", "fsdp", "--backward-prefetch", "later"}, "later"},
        {{"--strategy", "ddp", "--stages", "4"}, "--stages configures a pipeline; add --strategy pipeline --stages p"},
        {{"--strategy", "ddp", "--unit-costs"}, "--unit-costs configures a pipeline; add --strategy pipeline --stages p"},
        {{"--strategy", "pipeline", "--schedule", "zigzag"}, "zigzag"},
        {{"--strategy", "pipeline", "--split", "2,x"}, "--split"},
        {{"--strategy", "single", "--world", "4"}, "--strategy single runs one rank, but --world is 4; drop --world, set it to 1, or use --strategy ddp"},
        {{"--strategy", "single", "--fault", "skip:rank=1,collective=1"}, "--fault injects into the ranks' collectives; add --strategy ddp (or fsdp) --world N"},
        {{"--strategy", "ddp", "--fault", "skip:rank=9"}, "fault 'skip:rank=9' is incomplete"},
        {{"--model", "mlp:2"}, "model 'mlp:2' needs at least an input and an output width"},
        {{"--model", "foo"}, "model 'foo' is not a known model"},
        {{"--optimizer", "adam"}, "optimizer 'adam' is not supported; use sgd or adamw"},
        {{"--profile", "mars"}, "hardware profile 'mars' is not known"},
        {{"--algo", "rign"}, "--algo rign is not an algorithm; use auto, ring, tree, naive, dbtree, hierarchical or nvls"},
        {{"--proto", "ll64"}, "--proto ll64 is not a protocol; use auto, simple, ll or ll128"},
        {{"--algo", "nvls", "--profile", "nvlink8"}, "--algo nvls needs a profile whose switch reduces (NVLink SHARP or SHARP), and nvlink8 has none"},
        {{"--device", "tpu"}, "--device tpu is not a device; use cpu or cuda"},
        {{"--amp", "fp8"}, "--amp fp8 is not a dtype; use bf16 or fp16 (fp32: no autocast)"},
        {{"--strategy", "fsdp", "--fsdp-api", "3"}, "--fsdp-api 3 is not an FSDP API; use 1 (FullyShardedDataParallel) or 2 (fully_shard)"},
        {{"--strategy", "ddp", "--fsdp-api", "2"}, "--fsdp-api configures FSDP; add --strategy fsdp --world N"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--reshard-after-forward", "3"},
         "--reshard-after-forward 3 must divide the 4 ranks each parameter is sharded over; use a divisor, true or false"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--reshard-after-forward", "0"}, "--reshard-after-forward 0 is not a choice"},
        {{"--strategy", "fsdp", "--world", "4", "--reshard-after-forward", "false"},
         "--reshard-after-forward is fully_shard's (FSDP2) option; add --fsdp-api 2, or with FSDP1 use --sharding full (reshard) or grad-op (keep)"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--sharding", "grad-op"},
         "--sharding grad-op is FSDP1's SHARD_GRAD_OP; fully_shard (--fsdp-api 2) spells it --reshard-after-forward false"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--sharding", "zero1"}, "--sharding zero1 is FSDP1's"},
        {{"--strategy", "fsdp", "--world", "4", "--prefetch", "2"},
         "--prefetch is fully_shard's explicit prefetch (FSDP2); FSDP1 gathers one unit ahead: add --fsdp-api 2 or drop --prefetch"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--prefetch", "0"}, "--prefetch: 0 is out of range; use 1 to 64"},
        {{"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--backward-prefetch", "post"},
         "--backward-prefetch post is FSDP1's BACKWARD_POST"},
        {{"--backend", "pigeon"}, "--backend pigeon is not a backend"},
        {{"--strategy", "ddp", "--comm-hook", "powersgd:rank=1,start=2,error_feedback=no"},
         "--comm-hook powersgd:rank=1,start=2,error_feedback=no: error_feedback takes true or false"},
        {{"--strategy", "ddp", "--comm-hook", "topk:ratio=0.01,error_feedback=0"}, "e.g. topk:ratio=0.01,error_feedback=false"},
        {{"--strategy", "ddp", "--comm-hook", "fp16:error_feedback=false"}, "--comm-hook fp16:error_feedback=false is not a communication hook"},
        {{"--bogus", "1"}, "--bogus is not a flag"},
        {{"--stpes", "3"}, "--stpes is not a flag (did you mean --steps?)"},  // a swap
        {{"--batchsize", "3"}, "--batchsize is not a flag (did you mean --batch?)"},
        {{"--world-size", "3"}, "--world-size is not a flag (did you mean --world?)"},
    };
    for (const auto& c : cases) {
      CAPTURE(joined(c.args));
      int cli_code = 0;
      const std::string cli = cli_sentence(c.args, &cli_code);
      CHECK(cli_code == 2);
      CHECK(cli.find(c.expect) != std::string::npos);
      CHECK(cli.find('\n') == std::string::npos);
#if DTLAB_HAVE_GUI
      int app_code = 0;
      const std::string lab = app_sentence(c.args, &app_code);
      CHECK(app_code == 2);
      CHECK(lab == cli);
#endif
    }
  }

  TEST_CASE("good values: both take them (dtlab-cli train runs them)") {
    const Args cases[] = {
        {"--strategy", "ddp", "--world", "2", "--bucket-cap-mb", "0.004", "--first-bucket-mb", "0.001", "--sized-first-iteration"},
        {"--strategy", "fsdp", "--world", "4", "--sharding", "hybrid", "--node-size", "2", "--wrap", "model", "--backward-prefetch", "post"},
        {"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--reshard-after-forward", "2", "--forward-prefetch", "--prefetch", "2"},
        {"--strategy", "fsdp", "--world", "4", "--fsdp-api", "2", "--sharding", "hybrid", "--node-size", "2", "--reshard-after-forward", "false"},
        {"--strategy", "pipeline", "--stages", "2", "--microbatches", "4", "--schedule", "zb-h1", "--unit-costs", "--profile", "ideal"},
        {"--strategy", "single", "--world", "1", "--model", "tiny", "--optimizer", "sgd", "--lr", "0.05", "--seed", "4294967295"},
        {"--strategy", "ddp", "--world", "2", "--skip-layer", "2", "--skip-every", "2", "--skip-ranks", "1", "--find-unused-parameters"},
        {"--strategy", "ddp", "--world", "2", "--fault", "delay:rank=1,collective=1,ms=1", "--timeout", "30", "--device", "cpu"},
        {"--strategy", "ddp", "--world", "2", "--comm-hook", "powersgd:rank=1,start=2,error_feedback=false"},
    };
    for (const Args& args : cases) {
      CAPTURE(joined(args));
      Args run = args;
      run.insert(run.end(), {"--steps", "1", "--batch", "8"});
      int cli_code = -1;
      const std::string cli = cli_sentence(run, &cli_code);
      CHECK(cli == "");
      CHECK(cli_code == 0);
#if DTLAB_HAVE_GUI
      int app_code = -1;
      const std::string lab = app_sentence(run, &app_code);
      CHECK(lab == "");
      CHECK(app_code == 0);
#endif
    }
  }

  TEST_CASE("presets name the same models in both") {
    CHECK(cli::model_preset_spec("tiny") == "mlp:2,16,16,3");
    CHECK(cli::model_preset_spec("wide") == "mlp:2,256,256,3");
    CHECK(cli::model_preset_spec("mlp:2,8,3") == "mlp:2,8,3");
    const test::CliResult r = test::run_cli({"train", "--model", "deep", "--steps", "1", "--batch", "8"});
    CHECK(r.code == 0);
    CHECK(r.out.rfind("dtlab train: mlp:2,64,64,64,64,3 ", 0) == 0);
  }

#if DTLAB_HAVE_GUI
  TEST_CASE("the lab's own limit: it draws at most 16 ranks, and says so") {
    int code = 0;
    CHECK(app_sentence({"--world", "17"}, &code) == "--world 17 is more ranks than the lab draws; use 1 to 16 (dtlab-cli train runs up to 64)");
    CHECK(code == 2);
    CHECK(app_sentence({"--strategy", "pipeline", "--stages", "8", "--dp", "4"}, &code) ==
          "--stages x --dp is 32 ranks; the lab runs at most 16");
    CHECK(code == 2);
    // dtlab-cli train takes a world of 17 (one step of a tiny run).
    CHECK(cli_sentence({"--strategy", "ddp", "--world", "17", "--steps", "1", "--batch", "2", "--model", "tiny"}, &code) == "");
    CHECK(code == 0);
  }

  TEST_CASE("both programs print the sentence as one line, ending with where the flags are listed") {
    const test::ShellResult lab = test::shell(std::string(DTLAB_APP_PATH) + " --world 0");
    CHECK(lab.code == 2);
    CHECK(lab.out == "dtlab: --world: 0 is out of range; use 1 to 64; run 'dtlab --help' for the list of flags\n");
    const test::CliResult cli = test::run_cli({"train", "--world", "0"});
    CHECK(cli.code == 2);
    CHECK(cli.err == "dtlab-cli: --world: 0 is out of range; use 1 to 64; run 'dtlab-cli train --help' for the list of flags\n");
  }
#endif
}
