// DistributedSampler and torch_randperm against values printed by PyTorch 1.13 (python3-torch).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "engine/core/check.h"
#include "engine/data/sampler.h"

using dtlab::DistributedSampler;
using dtlab::SamplerConfig;
using Idx = std::vector<int64_t>;

namespace {

std::vector<Idx> all_ranks(int64_t n, int world, uint64_t seed, int64_t epoch, bool drop_last,
                           bool shuffle = true) {
  std::vector<Idx> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(SamplerConfig{.n = n, .world_size = world, .rank = r, .shuffle = shuffle,
                                       .seed = seed, .drop_last = drop_last});
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

int64_t weighted_sum(const Idx& v) {  // sum((i + 1) * v[i]): catches reorderings a plain sum misses
  int64_t s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += static_cast<int64_t>(i + 1) * v[i];
  return s;
}

}  // namespace

TEST_SUITE("sampler") {
  TEST_CASE("the sampler example of docs/course_sources.md §1: N=10, W=4, no shuffle") {
    CHECK(all_ranks(10, 4, 0, 0, false, false) == std::vector<Idx>{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}});
    CHECK(all_ranks(10, 4, 0, 0, true, false) == std::vector<Idx>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    DistributedSampler s(SamplerConfig{.n = 10, .world_size = 4, .rank = 2, .shuffle = false});
    CHECK(s.num_samples() == 3);
    CHECK(s.total_size() == 12);
    CHECK(s.global_order() == Idx{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
  }

  TEST_CASE("padding wraps around repeatedly when the padding exceeds N") {
    CHECK(all_ranks(3, 8, 0, 0, false, false) ==
          std::vector<Idx>{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}});
    // drop_last with N < W: torch's ceil((3 - 8) / 8) = 0, every rank gets nothing.
    for (const Idx& r : all_ranks(3, 8, 0, 0, true)) CHECK(r.empty());
  }

  TEST_CASE("empty dataset") {
    DistributedSampler s(SamplerConfig{.n = 0, .world_size = 2, .rank = 1});
    CHECK(s.num_samples() == 0);
    CHECK(s.indices().empty());
  }

  // Expected values from, for each case (N, W, seed, epoch, drop_last):
  //   /usr/bin/python3 -c "import torch; from torch.utils.data.distributed import DistributedSampler as S
  //   class D:
  //       def __len__(s): return N
  //   for r in range(W):
  //       s = S(D(), num_replicas=W, rank=r, shuffle=True, seed=seed, drop_last=drop_last)
  //       s.set_epoch(epoch); print(list(s))"
  TEST_CASE("shuffled orders match torch") {
    CHECK(all_ranks(10, 4, 0, 0, false) == std::vector<Idx>{{4, 3, 6}, {1, 9, 2}, {7, 0, 4}, {5, 8, 1}});
    CHECK(all_ranks(10, 4, 0, 1, false) == std::vector<Idx>{{5, 0, 7}, {6, 8, 4}, {1, 9, 5}, {2, 3, 6}});
    CHECK(all_ranks(10, 4, 0, 0, true) == std::vector<Idx>{{4, 3}, {1, 9}, {7, 0}, {5, 8}});
    CHECK(all_ranks(17, 3, 42, 0, false) ==
          std::vector<Idx>{{13, 15, 9, 10, 1, 0}, {4, 8, 11, 6, 7, 5}, {3, 16, 12, 2, 14, 13}});
    CHECK(all_ranks(17, 3, 42, 0, true) ==
          std::vector<Idx>{{13, 15, 9, 10, 1}, {4, 8, 11, 6, 7}, {3, 16, 12, 2, 14}});
    CHECK(all_ranks(3, 8, 0, 0, false) == std::vector<Idx>{{2}, {0}, {1}, {2}, {0}, {1}, {2}, {0}});
    CHECK(all_ranks(3, 8, 5, 2, false) == std::vector<Idx>{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}});
  }

  TEST_CASE("large shuffled case matches torch: prefix and checksums") {
    struct Expect {
      Idx prefix;
      int64_t sum, weighted;
    };
    // N=1000, W=8, seed 7, epoch 3, drop_last=False: 125 per rank; print(l[:8], sum(l),
    // sum((i+1)*v for i,v in enumerate(l))) for each rank's list l.
    const std::vector<Expect> keep = {
        {{937, 33, 680, 679, 40, 437, 358, 874}, 61359, 3644322},
        {{859, 714, 292, 159, 173, 386, 743, 509}, 59865, 3876628},
        {{548, 726, 312, 886, 672, 917, 216, 967}, 62292, 3794240},
        {{487, 238, 204, 210, 744, 310, 735, 303}, 60283, 3736028},
        {{148, 593, 428, 647, 383, 977, 99, 739}, 63800, 4119389},
        {{190, 108, 317, 603, 824, 636, 770, 273}, 66455, 4123258},
        {{199, 226, 164, 774, 485, 478, 690, 440}, 64524, 4017956},
        {{632, 353, 615, 360, 811, 869, 101, 115}, 60922, 3825338}};
    // N=1001, W=8, seed 7, epoch 3, drop_last=True: 125 per rank, one sample dropped.
    const std::vector<Expect> drop = {
        {{450, 477, 310, 891, 193, 621, 695, 523}, 60934, 3869875},
        {{406, 230, 811, 324, 349, 540, 826, 198}, 61137, 3713254},
        {{152, 624, 260, 415, 666, 308, 895, 941}, 60867, 3883367},
        {{578, 814, 749, 51, 182, 199, 610, 443}, 68646, 4402216},
        {{497, 18, 579, 297, 74, 355, 821, 893}, 59739, 3939466},
        {{214, 475, 120, 35, 431, 761, 142, 875}, 60269, 4031594},
        {{438, 751, 442, 634, 593, 8, 594, 709}, 63775, 4103606},
        {{693, 936, 31, 456, 110, 137, 39, 682}, 65093, 4239109}};
    for (const bool drop_last : {false, true}) {
      const int64_t n = drop_last ? 1001 : 1000;
      const std::vector<Idx> got = all_ranks(n, 8, 7, 3, drop_last);
      for (int r = 0; r < 8; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        const Expect& e = (drop_last ? drop : keep)[static_cast<size_t>(r)];
        REQUIRE(got[r].size() == 125);
        CHECK(Idx(got[r].begin(), got[r].begin() + 8) == e.prefix);
        CHECK(std::accumulate(got[r].begin(), got[r].end(), int64_t{0}) == e.sum);
        CHECK(weighted_sum(got[r]) == e.weighted);
      }
    }
  }

  TEST_CASE("set_epoch changes the order, the same epoch repeats it") {
    DistributedSampler s(SamplerConfig{.n = 100, .world_size = 4, .rank = 1, .seed = 3});
    const Idx e0 = s.indices();
    CHECK(s.indices() == e0);  // no set_epoch: every epoch identical (the classic pitfall)
    s.set_epoch(1);
    CHECK(s.epoch() == 1);
    const Idx e1 = s.indices();
    CHECK(e1 != e0);
    s.set_epoch(0);
    CHECK(s.indices() == e0);
    // Every rank's lists together cover the dataset exactly once when W divides N.
    Idx all;
    for (const Idx& r : all_ranks(100, 4, 3, 1, false)) all.insert(all.end(), r.begin(), r.end());
    std::sort(all.begin(), all.end());
    Idx iota(100);
    std::iota(iota.begin(), iota.end(), int64_t{0});
    CHECK(all == iota);
  }

  // torch.randperm(n, generator=torch.Generator().manual_seed(s)).tolist()
  TEST_CASE("torch_randperm matches torch.randperm") {
    CHECK(dtlab::torch_randperm(10, 0) == Idx{4, 1, 7, 5, 3, 9, 0, 8, 6, 2});
    CHECK(dtlab::torch_randperm(10, 1) == Idx{5, 6, 1, 2, 0, 8, 9, 3, 7, 4});
    CHECK(dtlab::torch_randperm(10, (uint64_t{1} << 32) + 1) == dtlab::torch_randperm(10, 1));  // low 32 bits
    CHECK(dtlab::torch_randperm(17, 42) == Idx{13, 4, 3, 15, 8, 16, 9, 11, 12, 10, 6, 2, 1, 7, 14, 0, 5});
    CHECK(dtlab::torch_randperm(5, 123) == Idx{2, 0, 1, 3, 4});
    CHECK(dtlab::torch_randperm(1, 0) == Idx{0});
    CHECK(dtlab::torch_randperm(0, 0).empty());
    const Idx p100 = dtlab::torch_randperm(100, 7);
    CHECK(Idx(p100.begin(), p100.begin() + 10) == Idx{15, 59, 71, 57, 2, 27, 87, 54, 36, 96});
    CHECK(Idx(p100.end() - 5, p100.end()) == Idx{88, 77, 13, 20, 19});
    CHECK_THROWS_AS(dtlab::torch_randperm(dtlab::kTorchRandpermMaxN, 0), dtlab::Error);
  }

  TEST_CASE("bad configs are one-sentence errors") {
    CHECK_THROWS_WITH_AS(DistributedSampler(SamplerConfig{.n = 10, .world_size = 4, .rank = 4}),
                         "rank 4 is out of range for world size 4; ranks are 0..3.", dtlab::Error);
    CHECK_THROWS_AS(DistributedSampler(SamplerConfig{.n = 10, .world_size = 2, .rank = -1}), dtlab::Error);
    CHECK_THROWS_WITH_AS(DistributedSampler(SamplerConfig{.n = 10, .world_size = 0}),
                         "world size must be at least 1, got 0.", dtlab::Error);
    CHECK_THROWS_AS(DistributedSampler(SamplerConfig{.n = -1}), dtlab::Error);
  }
}
