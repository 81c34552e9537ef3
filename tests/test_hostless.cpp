// The GPU paths without a GPU (tests/hostless.h): every strategy and technique trains on ranks whose
// memory the host cannot read, and ends bit for bit where the CPU ends. A host loop over device
// memory faults here as it would on a GPU, and a forgotten upload or download shows as a difference.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/train/settings.h"
#include "engine/train/train.h"
#include "tests/hostless.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// `base` with the flags of `args` set as dtlab-cli train sets them ("--strategy ddp --world 2").
TrainConfig with_flags(TrainConfig c, const std::string& args) {
  std::istringstream in(args);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  for (size_t i = 0; i < words.size(); i++) {
    const Setting* s = find_setting(words[i]);
    REQUIRE_MESSAGE(s != nullptr, words[i]);
    SettingValue v;
    if (s->type != SettingType::Flag) v.push_back(words.at(++i));
    else v.push_back("true");
    s->set(c, v);
  }
  return c;
}

// A small GPT on the shipped text, SGD with momentum, 2 steps of batch 4.
TrainConfig gpt_base() {
  TrainConfig c = test::demo_config("single", 1, 4, 2);
  c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=8");
  c.data = "text";
  c.eval_samples = 64;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  return c;
}

std::vector<float> trained(const TrainConfig& c, const char* device) {
  Trainer t(c);
  t.run();
  CHECK(t.device(c.world_size - 1).name() == device);
  return t.result_model().host_params();
}

void same_on_both(const TrainConfig& c, const std::string& what) {
  CAPTURE(what);
  if (!test::kHostlessFaults) return;
  const std::vector<float> cpu = trained(c, "cpu");
  std::vector<float> dev;
  {
    test::HostlessWorlds hostless;
    dev = trained(c, "hostless");
  }
  REQUIRE(dev.size() == cpu.size());
  size_t differ = 0;
  for (size_t i = 0; i < cpu.size(); i++) differ += !(dev[i] == cpu[i]);
  CHECK(differ == 0);
}

}  // namespace

