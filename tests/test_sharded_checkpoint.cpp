// Sharded checkpoints (engine/io/sharded_checkpoint.h): every strategy's per-rank files reassemble
// the same parameters as the full checkpoint, load into any world size and strategy, and a broken
// directory is refused with one sentence before a single parameter changes.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/io/sharded_checkpoint.h"
#include "engine/train/train.h"
#include "tests/test_util.h"

using namespace dtlab;

namespace {

TrainConfig fsdp_config(int world, Sharding sh, int64_t steps) {
  TrainConfig c;
  c.strategy = Strategy::Fsdp;
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,32,32,3");  // units of 96, 1056 and 99 elements
  c.batch = 16;
  c.steps = steps;
  c.seed = 3;
  c.timeout_s = 20;
  c.fsdp.sharding = sh;
  if (sh == Sharding::Hybrid) c.fsdp.node_size = 2;
  return c;
}

bool same_params(const Model& a, const Model& b) {
  for (int64_t i = 0; i < a.num_params(); i++)
    if (a.params()[i] != b.params()[i]) return false;
  return true;
}

// Every tensor of a safetensors file, by name, as float32 values (bit patterns compared by ==, and
// no tensor here holds a NaN).
std::map<std::string, std::vector<float>> tensors_of(const std::string& path) {
  const SafetensorsFile f = load_safetensors(path);
  std::map<std::string, std::vector<float>> out;
  for (const SafetensorsEntry& e : f.entries) {
    std::vector<float> v(static_cast<size_t>((e.end - e.begin) / 4));
    std::memcpy(v.data(), f.bytes(e), v.size() * sizeof(float));
    out[e.name] = v;
  }
  return out;
}

// Runs `c` with --save DIR/full.safetensors and --save-sharded DIR/s; returns `c` with those paths.
TrainConfig run_saving_both(TrainConfig c, const test::TempDir& dir) {
  c.save_path = dir.file("full.safetensors");
  c.save_sharded_path = dir.file("s");
  Trainer(c).run();
  return c;
}

// `c` started from the checkpoint directory `dir` and from the full file `file`: both resume at `step`
// and train to the same parameters, bit for bit.
void check_same_start(TrainConfig c, const std::string& dir, const std::string& file, int64_t step) {
  TrainConfig b = c;
  c.init_path = dir;
  b.init_path = file;
  Trainer ta(c), tb(b);
  CHECK(ta.run().start_step == step);
  tb.run();
  CHECK(same_params(ta.result_model(), tb.result_model()));
}

// `c` as a plain float32 run of `strategy` on `world` ranks that saves nothing: what a checkpoint of
// `c` continues in.
TrainConfig plain_run(TrainConfig c, Strategy strategy, int world) {
  c.save_path.clear();
  c.save_sharded_path.clear();
  c.strategy = strategy;
  c.world_size = world;
  c.tp = 1;
  c.sequence_parallel = false;
  c.precision = Precision::FP32;
  return c;
}

// The index's JSON, for reading what a save placed where.
nlohmann::json index_of(const std::string& dir) {
  std::ifstream in(dir + "/index.json");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_SUITE("sharded_checkpoint") {
  TEST_CASE("every strategy's shards reassemble the full checkpoint, bit for bit") {
    for (Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::Hybrid, Sharding::NoShard, Sharding::Zero1}) {
      for (bool wrap_layers : {true, false}) {
        CAPTURE(sharding_name(sh));
        CAPTURE(wrap_layers);
        test::TempDir dir;
        TrainConfig c = fsdp_config(4, sh, 5);
        c.fsdp.wrap_layers = wrap_layers;
        c.save_path = dir.file("full.safetensors");
        c.save_sharded_path = dir.file("sharded");
        Trainer t(c);
        t.run();
        // HYBRID_SHARD's second node holds copies: only the first node's ranks write files.
        const int files = sh == Sharding::Hybrid ? 2 : 4;
        CHECK(std::filesystem::exists(dir.file("sharded/index.json")));
        for (int r = 0; r < 4; r++)
          CHECK(std::filesystem::exists(dir.file("sharded/" + shard_file_name(r, 4))) == (r < files));
        Model full(c.model, nullptr, 0), sharded(c.model, nullptr, 1);
        load_checkpoint(c.save_path, full);
        CheckpointInfo info = load_sharded_checkpoint(c.save_sharded_path, sharded);
        CHECK(info.step == 5);
        CHECK(info.model_spec == "mlp:2,32,32,3");
        CHECK(info.metadata.at("strategy") == sharding_name(sh));
        CHECK(same_params(full, sharded));
        CHECK(same_params(full, t.model()));
      }
    }
  }

  TEST_CASE("replicas write each parameter once, spread as torch's dedup_save_plans spreads them") {
    // Each tensor in order to the replica with the fewest bytes planned so far, the lowest on a tie.
    CHECK(dedup_replicated_params({400, 16, 400, 16}, 2) == std::vector<int>{0, 1, 1, 0});
    CHECK(dedup_replicated_params({8, 8, 8}, 1) == std::vector<int>{0, 0, 0});
    CHECK(dedup_replicated_params({0, 0}, 2) == std::vector<int>{0, 1});  // an empty tensor counts 1, as DCP's
    for (int variant = 0; variant < 3; variant++) {
      CAPTURE(variant);
      test::TempDir dir;
      TrainConfig c = fsdp_config(4, Sharding::NoShard, 5);
      c.strategy = variant == 0 ? Strategy::Single : Strategy::Ddp;
      if (variant == 0) c.world_size = 1;
      if (variant == 2) c.tp = 2;  // two replicas of a TP pair: each piece from one replica
      c = run_saving_both(c, dir);
      Model full(c.model, nullptr, 0), sharded(c.model, nullptr, 1);
      load_checkpoint(c.save_path, full);
      load_sharded_checkpoint(c.save_sharded_path, sharded);
      CHECK(same_params(full, sharded));
      const nlohmann::json idx = index_of(c.save_sharded_path);
      CHECK(idx["strategy"] == strategy_name(c.strategy));
      std::set<std::string> files;
      for (const auto& [name, p] : idx["params"].items())
        for (const auto& piece : p["pieces"]) files.insert(piece["file"].get<std::string>());
      CHECK(files.size() == static_cast<size_t>(c.world_size));  // every rank wrote a share
      if (variant == 1) {  // mlp:2,32,32,3 on 4 replicas: 0.weight, 0.bias, 2.weight, 2.bias, ...
        const std::vector<int> owner = dedup_replicated_params({2 * 32 * 4, 32 * 4, 32 * 32 * 4, 32 * 4, 3 * 32 * 4, 3 * 4}, 4);
        const std::vector<std::string> names = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
        for (size_t k = 0; k < names.size(); k++) {
          CAPTURE(names[k]);
          REQUIRE(idx["params"][names[k]]["pieces"].size() == 1);
          CHECK(idx["params"][names[k]]["pieces"][0]["file"] == shard_file_name(owner[k], 4));
        }
      }
    }
  }

  TEST_CASE("a sharded checkpoint continues training under any world size and strategy") {
    test::TempDir dir;
    const TrainConfig save = run_saving_both(fsdp_config(4, Sharding::FullShard, 4), dir);
    // Continuing from the directory equals continuing from the full file.
    for (int world : {2, 3, 4}) {
      for (Sharding sh : {Sharding::FullShard, Sharding::Zero1, Sharding::NoShard}) {
        CAPTURE(world);
        CAPTURE(sharding_name(sh));
        TrainConfig a = fsdp_config(world, sh, 3), b = a;
        a.init_path = dir.file("s");
        b.init_path = dir.file("full.safetensors");
        Trainer ta(a), tb(b);
        TrainSummary sa = ta.run();
        tb.run();
        CHECK(sa.start_step == 4);
        CHECK(same_params(ta.model(), tb.model()));
      }
    }
    TrainConfig single;
    single.model = save.model;
    single.steps = 1;
    single.init_path = dir.file("s");
    CHECK(Trainer(single).run().start_step == 4);
    CHECK(read_checkpoint_info(dir.file("s")).model_spec == "mlp:2,32,32,3");
  }

  TEST_CASE("a broken sharded checkpoint is refused and the model is left as it was") {
    test::TempDir dir;
    TrainConfig save = fsdp_config(2, Sharding::FullShard, 2);
    save.save_sharded_path = dir.file("s");
    Trainer(save).run();
    Model m(save.model, nullptr, 7), before(save.model, nullptr, 7);

    Model other(ModelSpec::parse("mlp:2,16,3"), nullptr, 0);
    CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), other),
                         doctest::Contains("holds a checkpoint of mlp:2,32,32,3 but the model is mlp:2,16,3"), Error);

    {  // hostile offsets in index.json: near 2^63 (offset + length overflows), and fractional
      const std::string index = dir.file("s/index.json");
      std::ifstream in(index);
      const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t at = good.find("\"offset\":");
      REQUIRE(at != std::string::npos);
      const size_t end = good.find_first_of(",}", at);
      for (const char* offset : {"9223372036854775800", "0.5"}) {
        CAPTURE(offset);
        std::ofstream(index) << good.substr(0, at) << "\"offset\":" << offset << good.substr(end);
        CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("the checkpoint is corrupt"), Error);
        CHECK(same_params(m, before));
      }
      // A piece of the wrong JSON kind: the same sentence, not an internal error.
      const size_t pieces = good.find("\"pieces\":");
      REQUIRE(pieces != std::string::npos);
      const size_t open = good.find('[', pieces);
      std::ofstream(index) << good.substr(0, open + 1) << "7," << good.substr(open + 1);
      CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("the checkpoint is corrupt"), Error);
      CHECK(same_params(m, before));
      // Shapes are checked against the model (0.weight is (32, 2)): transposed, made up, malformed.
      const size_t at_shape = good.find("\"shape\":", good.find("\"0.weight\""));
      REQUIRE(at_shape != std::string::npos);
      const std::string shape = good.substr(at_shape, good.find(']', at_shape) + 1 - at_shape);
      for (const char* bad : {"[2,32]", "[32,2,1]", "[]", "[-32,2]", "[32.5,2]", "\"32,2\"", "null", "[1099511627776,1099511627776]"}) {
        CAPTURE(bad);
        std::ofstream(index) << good.substr(0, at_shape) << "\"shape\": " << bad << good.substr(at_shape + shape.size());
        CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("the checkpoint is corrupt"), Error);
        CHECK(same_params(m, before));
      }
      // A parameter the model does not have: another model's checkpoint.
      const size_t params = good.find("\"params\": {");
      REQUIRE(params != std::string::npos);
      std::ofstream(index) << good.substr(0, params + 11) << "\"6.weight\": {\"shape\": [3, 3], \"pieces\": []}," << good.substr(params + 11);
      CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("lists parameter '6.weight', which mlp:2,32,32,3 does not have"), Error);
      // A piece file name with a NUL (the open would cut it there) or a path separator.
      const std::string file = "\"file\": \"rank-00000-of-00002.safetensors\"";
      const size_t at_file = good.find(file);
      REQUIRE(at_file != std::string::npos);
      for (const char* name : {"rank-00000-of-00002.safetensors\\u0000x", "../s/rank-00000-of-00002.safetensors"}) {
        CAPTURE(name);
        std::ofstream(index) << good.substr(0, at_file) << "\"file\": \"" << name << "\"" << good.substr(at_file + file.size());
        CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("is not a plain file name"), Error);
        CHECK(same_params(m, before));
      }
      // A "format" of another JSON kind (found by fuzz/sharded.cpp): both readers give the
      // not-an-index sentence, not a JSON type error.
      std::ofstream(index) << "{\"format\": 3, \"params\": {}}";
      CHECK_THROWS_WITH_AS(read_sharded_checkpoint_info(dir.file("s")), doctest::Contains("is not a dtlab sharded checkpoint index"), Error);
      CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("is not a dtlab sharded checkpoint index"), Error);
      CHECK(same_params(m, before));
      std::ofstream(index) << good;
    }
    std::filesystem::remove(dir.file("s/" + shard_file_name(1, 2)));
    CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains("rank-00001-of-00002.safetensors"), Error);
    CHECK(same_params(m, before));

    std::filesystem::remove(dir.file("s/index.json"));
    CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m),
                         doctest::Contains("has no index.json, so it is not a complete sharded checkpoint"), Error);
    CHECK(same_params(m, before));

    TrainConfig bad = save;
    bad.strategy = Strategy::Dp;
    bad.fsdp = {};
    CHECK_THROWS_WITH_AS(Trainer{bad}, doctest::Contains("--save-sharded with --strategy dp: torch.nn.DataParallel keeps its one module"),
                         Error);
    std::ofstream(dir.file("afile")) << "x";
    TrainConfig file = save;
    file.save_sharded_path = dir.file("afile");
    CHECK_THROWS_WITH_AS(Trainer{file}, doctest::Contains("is a file; give a directory"), Error);
  }

  TEST_CASE("--tp runs start from a sharded checkpoint exactly as from the full file") {
    test::TempDir dir;
    run_saving_both(fsdp_config(4, Sharding::FullShard, 3), dir);
    // The directory is read whole and cut into TP pieces as the full file is (train_mesh.cpp).
    for (Strategy st : {Strategy::Ddp, Strategy::Fsdp}) {
      CAPTURE(strategy_name(st));
      TrainConfig a = fsdp_config(4, Sharding::FullShard, 2);
      a.strategy = st;
      a.tp = 2;
      check_same_start(a, dir.file("s"), dir.file("full.safetensors"), 3);
    }
  }

  TEST_CASE("fsdp --tp writes pieces placed in the full tensors, and every reader rebuilds the full model") {
    // world 4: FSDP over 2 replicas of 2 TP ranks each; world 2: one replica, each rank its TP piece.
    for (int world : {4, 2}) {
      CAPTURE(world);
      test::TempDir dir;
      TrainConfig c = fsdp_config(world, Sharding::FullShard, 3);
      c.tp = 2;
      c = run_saving_both(c, dir);
      // DCP's chunks for Shard placements: 0.weight (32, 2) column-parallel is a block of rows, 2.weight
      // (32, 32) row-parallel a block of columns; 2.bias, whole on both TP ranks, is held once, unboxed.
      const nlohmann::json idx = index_of(dir.file("s"));
      CHECK(idx["version"] == 2);
      const auto boxes_of = [&](const char* param) {
        std::set<std::string> boxes;
        for (const auto& piece : idx["params"][param]["pieces"]) boxes.insert(piece["box"].dump());
        return boxes;
      };
      CHECK(boxes_of("0.weight") == std::set<std::string>{R"({"offsets":[0,0],"sizes":[16,2]})", R"({"offsets":[16,0],"sizes":[16,2]})"});
      CHECK(boxes_of("2.weight") == std::set<std::string>{R"({"offsets":[0,0],"sizes":[32,16]})", R"({"offsets":[0,16],"sizes":[32,16]})"});
      int64_t bias = 0;
      for (const auto& piece : idx["params"]["2.bias"]["pieces"]) {
        CHECK_FALSE(piece.contains("box"));
        bias += piece["length"].get<int64_t>();
      }
      CHECK(bias == 32);
      // Consolidated, it is the run's full --save, bit for bit.
      consolidate_sharded_checkpoint(dir.file("s"), dir.file("consolidated.safetensors"));
      CHECK(tensors_of(dir.file("consolidated.safetensors")) == tensors_of(c.save_path));
      CHECK(read_checkpoint_info(dir.file("consolidated.safetensors")).step == 3);
      Model full(c.model, nullptr, 0), sharded(c.model, nullptr, 1);
      load_checkpoint(c.save_path, full);
      load_sharded_checkpoint(c.save_sharded_path, sharded);
      CHECK(same_params(full, sharded));
      // --init of the directory without --tp (and with it) continues as --init of the full file.
      for (int tp : {1, 2}) {
        CAPTURE(tp);
        TrainConfig a = fsdp_config(2, Sharding::FullShard, 2);
        a.tp = tp;
        check_same_start(a, dir.file("s"), c.save_path, 3);
      }
    }
  }

  TEST_CASE("a GPT's TP shards save c_attn as three boxes (its heads' q, k and v rows), and every reader rebuilds the model") {
    test::TempDir dir;
    TrainConfig c = fsdp_config(4, Sharding::FullShard, 2);
    c.model = ModelSpec::parse("gpt:layers=1,heads=2,embd=16,ctx=8");
    c.data = "text";
    c.batch = 4;
    c.tp = 2;
    c.sequence_parallel = true;
    c = run_saving_both(c, dir);
    const nlohmann::json idx = index_of(dir.file("s"));
    std::set<std::string> boxes;
    for (const auto& piece : idx["params"]["transformer.h.0.attn.c_attn.weight"]["pieces"]) boxes.insert(piece["box"].dump());
    // TP rank 0 holds head 0: rows 0-7 of q (rows 0-7), of k (16-23) and of v (32-39); rank 1 head 1.
    CHECK(boxes == std::set<std::string>{R"({"offsets":[0,0],"sizes":[8,16]})", R"({"offsets":[8,0],"sizes":[8,16]})",
                                         R"({"offsets":[16,0],"sizes":[8,16]})", R"({"offsets":[24,0],"sizes":[8,16]})",
                                         R"({"offsets":[32,0],"sizes":[8,16]})", R"({"offsets":[40,0],"sizes":[8,16]})"});
    consolidate_sharded_checkpoint(dir.file("s"), dir.file("consolidated.safetensors"));
    CHECK(tensors_of(dir.file("consolidated.safetensors")) == tensors_of(c.save_path));
    check_same_start(plain_run(c, Strategy::Single, 1), dir.file("s"), c.save_path, 2);
  }

  TEST_CASE("a pipeline's ranks each write their stages' parameters, and the pieces are its --save file") {
    // The MLP and the GPT, over 2 stages; with 2 replicas (each parameter from one, as DCP's
    // dedup_save_plans spreads them), TP shards (boxes), 16 bits (written widened, as --save),
    // LoRA's adapters, and one rank holding both ends (interleaved): a GPT's last stage leaves its copy
    // of the tied weight to the first stage's transformer.wte.weight.
    struct Case {
      const char* model;
      int dp, tp, chunks;
      Precision precision;
      int lora;
    };
    const char* gpt = "gpt:layers=2,heads=2,embd=16,ctx=8";
    std::vector<Case> cases = {{"mlp:2,32,32,32,3", 2, 2, 1, Precision::BF16, 0}, {gpt, 1, 1, 2, Precision::FP16, 0},
                               {gpt, 2, 1, 1, Precision::FP32, 4}};
    if (!test::quick())  // (the sanitizer runs take the three above: every path, a third of the time)
      cases.insert(cases.begin(), {{"mlp:2,32,32,32,3", 1, 1, 1, Precision::FP32, 0}, {gpt, 2, 2, 1, Precision::FP32, 0}});
    for (const Case& k : cases) {
      CAPTURE(k.model);
      CAPTURE(k.dp);
      CAPTURE(k.tp);
      CAPTURE(k.chunks);
      CAPTURE(k.lora);
      test::TempDir dir;
      TrainConfig c = fsdp_config(1, Sharding::FullShard, 2);
      c.strategy = Strategy::Pipeline;
      c.model = ModelSpec::parse(k.model);
      if (c.model.is_gpt()) c.data = "text", c.batch = 4, c.eval_samples = 256;
      c.pipeline.stages = k.chunks > 1 ? 1 : 2;
      c.pipeline.chunks = k.chunks;
      c.pipeline.schedule = k.chunks > 1 ? ScheduleKind::Interleaved1F1B : ScheduleKind::OneFOneB;
      c.pipeline.microbatches = 2;
      c.pipeline.dp = k.dp;
      c.tp = k.tp;
      c.world_size = c.pipeline.stages * k.dp * k.tp;
      c.precision = k.precision;
      c.lora.rank = k.lora;
      c = run_saving_both(c, dir);
      const nlohmann::json idx = index_of(dir.file("s"));
      CHECK(idx["strategy"] == "pipeline");
      CHECK_FALSE(idx["params"].contains("lm_head.weight"));
      std::set<std::string> files;
      for (const auto& [name, p] : idx["params"].items())
        for (const auto& piece : p["pieces"]) files.insert(piece["file"].get<std::string>());
      CHECK(files.size() == static_cast<size_t>(c.world_size));  // every rank wrote a share
      std::map<std::string, std::vector<float>> pieces;
      for (FullTensor& t : read_sharded_tensors(dir.file("s"))) pieces[t.name] = t.values;
      CHECK(pieces == tensors_of(c.save_path));
      if (k.lora > 0) continue;  // (an adapter directory is no base model to start from)
      check_same_start(plain_run(c, Strategy::Ddp, 2), dir.file("s"), c.save_path, 2);
    }
  }

  TEST_CASE("an fsdp LoRA run's sharded adapters are its --save adapter file, in pieces") {
    for (int tp : {1, 2}) {
      CAPTURE(tp);
      test::TempDir dir;
      TrainConfig c = fsdp_config(4, Sharding::FullShard, 3);
      c.tp = tp;
      c.lora.rank = 4;
      c = run_saving_both(c, dir);
      // peft's names and metadata, as the full adapter file has them.
      const std::map<std::string, std::vector<float>> full = tensors_of(c.save_path);
      CHECK(full.contains("base_model.model.0.lora_A.weight"));
      CHECK(index_of(dir.file("s"))["params"].contains("base_model.model.0.lora_A.weight"));
      const CheckpointInfo sharded = read_checkpoint_info(dir.file("s")), whole = read_checkpoint_info(c.save_path);
      CHECK(sharded.metadata.at("lora_rank") == whole.metadata.at("lora_rank"));
      CHECK(sharded.metadata.at("lora_alpha") == whole.metadata.at("lora_alpha"));
      std::map<std::string, std::vector<float>> pieces;
      for (FullTensor& t : read_sharded_tensors(dir.file("s"))) pieces[t.name] = t.values;
      CHECK(pieces == full);
      consolidate_sharded_checkpoint(dir.file("s"), dir.file("consolidated.safetensors"));
      CHECK(tensors_of(dir.file("consolidated.safetensors")) == full);
      CHECK(read_checkpoint_info(dir.file("consolidated.safetensors")).metadata.at("lora_rank") == "4");
      // Like the adapter file, the directory is no base model: --init of a plain run refuses it.
      Model plain(c.model, nullptr, 0);
      CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), plain), doctest::Contains("does not have"), Error);
    }
  }

  TEST_CASE("sharded index versions and boxes: a newer or broken one is refused") {
    test::TempDir dir;
    TrainConfig save = fsdp_config(4, Sharding::FullShard, 1);
    save.tp = 2;
    save.save_sharded_path = dir.file("s");
    Trainer(save).run();
    Model m(save.model, nullptr, 7), before(save.model, nullptr, 7);
    const std::string index = dir.file("s/index.json");
    const nlohmann::json good = index_of(dir.file("s"));
    auto refused = [&](const nlohmann::json& j, const char* why) {
      std::ofstream(index) << j.dump(1);
      CHECK_THROWS_WITH_AS(load_sharded_checkpoint(dir.file("s"), m), doctest::Contains(why), Error);
      CHECK_THROWS_WITH_AS(read_sharded_tensors(dir.file("s")), doctest::Contains(why), Error);
      CHECK(same_params(m, before));
    };
    for (const nlohmann::json& v : {nlohmann::json(3), nlohmann::json(0), nlohmann::json("2"), nlohmann::json(1.5)}) {
      CAPTURE(v.dump());
      nlohmann::json j = good;
      j["version"] = v;
      refused(j, "which this dtlab does not read");
    }
    nlohmann::json j = good;
    j.erase("version");  // a version 1 index has no boxes
    refused(j, "the checkpoint is corrupt");
    const std::vector<nlohmann::json> bad_boxes = {
        {{"offsets", {16, 0}}, {"sizes", {17, 2}}},          // past the last row
        {{"offsets", {0}}, {"sizes", {16}}},                 // one dimension of two
        {{"offsets", {-1, 0}}, {"sizes", {16, 2}}},          // negative
        {{"offsets", {0, 0}}, {"sizes", {16.5, 2}}},         // a fraction
        {{"offsets", {9223372036854775800LL, 0}}, {"sizes", {16, 2}}},  // offset + size overflows
        nlohmann::json(7)};
    for (const nlohmann::json& box : bad_boxes) {
      CAPTURE(box.dump());
      j = good;
      j["params"]["0.weight"]["pieces"][0]["box"] = box;
      refused(j, "the checkpoint is corrupt");
    }
    // Every piece in TP rank 0's rows: those rows twice, the others never.
    j = good;
    for (auto& piece : j["params"]["0.weight"]["pieces"]) piece["box"] = {{"offsets", {0, 0}}, {"sizes", {16, 2}}};
    refused(j, "is in two pieces");
    std::ofstream(index) << good.dump(1);
    CHECK_NOTHROW(load_sharded_checkpoint(dir.file("s"), m));
  }
}
