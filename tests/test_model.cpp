// Model layout and initialization against torch.nn.Sequential (values printed by Debian's torch 1.13).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/model.h"

using namespace dtlab;

TEST_SUITE("model") {

TEST_CASE("parameter names, shapes and flat offsets follow torch.nn.Sequential") {
  Model m(ModelSpec::parse("mlp:2,64,64,3"), nullptr, 0);
  const auto& p = m.parameters();
  REQUIRE(p.size() == 6);
  CHECK(p[0].name == "0.weight");
  CHECK(p[0].shape == Shape{64, 2});
  CHECK(p[1].name == "0.bias");
  CHECK(p[2].name == "2.weight");
  CHECK(p[2].shape == Shape{64, 64});
  CHECK(p[4].name == "4.weight");
  CHECK(p[4].shape == Shape{3, 64});
  CHECK(p[5].name == "4.bias");
  CHECK(p[5].offset + p[5].numel == m.num_params());
  CHECK(m.num_params() == 2 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3);
  CHECK(m.num_params() == ModelSpec::parse("mlp:2,64,64,3").num_params());
  CHECK(m.num_layers() == 5);  // Linear ReLU Linear ReLU Linear
  CHECK(m.layer(1).kind == LayerKind::ReLU);
  CHECK(m.layer(4).seq_index == 4);
  CHECK(m.find_parameter("2.bias") == 3);
  CHECK(m.find_parameter("1.weight") == -1);
}

TEST_CASE("init equals torch.manual_seed(0), Sequential(Linear(2,4), ReLU(), Linear(4,3)) bit for bit") {
  // /usr/bin/python3: torch.manual_seed(0); m = nn.Sequential(nn.Linear(2,4), nn.ReLU(), nn.Linear(4,3));
  // [float.hex(x) for x in v.flatten().tolist()] for each state_dict entry.
  const std::vector<std::vector<double>> expected = {
      {-0x1.5af244p-8, 0x1.846d38p-2, -0x1.29f962p-1, -0x1.0a703ap-1, -0x1.16e1acp-2,
       0x1.845556p-3, -0x1.cb14aep-7, 0x1.1f0e8p-1},
      {-0x1.0107bcp-4, 0x1.7f332ep-3, -0x1.b5a6bap-3, -0x1.1ca836p-3},
      {-0x1.e9237p-2, -0x1.5316a4p-2, -0x1.a61ddp-3, 0x1.2f76p-6, 0x1.94d2cp-3, 0x1.33363p-2,
       -0x1.5b1b18p-2, -0x1.bde9f8p-3, 0x1.73ef3p-3, 0x1.a9289cp-2, -0x1.a57a9p-4, 0x1.7f22b8p-2},
      {-0x1.4a1a8p-4, 0x1.b16a2p-5, 0x1.cf9a94p-2}};
  Model m(ModelSpec::parse("mlp:2,4,3"), nullptr, 0);
  for (size_t i = 0; i < expected.size(); i++) {
    const Parameter& p = m.parameters()[i];
    REQUIRE(static_cast<size_t>(p.numel) == expected[i].size());
    for (int64_t k = 0; k < p.numel; k++) CHECK(p.data[k] == static_cast<float>(expected[i][k]));
  }
}

TEST_CASE("init of the bench model matches torch.manual_seed(123) sums") {
  // torch.manual_seed(123); Sequential(Linear(256,1024), ReLU(), Linear(1024,10)):
  // per tensor: v.double().sum() and the last element.
  Model m(ModelSpec::parse("mlp:256,1024,10"), nullptr, 123);
  const double sums[] = {7.985818259418011, 0.43400903791189194, -0.34128090739250183,
                         -0.1449015475809574};
  const float last[] = {0.032540395855903625f, 0.05206257849931717f, 0.021606311202049255f,
                        -0.020823296159505844f};
  for (int i = 0; i < 4; i++) {
    const Parameter& p = m.parameters()[static_cast<size_t>(i)];
    double s = 0;
    for (int64_t k = 0; k < p.numel; k++) s += p.data[k];
    CHECK(s == doctest::Approx(sums[i]).epsilon(1e-12));
    CHECK(p.data[p.numel - 1] == last[i]);
  }
}

TEST_CASE("memory tracker sees parameters, gradients and activations") {
  MemoryTracker mem;
  Model m(ModelSpec::parse("mlp:2,8,3"), &mem, 0);
  const int64_t P = 2 * 8 + 8 + 8 * 3 + 3;
  CHECK(mem.stats().current_of(MemCategory::Parameters) == 4 * P);
  CHECK(mem.stats().current_of(MemCategory::Gradients) == 4 * P);
  std::vector<float> x(5 * 2, 0.5f);
  m.forward(x.data(), 5);
  // outputs of Linear(2,8), ReLU, Linear(8,3) plus two gradient scratch buffers of the widest layer
  CHECK(mem.stats().current_of(MemCategory::Activations) == 4 * (5 * 8 + 5 * 8 + 5 * 3 + 2 * 5 * 8));
  m.forward(x.data(), 3);  // a smaller batch reuses the buffers
  CHECK(mem.stats().allocations == 2 + 5);
}

TEST_CASE("bad model specs are one clear sentence") {
  CHECK_THROWS_WITH_AS(ModelSpec::parse("resnet50"),
                       doctest::Contains("is not a known model; write it as mlp:D0,D1,...,Dk"), Error);
  CHECK_THROWS_WITH_AS(ModelSpec::parse("mlp:2,,3"), doctest::Contains("has '' where a layer width"), Error);
  CHECK_THROWS_WITH_AS(ModelSpec::parse("mlp:2,x,3"), doctest::Contains("has 'x' where"), Error);
  CHECK_THROWS_WITH_AS(ModelSpec::parse("mlp:2,0,3"), doctest::Contains("width 0"), Error);
  CHECK_THROWS_WITH_AS(ModelSpec::parse("mlp:5"), doctest::Contains("at least an input and an output"), Error);
  CHECK(ModelSpec::parse("mlp:2,64,64,3").str() == "mlp:2,64,64,3");
}

TEST_CASE("a model too large to build is refused by its spec, before anything is allocated") {
  CHECK_THROWS_WITH_AS(ModelSpec::parse("mlp:1048576,1048576,1048576"),
                       doctest::Contains("has 2199025352704 parameters; dtlab builds models of up to 4294967296"), Error);
  CHECK(ModelSpec::parse("mlp:4096,16384,16384,4096").num_params() == 402690048);  // the GEMM bench's model
}

}  // TEST_SUITE