TEST_SUITE("hostless") {
  TEST_CASE("hostless: the GPT's strategies and mesh dimensions on ranks the host cannot read end where the CPU ends") {
    if (!test::kHostlessFaults) {
      MESSAGE("skipped: a tagged address does not fault on this machine (tests/hostless.h needs x86-64)");
      return;
    }
    const TrainConfig g = gpt_base();
    std::vector<std::string> runs = {
        "--strategy ddp --world 2",
        "--strategy ddp --world 2 --cp 2",
        "--strategy ddp --world 2 --cp 2 --cp-layout zigzag",
        "--strategy ddp --world 2 --cp 2 --cp-layout ulysses",
        "--strategy ddp --world 2 --moe experts=4,top_k=2 --ep 2",
        "--strategy ddp --world 2 --tp 2 --sequence-parallel",
        "--strategy fsdp --world 2",
        "--strategy pipeline --world 2 --stages 2 --microbatches 2 --schedule 1f1b",
    };
    if (!test::quick())
      runs.insert(runs.end(), {
                                  "--strategy ddp --world 2 --moe experts=4,top_k=2",
                                  "--strategy ddp --world 4 --cp 2 --tp 2 --sequence-parallel --cp-layout zigzag",
                                  "--strategy ddp --world 2 --tp 2",
                                  "--strategy ddp --world 2 --amp bf16 --cp 2",
                                  "--strategy ddp --world 2 --amp bf16 --moe experts=4,top_k=2 --ep 2",
                                  "--strategy ddp --world 2 --precision bf16 --cp 2",
                                  "--strategy fsdp --world 2 --moe experts=4,top_k=2 --ep 2 --sharding grad-op",
                                  "--strategy ddp --world 2 --lora-rank 2 --activation-checkpointing",
                                  "--strategy pipeline --world 2 --stages 2 --microbatches 2 --schedule zb-h1",
                                  "--strategy pipeline --world 8 --stages 2 --dp 2 --tp 2 --microbatches 2 --schedule 1f1b",
                                  "--strategy pipeline --world 4 --stages 2 --cp 2 --microbatches 2",
                                  "--strategy pipeline --world 2 --stages 2 --chunks 2 --microbatches 2 --schedule interleaved --model gpt:layers=4,heads=4,embd=16,ctx=8",
                                  "--strategy fsdp --world 4 --sharding hybrid --node-size 2 --tp 2 --sequence-parallel",
                                  "--strategy fsdp --world 4 --sharding zero1 --moe experts=4,top_k=2 --ep 2",
                                  "--strategy fsdp --world 2 --fsdp-api 2 --precision bf16",
                                  "--strategy ddp --world 2 --precision fp16 --inject-overflow 1",
                                  "--strategy ddp --world 2 --clip-grad-norm 0.5 --accum 2",
                                  "--strategy ddp --world 2 --uneven-rank 1 --join --cp 2 --world 4",
                                  // The experts' combine and router over 16-bit scratch (the Host view uploads before it narrows).
                                  "--strategy ddp --world 2 --moe experts=4,top_k=2 --ep 2 --precision bf16",
                                  "--strategy ddp --world 2 --moe experts=4,top_k=2,capacity=1.0 --precision fp16",
                                  "--strategy ddp --world 4 --moe experts=4,top_k=2 --tp 2 --sequence-parallel --cp 2",
                                  "--strategy ddp --world 2 --moe experts=4,top_k=2 --ep 2 --activation-checkpointing",
                                  "--strategy ddp --world 2 --moe experts=4,top_k=2 --cp 2 --lora-rank 2",
                                  "--strategy pipeline --world 4 --stages 2 --dp 2 --microbatches 2 --moe experts=4,top_k=2 --ep 2",
                                  "--strategy ddp --world 2 --cp 2 --cp-layout ulysses --amp fp16",
                                  "--strategy ddp --world 2 --cp 2 --cp-layout zigzag --precision bf16 --activation-checkpointing",
                              });
    for (const std::string& r : runs) same_on_both(with_flags(g, r), r);
  }

  TEST_CASE("hostless: the MLP's strategies, precisions and hooks on ranks the host cannot read end where the CPU ends") {
    const TrainConfig m = test::demo_config("single", 1, 16, 3);
    std::vector<std::string> runs = {
        "--strategy ddp --world 2",
        "--strategy dp --world 2",
        "--strategy fsdp --world 4 --sharding hybrid --node-size 2",
        "--strategy ddp --world 2 --precision fp16",
    };
    if (!test::quick())
      runs.insert(runs.end(), {
                                  "--strategy fsdp --world 2 --sharding no-shard",
                                  "--strategy fsdp --world 2 --sharding zero1 --precision bf16",
                                  "--strategy fsdp --world 2 --fsdp-api 2",
                                  "--strategy ddp --world 2 --comm-hook powersgd:rank=1,start=2",
                                  "--strategy ddp --world 2 --clip-grad-norm 0.5",
                                  "--strategy pipeline --world 2 --stages 2 --microbatches 2 --schedule gpipe",
                                  "--strategy ddp --world 2 --tp 2 --precision bf16",
                                  "--strategy pipeline --world 4 --stages 2 --tp 2 --microbatches 2 --schedule 1f1b",
                                  "--strategy ddp --world 2 --find-unused-parameters --skip-layer 2",
                                  "--strategy ddp --world 2 --comm-hook bf16 --gradient-as-bucket-view",
                                  "--strategy fsdp --world 2 --clip-grad-norm 0.1 --precision fp16",
                                  "--strategy ddp --world 2 --lora-rank 2 --activation-checkpointing",
                              });
    for (const std::string& r : runs) same_on_both(with_flags(m, r), r);
  }
}

namespace {

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file of a run's --save and --save-sharded output, by name.
std::map<std::string, std::string> saved(TrainConfig c, const std::filesystem::path& dir) {
  c.save_path = (dir / "model.safetensors").string();
  if (c.strategy == Strategy::Fsdp) c.save_sharded_path = (dir / "sharded").string();
  Trainer t(c);
  t.run();
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) files[std::filesystem::relative(e.path(), dir).string()] = file_bytes(e.path());
  return files;
}

}  // namespace

TEST_SUITE("hostless") {
  TEST_CASE("hostless: checkpoints saved from ranks the host cannot read, whole and sharded, are the CPU's bytes, and load back") {
    if (!test::kHostlessFaults) return;
    for (const std::string& r : {std::string("--strategy fsdp --world 2"), std::string("--strategy fsdp --world 2 --precision bf16"),
                                 std::string("--strategy ddp --world 2 --tp 2 --sequence-parallel")}) {
      CAPTURE(r);
      const TrainConfig c = with_flags(gpt_base(), r);
      test::TempDir a, b;
      const std::map<std::string, std::string> cpu = saved(c, a.path);
      std::map<std::string, std::string> dev;
      {
        test::HostlessWorlds hostless;
        dev = saved(c, b.path);
      }
      CHECK(!cpu.empty());
      CHECK(dev.size() == cpu.size());
      for (const auto& file : cpu) {
        CAPTURE(file.first);
        REQUIRE(dev.count(file.first) == 1);
        CHECK(dev.at(file.first) == file.second);
      }
      // A run that starts from the saved model (--init: read into each rank's device memory; a sharded
      // checkpoint's directory under fsdp) ends where the CPU's does.
      TrainConfig from = c;
      from.init_path = (a.path / (c.strategy == Strategy::Fsdp ? "sharded" : "model.safetensors")).string();
      same_on_both(from, r + " --init");
    }
  }
}
