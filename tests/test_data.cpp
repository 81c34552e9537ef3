// Datasets (spiral, blobs, specs), .npz loading against fixtures in tests/data (made by
// tests/data/make_fixtures.py with numpy), and DataLoader batching over the sampler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/core/check.h"
#include "engine/data/dataset.h"
#include "engine/data/loader.h"
#include "engine/data/npz.h"
#include "engine/data/sampler.h"
#include "test_util.h"

#ifndef DTLAB_SOURCE_DIR
#error "DTLAB_SOURCE_DIR must name the source tree (CMake defines it for dtlab_tests)"
#endif

using namespace dtlab;

using dtlab::test::contains;

namespace {

std::string fixture(const char* name) { return std::string(DTLAB_SOURCE_DIR) + "/tests/data/" + name; }

bool same_bytes(const Dataset& a, const Dataset& b) {
  return a.x.size() == b.x.size() && a.y == b.y &&
         std::memcmp(a.x.data(), b.x.data(), a.x.size() * sizeof(float)) == 0;
}

// The message of the Error thrown by load_npz(fixture(name)), or "" if none was thrown.
std::string npz_error(const char* name) {
  try {
    load_npz(fixture(name));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("spiral: shape, labels in class order, radius") {
    const Dataset ds = make_spiral(3, 100, 0.1f, 0);
    CHECK(ds.n == 300);
    CHECK(ds.d == 2);
    CHECK(ds.num_classes == 3);
    REQUIRE(ds.x.size() == 600);
    for (int64_t i = 0; i < ds.n; ++i) CHECK(ds.y[static_cast<size_t>(i)] == i / 100);
    // r = i / (P - 1) whatever the angle noise: first point of a class at the origin, last on the unit circle.
    CHECK(ds.x[0] == 0.0f);
    CHECK(ds.x[1] == 0.0f);
    const float x = ds.x[2 * 99], y = ds.x[2 * 99 + 1];
    CHECK(x * x + y * y == doctest::Approx(1.0).epsilon(1e-5));
  }

  TEST_CASE("blobs: shape, labels, points near their class center") {
    const Dataset ds = make_blobs(5, 4, 50, 0.01f, 1);
    CHECK(ds.n == 200);
    CHECK(ds.d == 5);
    CHECK(ds.num_classes == 4);
    REQUIRE(ds.x.size() == 1000);
    CHECK(ds.y.front() == 0);
    CHECK(ds.y.back() == 3);
    for (int64_t i = 1; i < 50; ++i)  // tiny spread: every point of class 0 sits next to the first one
      for (size_t c = 0; c < 5; ++c) CHECK(std::abs(ds.x[static_cast<size_t>(i) * 5 + c] - ds.x[c]) < 0.2f);
    for (float v : ds.x) CHECK(std::abs(v) < 4.2f);
  }

  TEST_CASE("synthetic sets are deterministic in the seed") {
    CHECK(same_bytes(make_spiral(3, 200, 0.1f, 5), make_spiral(3, 200, 0.1f, 5)));
    CHECK_FALSE(same_bytes(make_spiral(3, 200, 0.1f, 5), make_spiral(3, 200, 0.1f, 6)));
    CHECK(same_bytes(make_blobs(4, 3, 20, 1.0f, 9), make_blobs(4, 3, 20, 1.0f, 9)));
    CHECK_FALSE(same_bytes(make_blobs(4, 3, 20, 1.0f, 9), make_blobs(4, 3, 20, 1.0f, 10)));
    // Pinned values (own uniform and Box-Muller conversions, so the same on every platform): a change
    // here means every existing seed now gives a different dataset.
    const Dataset s = make_spiral(3, 1000, 0.1f, 0);
    CHECK(s.x[1000] == 0x1.e7ff46p-2f);
    CHECK(s.x[1001] == -0x1.393a3p-3f);
    CHECK(s.x[5999] == 0x1.ac589cp-1f);
    const Dataset b = make_blobs(4, 3, 20, 1.0f, 9);
    CHECK(b.x[0] == 0x1.6befe2p-2f);
    CHECK(b.x[239] == -0x1.365bfcp-1f);
  }

  TEST_CASE("make_dataset: defaults come from the model, the spec overrides them") {
    const Dataset s = make_dataset("spiral", 2, 4);
    CHECK(s.n == 4000);
    CHECK(s.num_classes == 4);
    CHECK(s.name == "spiral:classes=4,points=1000,noise=0.1,seed=0");
    CHECK(same_bytes(make_dataset(s.name, 2, 9), s));  // the name is a spec that rebuilds the set
    const Dataset c = make_dataset("spiral:classes=2, points=10,noise=0,seed=3", 2, 4);
    CHECK(c.n == 20);
    CHECK(c.num_classes == 2);
    const Dataset b = make_dataset("blobs", 7, 5);
    CHECK(b.d == 7);
    CHECK(b.num_classes == 5);
    CHECK(b.n == 2500);
    CHECK(b.name == "blobs:dim=7,classes=5,points=500,spread=1,seed=0");
    const Dataset b2 = make_dataset("blobs:dim=3,classes=2,points=4,spread=0.5,seed=1", 7, 5);
    CHECK(b2.d == 3);
    CHECK(b2.n == 8);
    CHECK(make_dataset(fixture("good.npz"), 99, 99).n == 6);
  }

  TEST_CASE("make_dataset: bad specs name the wrong part and the valid keys") {
    auto message = [](const char* spec) -> std::string {
      try {
        make_dataset(spec, 2, 3);
      } catch (const Error& e) {
        return e.what();
      }
      return "";
    };
    CHECK(message("spiral:foo=1") ==
          "data spec 'spiral:foo=1': unknown key 'foo'; valid keys for spiral are classes, points, noise, seed.");
    CHECK(contains(message("blobs:dim=abc"), "dim must be a positive integer, got 'abc'"));
    CHECK(contains(message("blobs:dim=abc"), "valid keys for blobs are dim, classes, points, spread, seed"));
    CHECK(contains(message("spiral:points=0"), "points must be a positive integer"));
    CHECK(contains(message("spiral:noise=-1"), "noise must be a number >= 0"));
    CHECK(contains(message("spiral:classes"), "'classes' is not key=value"));
    CHECK(contains(message("spiral:seed=1,seed=2"), "given twice"));
    CHECK(contains(message("moons"), "unknown data spec 'moons'; use spiral, blobs"));
    CHECK(contains(message("blobs:dim=100000,points=100000"), "limit"));
  }

  TEST_CASE("npz: numpy.savez and savez_compressed load exactly") {
    for (const char* name : {"good.npz", "good_compressed.npz", "zip64_v2v3.npz"}) {
      CAPTURE(name);
      const Dataset ds = load_npz(fixture(name));
      CHECK(ds.name == fixture(name));
      CHECK(ds.d == 3);
      CHECK(ds.num_classes == 3);
      CHECK(ds.n % 6 == 0);
      REQUIRE(ds.x.size() == static_cast<size_t>(ds.n * 3));
      for (int64_t i = 0; i < ds.n; ++i) {
        CHECK(ds.y[static_cast<size_t>(i)] == i % 3);
        for (int64_t c = 0; c < 3; ++c)  // x = arange(18).reshape(6, 3) * 0.5 - 1, tiled
          CHECK(ds.x[static_cast<size_t>(i * 3 + c)] == 0.5f * static_cast<float>((i % 6) * 3 + c) - 1.0f);
      }
    }
    CHECK(load_npz(fixture("good_compressed.npz")).n == 60);
  }

  TEST_CASE("npz: errors start with the path and say how to fix") {
    const std::string e_f64 = npz_error("x_float64.npz");
    CHECK(e_f64 == fixture("x_float64.npz") + ": x has dtype float64 (<f8); save it with x.astype(np.float32).");
    CHECK(contains(npz_error("y_int32.npz"), "y has dtype int32 (<i4); save it with y.astype(np.int64)"));
    CHECK(contains(npz_error("missing_y.npz"),
                   "has no array named y (it holds: x, labels); save it with np.savez(path, x=x, y=y)"));
    CHECK(contains(npz_error("mismatched_n.npz"), "x has 6 rows but y has 5 labels"));
    CHECK(contains(npz_error("negative_label.npz"), "y[2] is -1"));
    CHECK(contains(npz_error("x_1d.npz"), "x has shape (6,) but must be 2-D (N, D)"));
    CHECK(contains(npz_error("fortran.npz"), "Fortran order"));
    CHECK(contains(npz_error("truncated.npz"), "is truncated"));
    CHECK(contains(npz_error("x_short.npz"),
                   "x is truncated: its shape (6, 3) needs 72 bytes but only 64 are stored"));
    CHECK(contains(npz_error("not_a_zip.npz"), "is not a .npz file"));
    CHECK(contains(npz_error("duplicate_x.npz"), "holds two arrays named x; save it once with np.savez(path, x=x, y=y)"));
    CHECK(contains(npz_error("bzip2.npz"), "compression method 12"));
    CHECK(contains(npz_error("no_such_file.npz"), "no_such_file.npz does not exist"));
    for (const char* name : {"x_float64.npz", "truncated.npz", "not_a_zip.npz", "no_such_file.npz"})
      CHECK(npz_error(name).rfind(fixture(name), 0) == 0);
    // An item size numpy never writes (found by fuzz/npz.cpp: the bits overflowed an int) is named as written.
    const std::string huge = std::string(DTLAB_SOURCE_DIR) + "/fuzz/corpus/npz/crash_descr_itemsize.npz";
    CHECK_THROWS_WITH_AS(load_npz(huge), (huge + ": x has dtype <f999999999; save it with x.astype(np.float32).").c_str(), Error);
  }

  TEST_CASE("loader: batch counts, the last partial batch, indices follow the sampler") {
    const Dataset ds = make_blobs(3, 2, 11, 1.0f, 0);  // n = 22
    DistributedSampler sampler(SamplerConfig{.n = 22, .world_size = 2, .rank = 1, .seed = 4});
    CHECK(sampler.num_samples() == 11);
    DataLoader keep(ds, sampler, 4, false);
    CHECK(keep.num_batches() == 3);
    DataLoader drop(ds, sampler, 4, true);
    CHECK(drop.num_batches() == 2);

    for (int64_t epoch : {0, 1}) {
      keep.start_epoch(epoch);
      const std::vector<int64_t> order = sampler.indices();
      Batch b;
      std::vector<int64_t> seen, sizes;
      while (keep.next(b)) {
        sizes.push_back(b.size);
        REQUIRE(b.x.size() == static_cast<size_t>(b.size * 3));
        REQUIRE(b.y.size() == static_cast<size_t>(b.size));
        for (int64_t i = 0; i < b.size; ++i) {
          const size_t row = static_cast<size_t>(b.indices[static_cast<size_t>(i)]);
          CHECK(b.y[static_cast<size_t>(i)] == ds.y[row]);
          CHECK(std::memcmp(&b.x[static_cast<size_t>(i * 3)], &ds.x[row * 3], 3 * sizeof(float)) == 0);
        }
        seen.insert(seen.end(), b.indices.begin(), b.indices.end());
      }
      CHECK(sizes == std::vector<int64_t>{4, 4, 3});
      CHECK(seen == order);
      CHECK_FALSE(keep.next(b));  // stays exhausted until the next epoch
    }

    drop.start_epoch(0);
    Batch b;
    int batches = 0;
    while (drop.next(b)) {
      CHECK(b.size == 4);
      ++batches;
    }
    CHECK(batches == 2);
    CHECK_THROWS_AS(DataLoader(ds, sampler, 0, false), Error);
  }
}
