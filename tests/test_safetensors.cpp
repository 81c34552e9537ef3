// safetensors reading/writing (engine/io/safetensors.h) and model checkpoints (engine/io/checkpoint.h):
// round trips, the exact bytes on disk, one test per corruption the loader must name, atomic saves.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "tests/test_util.h"
#include "engine/core/check.h"
#include "engine/core/model.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"

namespace fs = std::filesystem;
using namespace dtlab;

namespace {

using dtlab::test::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return s;
}

// A hand-made file: length prefix, header text as given, then `data_bytes` zero bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a dtlab::Error) ") + e.what();
  }
  return "(no error)";
}

// The loader's message must be one sentence that starts with the path and contains `phrase`.
void check_load_fails(const std::string& path, const std::string& phrase) {
  std::string msg = error_of([&] { load_safetensors(path); });
  INFO("message: ", msg);
  INFO("expected phrase: ", phrase);
  CHECK(msg.starts_with(path + ": "));
  CHECK(msg.find(phrase) != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
}

void check_corrupt(const std::string& header, size_t data_bytes, const std::string& phrase) {
  TempDir dir;
  std::string p = dir.file("bad.safetensors");
  write_bytes(p, raw_file(header, data_bytes));
  check_load_fails(p, phrase);
}

std::vector<float> copy_params(const Model& m) { return {m.params(), m.params() + m.num_params()}; }

}  // namespace

