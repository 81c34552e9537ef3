// Bad input found by a review of dtlab-cli that tried what a newcomer would (session 29): each gets
// one sentence that names the fix, exit 2, before any training, where before it crashed, stopped on
// an internal check, trained silently wrong, ground the machine for minutes, or gave advice that does
// not work. And a mixture of experts' checkpoint carries its --moe, as its model carries --model.
#include <doctest/doctest.h>

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "tests/test_util.h"

using namespace dtlab;

namespace {

const std::vector<std::string> kGpt = {"--model", "gpt:layers=2,heads=2,embd=16,ctx=8", "--data", "text", "--steps", "2"};

std::vector<std::string> train_args(std::vector<std::string> more) {
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), kGpt.begin(), kGpt.end());
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The sentence of a refused command line (and that it is one sentence, exit 2, nothing on stdout).
std::string refusal(const std::vector<std::string>& args) {
  const test::CliResult r = test::run_cli(args);
  INFO("stdout: ", r.out);
  INFO("stderr: ", r.err);
  CHECK(test::one_sentence_usage_error(r));
  return r.err;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("--uneven-rank with one data-parallel replica (a TP or CP group filling the world) is refused before it trains") {
    // It segfaulted under --join with --tp, stopped on internal checks with --cp, and without --join
    // printed one step of two and said it had trained two.
    CHECK(refusal(train_args({"--strategy", "ddp", "--world", "2", "--tp", "2", "--uneven-rank", "1", "--join"})) ==
          "dtlab-cli: --uneven-rank needs at least 2 data-parallel replicas, but --world 2 is one replica of tp 2; raise --world to 4\n");
    CHECK(refusal(train_args({"--strategy", "ddp", "--world", "2", "--cp", "2", "--uneven-rank", "1"})) ==
          "dtlab-cli: --uneven-rank needs at least 2 data-parallel replicas, but --world 2 is one replica of cp 2; raise --world to 4\n");
    CHECK(refusal(train_args({"--strategy", "ddp", "--world", "4", "--cp", "2", "--tp", "2", "--uneven-rank", "0", "--join"})) ==
          "dtlab-cli: --uneven-rank needs at least 2 data-parallel replicas, but --world 4 is one replica of tp 2 x cp 2; raise --world to 8\n");
  }

  TEST_CASE("a model the machine cannot hold is refused at once, naming the bytes, not allocated for minutes") {
    // 3.28e9 parameters x 16 bytes (float32 parameters, gradients, AdamW's m and v) x 16 DDP replicas.
    const double params = 3280000160.0, need = params * 16 * 16;
    const double machine = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    if (!(machine > 0 && machine < need)) {
      MESSAGE("skipped: this machine has ", machine, " bytes, enough for the model");
      return;
    }
    const std::string err = refusal({"train", "--model", "gpt:layers=1000000,heads=2,embd=16,ctx=8", "--data", "text", "--strategy", "ddp",
                                     "--world", "16", "--steps", "2"});
    CHECK(err.find("has 3,280,000,160 parameters; training 16 replicas of it holds at least ") != std::string::npos);
    CHECK(err.find("(16 bytes a parameter: float32 parameters and gradients and AdamW's two moments), but this machine has ") !=
          std::string::npos);
    CHECK(err.find("; use a smaller model or fewer replicas\n") != std::string::npos);
  }

  TEST_CASE("advice that works: the world to raise, the experts a GPT holds, the heads of a TP rank") {
    CHECK(refusal(train_args({"--strategy", "ddp", "--world", "2", "--cp", "2", "--tp", "2"})) ==
          "dtlab-cli: --cp 2 needs --cp x --tp = 4 ranks, but --world is 2; raise --world to 4 (or a multiple of it)\n");
    CHECK(refusal({"train", "--model", "mlp:2,8,3", "--steps", "2", "--strategy", "ddp", "--world", "2", "--ep", "2"}) ==
          "dtlab-cli: --ep 2 splits the MoE blocks' experts over ranks; add --moe experts=E,top_k=K and a GPT to hold them (--model gpt-tiny)\n");
    // Before the strategy table's sentence for --ep (which would then ask for --moe).
    CHECK(refusal(train_args({"--ep", "2"})) == "dtlab-cli: --ep 2 splits the MoE blocks' experts over ranks; add --moe experts=E,top_k=K\n");
    CHECK(refusal(train_args({"--strategy", "pipeline", "--stages", "2", "--moe", "experts=4,top_k=1", "--ep", "2"})) ==
          "dtlab-cli: --ep 2 groups 2 ranks of one stage, but a stage has 1 (--dp); raise --dp so that a stage's ranks are a multiple of "
          "--ep\n");
    const std::vector<std::string> plan = {"plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--global-batch", "64", "--seq", "4096"};
    std::vector<std::string> ulysses = plan;
    ulysses.insert(ulysses.end(), {"--heads", "4", "--world", "16", "--cp", "4", "--tp", "2", "--cp-layout", "ulysses"});
    CHECK(refusal(ulysses).find("but the 2 heads of a TP rank (4 over tp 2) do not divide by 4; pick a --cp that divides 2 or use --cp-layout "
                                "ring\n") != std::string::npos);
    std::vector<std::string> world = plan;
    world.insert(world.end(), {"--heads", "32", "--world", "8", "--tp", "8", "--cp", "8", "--pp", "8"});
    CHECK(refusal(world) == "dtlab-cli: --world 8 is not a multiple of tp x cp x pp = 512; make --world a multiple of 512 (or smaller "
                            "degrees), or give --dp D instead of --world\n");
  }

  TEST_CASE("a flag given twice or without its value, and an empty --moe, in words") {
    CHECK(refusal(train_args({"--cp", "2", "--cp", "4"})) ==
          "dtlab-cli: --cp is given 2 times; give it once; run 'dtlab-cli train --help' for the list of flags\n");
    CHECK(refusal(train_args({"--cp"})) == "dtlab-cli: --cp needs a value after it; run 'dtlab-cli train --help' for the list of flags\n");
    CHECK(refusal(train_args({"--moe", ""})) ==
          "dtlab-cli: --moe was given no experts; write it as --moe experts=E,top_k=K (e.g. experts=4,top_k=2)\n");
  }

  TEST_CASE("--data text:PATH reads a text file whatever its name, and a missing .npz names the built-in data of both models") {
    test::TempDir dir;
    const std::string text = dir.file("sonnet.npz");
    std::ofstream(text) << "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.\n";
    const test::CliResult r = test::run_cli({"train", "--model", "gpt:layers=1,heads=2,embd=16,ctx=8", "--data", "text:" + text, "--steps", "1"});
    INFO("stderr: ", r.err);
    CHECK(r.code == 0);
    CHECK(refusal({"train", "--model", "gpt-tiny", "--steps", "1", "--data", dir.file("none.npz")})
              .find("does not exist; check the path, or use the built-in data (--data text for a GPT, spiral or blobs for an MLP)\n") !=
          std::string::npos);
  }

  TEST_CASE("a mixture of experts' checkpoint carries its --moe: --init takes it, and a model without it, or other experts, are told which") {
    test::TempDir dir;
    const std::string moe = dir.file("moe.safetensors"), dense = dir.file("dense.safetensors"), sharded = dir.file("moe_sharded");
    // A short text, so that eval's and the runs' final evaluations take no time.
    const std::string text = dir.file("verse.txt");
    {
      std::ofstream out(text);
      for (int i = 0; i < 8; i++) out << "Rough winds do shake the darling buds of May, and summer's lease hath all too short a date.\n";
    }
    const std::string data = "text:" + text;
    const auto run = [&](std::vector<std::string> more) {
      std::vector<std::string> args = {"train", "--model", "gpt:layers=2,heads=2,embd=16,ctx=8", "--data", data, "--steps", "2"};
      args.insert(args.end(), more.begin(), more.end());
      return test::run_cli(args);
    };
    const test::CliResult saved = run({"--moe", "experts=4,top_k=1", "--save", moe});
    REQUIRE(saved.code == 0);
    REQUIRE(run({"--save", dense}).code == 0);
    REQUIRE(run({"--moe", "experts=4,top_k=1", "--strategy", "fsdp", "--world", "2", "--save-sharded", sharded}).code == 0);
    const std::string count = saved.out.substr(saved.out.find(" ("), saved.out.find(" parameters)") - saved.out.find(" ("));  // " (N"
    // --init without --model: the checkpoint's model, its experts too (a file and a sharded directory).
    for (const std::string& from : {moe, sharded}) {
      const test::CliResult r = test::run_cli({"train", "--data", data, "--steps", "1", "--init", from});
      INFO("stderr: ", r.err);
      CHECK(r.code == 0);
      CHECK(r.out.find(count + " parameters)") != std::string::npos);  // 4 experts a block, as saved
    }
    // --model without --moe, the reverse, and other experts: the --moe that loads it.
    const auto refused = [&](std::vector<std::string> more) {
      const test::CliResult r = run(more);
      INFO("stderr: ", r.err);
      CHECK(test::one_sentence_usage_error(r));
      return r.err;
    };
    CHECK(refused({"--init", moe}) == "dtlab-cli: " + moe + ": holds a mixture of experts (--moe experts=4,top_k=1,aux=0.01) but the model has "
                                      "none; add --moe experts=4,top_k=1,aux=0.01 to load it\n");
    CHECK(refused({"--init", sharded}).find("holds a mixture of experts (--moe experts=4,top_k=1,aux=0.01) but the model has none") !=
          std::string::npos);
    CHECK(refused({"--moe", "experts=2,top_k=1", "--init", dense}) ==
          "dtlab-cli: " + dense + ": holds a model without experts, but --moe experts=2,top_k=1,aux=0.01 asks for them; drop --moe to load it\n");
    CHECK(refused({"--moe", "experts=2,top_k=1", "--init", moe}) ==
          "dtlab-cli: " + moe + ": holds 4 experts a block (--moe experts=4,top_k=1,aux=0.01), but --moe experts=2,top_k=1,aux=0.01 asks for 2; "
                                "use --moe experts=4,top_k=1,aux=0.01 to load it\n");
    // eval and generate read the experts from the checkpoint.
    const test::CliResult e = test::run_cli({"eval", "--init", moe, "--data", data});
    INFO("eval stderr: ", e.err);
    CHECK(e.code == 0);
    const test::CliResult g = test::run_cli({"generate", "--init", moe, "--tokens", "8"});
    INFO("stderr: ", g.err);
    CHECK(g.code == 0);
  }
}
