// dtlab-cli bench collectives, shared by its two modes: one algorithm measured over a size range
// (cmd_bench.cpp) and --sweep, every algorithm modeled for a profile and measured here
// (bench_sweep.cpp). Both fill, run and check the collective the same way (BenchRun).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "engine/comm/threads_backend.h"

namespace dtlab::cli {

struct BenchArgs {
  std::string op = "allreduce";
  std::string algo = "default";
  std::string proto = "auto";
  int world = 4;
  bool world_given = false;
  int64_t min_bytes = 1024, max_bytes = 64 << 20;
  int iters = 0;  // 0: chosen per size
  int warmup = 2;
  int root = 0;
  std::string profile;
  std::vector<std::string> faults;
  double timeout_s = 120;
  bool json = false;
  std::string sweep;             // "8B:1G": the --sweep mode
  std::string measured_max = "64M";  // --sweep: the largest size measured here
  bool csv = false;
};

CollectiveOp parse_bench_op(const std::string& s);
// Powers of two from min to max (nccl-tests -f 2), rounded to whole elements per rank.
std::vector<int64_t> bench_sizes(CollectiveOp op, int n, int64_t min_bytes, int64_t max_bytes);
// "8B:1G", "1K:64M", "8:1GiB" (K, M, G are powers of 1024, as nccl-tests' -b and -e); dtlab::Error
// (one sentence) otherwise.
std::pair<int64_t, int64_t> parse_size_range(const std::string& text);
int64_t parse_size(const std::string& text, const std::string& flag);

struct Measurement {
  double seconds = 0;  // per call, the mean of the timed iterations
  int64_t wrong = 0;   // elements that differ from the exact result, over every rank
};

// A world of threads and buffers large enough for `max_bytes`, running one collective at a time.
class BenchRun {
 public:
  BenchRun(int n, CollectiveOp op, int64_t max_bytes, WorldOptions opt, int root);
  // Checks one call of S bytes (#wrong), then times `iters` calls after `warmup`.
  Measurement measure(Algorithm algo, int64_t S, int iters, int warmup);

 private:
  int64_t check(Algorithm algo, int64_t S);
  ThreadsWorld w_;
  CollectiveOp op_;
  int n_, root_;
  std::vector<std::vector<float>> in_, out_;
};

// The --sweep mode; returns the exit code (1 if any element was wrong).
int run_sweep(const BenchArgs& a, Streams& io);

}  // namespace dtlab::cli