TEST_SUITE("safetensors") {
  TEST_CASE("round trip keeps dtypes, shapes (0-d, 1-d, empty), values and metadata") {
    TempDir dir;
    std::string p = dir.file("t.safetensors");
    const float w[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f};
    const int64_t idx[4] = {0, -1, int64_t(1) << 40, 7};
    const float scalar = 3.5f;
    save_safetensors(p,
                     {{"w", DType::F32, {3, 2}, w},
                      {"idx", DType::I64, {4}, idx},
                      {"scalar", DType::F32, {}, &scalar},
                      {"empty", DType::F32, {0, 5}, nullptr}},
                     {{"a", "1"}, {"b", "x y"}});
    SafetensorsFile f = load_safetensors(p);
    CHECK(f.metadata == std::map<std::string, std::string>{{"a", "1"}, {"b", "x y"}});
    REQUIRE(f.entries.size() == 4);
    CHECK(f.entries[0].name == "w");
    CHECK(f.entries[1].name == "idx");
    CHECK(f.entries[2].name == "scalar");
    CHECK(f.entries[3].name == "empty");
    CHECK(f.data.size() == 24 + 32 + 4);

    const SafetensorsEntry* e = f.find("w");
    REQUIRE(e);
    CHECK(e->dtype == DType::F32);
    CHECK(e->shape == Shape{3, 2});
    CHECK(std::memcmp(f.bytes(*e), w, sizeof w) == 0);
    e = f.find("idx");
    REQUIRE(e);
    CHECK(e->dtype == DType::I64);
    CHECK(e->shape == Shape{4});
    CHECK(std::memcmp(f.bytes(*e), idx, sizeof idx) == 0);
    e = f.find("scalar");
    REQUIRE(e);
    CHECK(e->shape.empty());
    CHECK(e->end - e->begin == 4);
    float s = 0;
    std::memcpy(&s, f.bytes(*e), 4);
    CHECK(s == 3.5f);
    e = f.find("empty");
    REQUIRE(e);
    CHECK(e->shape == Shape{0, 5});
    CHECK(e->begin == e->end);
    CHECK(f.find("nope") == nullptr);

    SafetensorsFile h = load_safetensors_header(p);
    CHECK(h.data.empty());
    CHECK(h.metadata == f.metadata);
    REQUIRE(h.entries.size() == 4);
    CHECK(h.entries[1].begin == f.entries[1].begin);
  }

  TEST_CASE("exact bytes of a tiny file: little-endian length, compact JSON, space padding") {
    TempDir dir;
    const float v[2] = {1.0f, -2.0f};
    const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);

    std::string p = dir.file("meta.safetensors");
    save_safetensors(p, {{"a", DType::F32, {2}, v}}, {{"k", "v"}});
    const std::string json1 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
    REQUIRE(json1.size() == 79);  // padded to 80 so that 8 + 80 is a multiple of 8
    CHECK(read_bytes(p) == std::string("\x50\0\0\0\0\0\0\0", 8) + json1 + " " + data);

    std::string q = dir.file("plain.safetensors");
    save_safetensors(q, {{"a", DType::F32, {2}, v}}, {});
    const std::string json2 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    REQUIRE(json2.size() == 54);  // no "__metadata__" when empty; padded to 56
    CHECK(read_bytes(q) == std::string("\x38\0\0\0\0\0\0\0", 8) + json2 + "  " + data);

    std::string r = dir.file("none.safetensors");
    save_safetensors(r, {}, {});
    CHECK(read_bytes(r) == std::string("\x08\0\0\0\0\0\0\0", 8) + "{}      ");
    CHECK(load_safetensors(r).entries.empty());
  }

  TEST_CASE("save rejects duplicate and reserved names") {
    TempDir dir;
    std::string p = dir.file("d.safetensors");
    const float v[1] = {1};
    CHECK_THROWS_WITH_AS(save_safetensors(p, {{"x", DType::F32, {1}, v}, {"x", DType::F32, {1}, v}}, {}),
                         doctest::Contains("two tensors named 'x'"), Error);
    CHECK_THROWS_WITH_AS(save_safetensors(p, {{"__metadata__", DType::F32, {1}, v}}, {}),
                         doctest::Contains("'__metadata__'"), Error);
    CHECK(dir.listing().empty());
  }

  TEST_CASE("file-level problems") {
    TempDir dir;
    check_load_fails(dir.file("missing.safetensors"), "cannot open (No such file or directory)");
    check_load_fails(dir.path.string(), "is not a regular file");

    std::string p = dir.file("short.safetensors");
    write_bytes(p, "abc");
    check_load_fails(p, "too short");

    write_bytes(p, le64(200'000'000) + "{}      ");
    check_load_fails(p, "exceeds the 100 MB limit; the file is truncated or not a safetensors file");

    write_bytes(p, le64(1000) + "{}      ");
    check_load_fails(p, "header length 1000 is larger than the file (16 bytes); the file is truncated or not a safetensors file");

    // A real file cut short: the last tensor now runs past the end.
    const float v[4] = {1, 2, 3, 4};
    save_safetensors(p, {{"v", DType::F32, {4}, v}}, {});
    std::string bytes = read_bytes(p);
    write_bytes(p, bytes.substr(0, bytes.size() - 4));
    check_load_fails(p, "offsets out of range");
  }

  TEST_CASE("header JSON problems") {
    check_corrupt("[1, 2]  ", 0, "does not start with '{'");
    check_corrupt("{\"a\": }", 0, "not valid JSON");
    check_corrupt("{\"a\": 3}", 0, "entry 'a' is not an object");
    check_corrupt(R"({"a":{"dtype":"F32","data_offsets":[0,0]}})", 0, "tensor 'a' lacks \"shape\"");
    check_corrupt(R"({"a":{"shape":[],"data_offsets":[0,4]}})", 4, "lacks \"dtype\"");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1]}})", 4, "lacks \"data_offsets\"");
    check_corrupt(R"({"a":{"dtype":5,"shape":[],"data_offsets":[0,4]}})", 4, "\"dtype\" that is not a string");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[2,"x"],"data_offsets":[0,8]}})", 8, "\"shape\" that is not a list of integers");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "\"shape\" that is not a list of integers");
    check_corrupt(R"({"a":{"dtype":"F32","shape":7,"data_offsets":[0,4]}})", 4, "\"shape\" that is not a list of integers");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "not two non-negative integers [begin, end]");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "not two non-negative integers [begin, end]");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":{"b":0}}})", 4, "not two non-negative integers [begin, end]");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  8, "tensor name 'a' appears twice");
  }

  TEST_CASE("dtype and shape problems") {
    check_corrupt(R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4,
                  "tensor 'h' has dtype F16, which dtlab can't read; dtlab supports F32 and I64");
    check_corrupt(R"({"h":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", 4, "dtype BF16, which dtlab can't read");
    check_corrupt(R"({"h":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 2, "dtype BOOL, which dtlab can't read");
    check_corrupt(R"({"q":{"dtype":"Q7","shape":[2],"data_offsets":[0,4]}})", 4,
                  "unknown dtype 'Q7'; supported dtypes are F32 and I64");
    check_corrupt(R"({"n":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})", 0, "negative dimension in shape [2,-1]");
  }

  TEST_CASE("data_offsets problems") {
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, "[8, 4] with begin after end");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                  "tensor 'a' has offsets out of range: it ends at byte 16 but the data section holds 8 bytes; file truncated?");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20,
                  "tensor 'a' spans 20 bytes but shape (2, 3) of F32 needs 24 bytes");
    check_corrupt(R"({"i":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", 8, "of I64 needs 16 bytes");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  12, "tensors 'a' and 'b' overlap");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  12, "gap of 4 bytes in the data section before tensor 'b'");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "gap of 4 bytes");
    check_corrupt(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "the tensors cover 4 of the 8 bytes");
    // Listed out of offset order is fine: entries come back sorted.
    TempDir dir;
    std::string p = dir.file("order.safetensors");
    write_bytes(p, raw_file(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8));
    SafetensorsFile f = load_safetensors(p);
    REQUIRE(f.entries.size() == 2);
    CHECK(f.entries[0].name == "a");
    CHECK(f.entries[1].name == "b");
  }

  TEST_CASE("metadata problems") {
    check_corrupt(R"({"__metadata__":{"k":1}})", 0, "\"__metadata__\" value for 'k' is a number, not a string");
    check_corrupt(R"({"__metadata__":{"k":"v","l":null}})", 0, "value for 'l' is a null, not a string");
    check_corrupt(R"({"__metadata__":[1]})", 0, "\"__metadata__\" is not an object");
  }

  TEST_CASE("atomic save: a missing directory fails cleanly") {
    TempDir dir;
    std::string p = (dir.path / "no_such_dir" / "m.safetensors").string();
    const float v[1] = {1};
    std::string msg = error_of([&] { save_safetensors(p, {{"v", DType::F32, {1}, v}}, {}); });
    INFO("message: ", msg);
    CHECK(msg.starts_with(p + ": "));
    CHECK(msg.find("cannot create temporary file") != std::string::npos);
    CHECK(msg.find("No such file or directory") != std::string::npos);
    CHECK(!fs::exists(dir.path / "no_such_dir"));
    CHECK(dir.listing().empty());
  }

  TEST_CASE("atomic save: replaces an existing file and leaves no temp files") {
    TempDir dir;
    std::string p = dir.file("m.safetensors");
    write_bytes(p, "old contents, not a safetensors file");
    const float v[3] = {1, 2, 3};
    save_safetensors(p, {{"v", DType::F32, {3}, v}}, {{"step", "1"}});
    save_safetensors(p, {{"v", DType::F32, {3}, v}}, {{"step", "2"}});
    CHECK(load_safetensors(p).metadata.at("step") == "2");
    CHECK(dir.listing() == std::set<std::string>{"m.safetensors"});
  }

  TEST_CASE("atomic save: a failed rename removes the temp file") {
    TempDir dir;
    fs::create_directories(dir.path / "taken.safetensors");  // a directory where the file should go
    const float v[1] = {1};
    std::string p = dir.file("taken.safetensors");
    CHECK_THROWS_WITH_AS(save_safetensors(p, {{"v", DType::F32, {1}, v}}, {}), doctest::Contains("renaming"), Error);
    CHECK(dir.listing() == std::set<std::string>{"taken.safetensors"});
    CHECK(fs::is_empty(dir.path / "taken.safetensors"));
  }
}

TEST_SUITE("checkpoint") {
  TEST_CASE("round trip restores every parameter and the metadata") {
    TempDir dir;
    std::string p = dir.file("ckpt.safetensors");
    Model a(ModelSpec::parse("mlp:2,8,3"), nullptr, 0);
    for (int64_t i = 0; i < a.num_params(); i++) a.params()[i] = 0.25f * static_cast<float>(i) - 3.0f;
    save_checkpoint(p, a, 42, {{"note", "hello"}});

    // Torch state_dict names and shapes, so PyTorch can load it.
    SafetensorsFile f = load_safetensors(p);
    REQUIRE(f.entries.size() == 4);
    CHECK(f.find("0.weight")->shape == Shape{8, 2});
    CHECK(f.find("0.bias")->shape == Shape{8});
    CHECK(f.find("2.weight")->shape == Shape{3, 8});
    CHECK(f.find("2.bias")->shape == Shape{3});

    Model b(ModelSpec::parse("mlp:2,8,3"), nullptr, 7);
    CHECK(copy_params(b) != copy_params(a));
    CheckpointInfo info = load_checkpoint(p, b);
    CHECK(copy_params(b) == copy_params(a));
    CHECK(info.step == 42);
    CHECK(info.model_spec == "mlp:2,8,3");
    CHECK(info.metadata.at("format") == "dtlab");
    CHECK(info.metadata.at("note") == "hello");

    CheckpointInfo head = read_checkpoint_info(p);
    CHECK(head.step == 42);
    CHECK(head.model_spec == "mlp:2,8,3");
    CHECK(head.metadata == info.metadata);
  }

  TEST_CASE("a different model spec fails and leaves the model untouched") {
    TempDir dir;
    std::string p = dir.file("ckpt.safetensors");
    save_checkpoint(p, Model(ModelSpec::parse("mlp:2,8,3"), nullptr, 0), 5);
    Model other(ModelSpec::parse("mlp:2,16,3"), nullptr, 1);
    std::vector<float> before = copy_params(other);
    CHECK_THROWS_WITH_AS(load_checkpoint(p, other),
                         (p + ": holds a checkpoint of mlp:2,8,3 but the model is mlp:2,16,3; rerun with --model mlp:2,8,3 to load it").c_str(),
                         Error);
    CHECK(copy_params(other) == before);
  }

  TEST_CASE("files without dtlab metadata are checked tensor by tensor") {
    TempDir dir;
    std::string p = dir.file("torch.safetensors");
    Model src(ModelSpec::parse("mlp:2,8,3"), nullptr, 0);
    Model dst(ModelSpec::parse("mlp:2,8,3"), nullptr, 1);
    const std::vector<float> before = copy_params(dst);
    auto views = [&] {
      std::vector<TensorView> v;
      for (const Parameter& q : src.parameters()) v.push_back({q.name, DType::F32, q.shape, q.data});
      return v;
    };
    std::vector<float> big(64, 0.5f);
    const int64_t ints[8] = {};

    SUBCASE("a plain state_dict loads, with step 0 and no spec") {
      save_safetensors(p, views(), {});
      CheckpointInfo info = load_checkpoint(p, dst);
      CHECK(copy_params(dst) == copy_params(src));
      CHECK(info.step == 0);
      CHECK(info.model_spec.empty());
      return;
    }
    SUBCASE("missing tensor") {
      auto v = views();
      v.pop_back();
      save_safetensors(p, v, {});
      CHECK_THROWS_WITH_AS(load_checkpoint(p, dst), doctest::Contains("has no tensor '2.bias', which mlp:2,8,3 needs"), Error);
    }
    SUBCASE("wrong shape, after a tensor that matched") {
      auto v = views();
      v[2].shape = {3, 9};
      v[2].data = big.data();
      save_safetensors(p, v, {});
      CHECK_THROWS_WITH_AS(load_checkpoint(p, dst), (p + ": '2.weight' has shape (3, 9) but mlp:2,8,3 needs (3, 8)").c_str(), Error);
    }
    SUBCASE("wrong dtype") {
      auto v = views();
      v[1] = {"0.bias", DType::I64, {8}, ints};
      save_safetensors(p, v, {});
      CHECK_THROWS_WITH_AS(load_checkpoint(p, dst), doctest::Contains("'0.bias' has dtype I64 but dtlab parameters are F32"), Error);
    }
    SUBCASE("unexpected extra tensors") {
      auto v = views();
      for (const char* name : {"x1", "x2", "x3", "x4"}) v.push_back({name, DType::F32, {2}, big.data()});
      save_safetensors(p, v, {});
      CHECK_THROWS_WITH_AS(load_checkpoint(p, dst),
                           doctest::Contains("holds tensors that mlp:2,8,3 does not have ('x1', 'x2', 'x3' and 1 more)"), Error);
    }
    SUBCASE("corrupt step and model metadata") {
      save_safetensors(p, views(), {{"step", "12x"}});
      CHECK_THROWS_WITH_AS(load_checkpoint(p, dst), doctest::Contains("metadata \"step\" is '12x'"), Error);
      save_safetensors(p, views(), {{"model", "resnet"}});
      CHECK_THROWS_WITH_AS(read_checkpoint_info(p), doctest::Contains("metadata \"model\" is 'resnet', not a model spec"), Error);
    }
    CHECK(copy_params(dst) == before);
  }
}
