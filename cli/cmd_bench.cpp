// dtlab-cli bench collectives: an nccl-tests-style sweep over message sizes for one collective on
// the threads backend, with the single-thread memcpy bandwidth measured in the same run as the
// yardstick (a ring step is a fused read-reduce-write, so memcpy is the ceiling that matters).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_collectives.h"
#include "cli/commands.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/check.h"
#include "engine/core/format.h"  // choice_list
#include "engine/trace/tuning.h"

namespace dtlab::cli {

namespace {

using Clock = std::chrono::steady_clock;

// The ops the sweep knows how to fill and check; --op takes their short names ("reducescatter").
constexpr CollectiveOp kBenchedOps[] = {CollectiveOp::AllReduce, CollectiveOp::ReduceScatter, CollectiveOp::AllGather,
                                        CollectiveOp::Broadcast, CollectiveOp::AllToAll};

std::vector<std::string> benched_names() {
  std::vector<std::string> names;
  for (CollectiveOp op : kBenchedOps) names.push_back(collective_traits(op).short_name);
  return names;
}

// Best of a few single-thread memcpy runs over `bytes` (at least 16 MiB so caches do not flatter it).
double memcpy_gbps(int64_t bytes) {
  size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 16 << 20));
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int i = 0; i < 4; i++) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) / s / 1e9);
    std::swap(a, b);
  }
  return best;
}

// The count argument of a call whose payload is S bytes of floats (S in the nccl-tests sense).
int64_t call_count(CollectiveOp op, int64_t S, int n) { return S / 4 / collective_traits(op).payload_count(1, n); }

// One call of the collective on `rank`, of `count` elements (call_count).
WorkPtr issue(Communicator& c, CollectiveOp op, Algorithm algo, float* in, float* out, int64_t count, int root) {
  switch (op) {
    case CollectiveOp::AllReduce: return c.all_reduce(out, count, DType::F32, ReduceOp::Sum, algo);
    case CollectiveOp::ReduceScatter: return c.reduce_scatter(out, in, count, DType::F32, ReduceOp::Sum, algo);
    case CollectiveOp::AllGather: return c.all_gather(out, in, count, DType::F32, algo);
    case CollectiveOp::AllToAll: return c.all_to_all(out, in, count, DType::F32, algo);  // pairwise or grouped
    default: return c.broadcast(out, count, DType::F32, root, algo);
  }
}

float fill_value(int r, int64_t i) { return static_cast<float>((r + 1) + (i % 13)); }

}  // namespace

CollectiveOp parse_bench_op(const std::string& s) {
  for (CollectiveOp op : kBenchedOps)
    if (s == collective_traits(op).short_name) return op;
  throw Error("--op " + s + " is not benchmarked; use " + choice_list(benched_names()));
}

std::vector<int64_t> bench_sizes(CollectiveOp op, int n, int64_t min_bytes, int64_t max_bytes) {
  const int64_t align = 4 * collective_traits(op).payload_count(1, n);
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s <= max_bytes; s *= 2) {
    int64_t S = std::max(align, s / align * align);
    if (sizes.empty() || sizes.back() != S) sizes.push_back(S);
  }
  return sizes;
}

BenchRun::BenchRun(int n, CollectiveOp op, int64_t max_bytes, WorldOptions opt, int root)
    : w_(n, std::move(opt)), op_(op), n_(n), root_(root) {
  const size_t top = static_cast<size_t>(max_bytes / 4);
  in_.assign(static_cast<size_t>(n), std::vector<float>(top, 0.0f));
  out_.assign(static_cast<size_t>(n), std::vector<float>(top, 0.0f));
}

// Fills inputs with small integers (exact sums), runs once, and counts wrong elements on all ranks.
int64_t BenchRun::check(Algorithm algo, int64_t S) {
  const CollectiveTraits& t = collective_traits(op_);
  const int n = n_, root = root_;
  const int64_t count = S / 4, per = count / n;
  const int64_t call = call_count(op_, S, n), filled = t.in_count(call, n);
  for (int r = 0; r < n; r++) {
    auto& input = t.out_of_place ? in_[static_cast<size_t>(r)] : out_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < filled; i++) input[static_cast<size_t>(i)] = fill_value(r, i);
  }
  w_.run([&](int r, Communicator& c, RankContext&) {
    issue(c, op_, algo, in_[static_cast<size_t>(r)].data(), out_[static_cast<size_t>(r)].data(), call, root)->wait();
  });
  int64_t wrong = 0;
  for (int r = 0; r < n; r++) {
    const auto& out = out_[static_cast<size_t>(r)];
    if (op_ == CollectiveOp::AllReduce) {
      for (int64_t i = 0; i < count; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += fill_value(q, i);
        wrong += out[static_cast<size_t>(i)] != want;
      }
    } else if (op_ == CollectiveOp::Broadcast) {
      for (int64_t i = 0; i < count; i++) wrong += out[static_cast<size_t>(i)] != fill_value(root, i);
    } else if (op_ == CollectiveOp::ReduceScatter) {
      for (int64_t i = 0; i < per; i++) {
        float want = 0;
        for (int q = 0; q < n; q++) want += fill_value(q, r * per + i);
        wrong += out[static_cast<size_t>(i)] != want;
      }
    } else if (op_ == CollectiveOp::AllToAll) {  // block r of rank q's input is block q of rank r's output
      for (int q = 0; q < n; q++)
        for (int64_t i = 0; i < per; i++) wrong += out[static_cast<size_t>(q * per + i)] != fill_value(q, r * per + i);
    } else {
      for (int q = 0; q < n; q++)
        for (int64_t i = 0; i < per; i++) wrong += out[static_cast<size_t>(q * per + i)] != fill_value(q, i);
    }
  }
  return wrong;
}

Measurement BenchRun::measure(Algorithm algo, int64_t S, int iters, int warmup) {
  Measurement m;
  m.wrong = check(algo, S);
  const int64_t call = call_count(op_, S, n_);
  w_.run([&](int r, Communicator& c, RankContext&) {
    float* in = in_[static_cast<size_t>(r)].data();
    float* out = out_[static_cast<size_t>(r)].data();
    for (int i = 0; i < warmup; i++) issue(c, op_, algo, in, out, call, root_)->wait();
    c.barrier()->wait();
    auto t0 = Clock::now();
    WorkPtr last;
    for (int i = 0; i < iters; i++) last = issue(c, op_, algo, in, out, call, root_);
    last->wait();
    c.barrier()->wait();
    if (r == 0) m.seconds = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  });
  return m;
}

namespace {

int run_bench(const BenchArgs& a, Streams& io) {
  const CollectiveOp op = parse_bench_op(a.op);
  const Algorithm algo = a.algo == "default" ? Algorithm::Default : parse_algorithm_choice(a.algo, op);
  const bool tuned = a.algo == "auto";
  check_algorithm(op, algo);
  const CollectiveTraits& t = collective_traits(op);
  const Algorithm shown = algo != Algorithm::Default || tuned ? algo : t.default_algorithm;
  const int n = a.world;
  if (a.min_bytes > a.max_bytes)
    throw Error("--min-bytes " + std::to_string(a.min_bytes) + " is larger than --max-bytes " + std::to_string(a.max_bytes));
  if (a.root >= n) throw Error("--root " + std::to_string(a.root) + " is out of range for --world " + std::to_string(n));
  WorldOptions opt;
  opt.record = false;  // like nccl-tests: measure the collective, not the profiler
  opt.timeout_s = a.timeout_s;
  for (const auto& f : a.faults) opt.faults.push_back(parse_fault(f));
  if (op == CollectiveOp::AllReduce && (algo != Algorithm::Default || tuned)) opt.allreduce_algo = algo;
  opt.protocol = parse_protocol_choice(a.proto);
  std::unique_ptr<CostModel> model;
  if (!a.profile.empty()) {
    model = std::make_unique<CostModel>(find_profile(a.profile), n);
    check_forced_choice(model->profile(), op, algo, opt.protocol);
    opt.profile = a.profile;  // what --algo auto tunes for
  }
  const std::vector<int64_t> sizes = bench_sizes(op, n, a.min_bytes, a.max_bytes);
  BenchRun run(n, op, sizes.back(), opt, a.root);

  const double mem_gbps = memcpy_gbps(sizes.back());
  const double factor = t.busbw_factor(n);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    io.out << "# dtlab-cli bench collectives: " << a.op << ", " << algorithm_choice_name(shown) << ", world " << n
           << ", threads backend (one thread and one comm worker per rank)\n";
    io.out << "# busbw = algbw * " << t.busbw_formula()
           << " (nccl-tests); single-thread memcpy in this run: " << mem_gbps << " GB/s\n";
    char head[256];
    std::snprintf(head, sizeof head, "#%12s %12s %6s %6s %6s %10s %8s %8s %7s", "size", "count", "type", "redop",
                  "root", "time", "algbw", "busbw", "#wrong");
    io.out << head << (model ? "   model(us) model busbw" : "") << "\n";
    std::snprintf(head, sizeof head, "#%12s %12s %6s %6s %6s %10s %8s %8s %7s", "(B)", "(elements)", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "");
    io.out << head << (model ? "   (" + a.profile + ")" : "") << "\n";
  }
  double busbw_sum = 0;
  int64_t wrong_total = 0;
  for (int64_t S : sizes) {
    int iters = a.iters > 0 ? a.iters : static_cast<int>(std::clamp<int64_t>((256 << 20) / std::max<int64_t>(S, 1), 5, 200));
    const Measurement m = run.measure(algo, S, iters, a.warmup);
    const int64_t wrong = m.wrong;
    const double seconds = m.seconds;
    wrong_total += wrong;
    double algbw = static_cast<double>(S) / seconds / 1e9, busbw = algbw * factor;
    busbw_sum += busbw;
    double model_s = model && !tuned ? model->collective_time(op, shown, static_cast<double>(S)) : 0;
    if (model && tuned) model_s = select(model->profile(), n, op, static_cast<double>(S), algo, opt.protocol).seconds;
    if (a.json) {
      nlohmann::json row = {{"size", S}, {"count", S / 4}, {"time_us", seconds * 1e6}, {"algbw", algbw},
                            {"busbw", busbw}, {"wrong", wrong}};
      if (model) row["model_us"] = model_s * 1e6;
      rows.push_back(row);
      continue;
    }
    char line[256];
    std::snprintf(line, sizeof line, " %12lld %12lld %6s %6s %6d %10.1f %8.2f %8.2f %7lld", static_cast<long long>(S),
                  static_cast<long long>(S / 4), "float", t.reduces ? "sum" : "none",
                  t.has_root ? a.root : -1, seconds * 1e6, algbw, busbw, static_cast<long long>(wrong));
    io.out << line;
    if (model) {
      std::snprintf(line, sizeof line, "  %10.1f %8.1f", model_s * 1e6, static_cast<double>(S) / model_s / 1e9 * factor);
      io.out << line;
    }
    io.out << "\n" << std::flush;
  }
  double avg = busbw_sum / static_cast<double>(sizes.size());
  if (a.json) {
    nlohmann::json j = {{"op", a.op}, {"algo", algorithm_choice_name(shown)}, {"world", n}, {"rows", rows},
                        {"avg_busbw", avg}, {"memcpy_gbps", mem_gbps}, {"wrong", wrong_total}};
    io.out << j.dump() << "\n";
  } else {
    char line[160];
    std::snprintf(line, sizeof line, "# Out of bounds values : %lld %s\n# Avg bus bandwidth    : %.3f GB/s (%.2fx single-thread memcpy)\n",
                  static_cast<long long>(wrong_total), wrong_total ? "ERROR" : "OK", avg, avg / mem_gbps);
    io.out << line;
  }
  return wrong_total ? 1 : 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  app.require_subcommand(1);
  CLI::App* coll = app.add_subcommand("collectives", "nccl-tests-style sweep of one collective over message sizes");
  auto a = std::make_shared<BenchArgs>();
  std::string ops;
  for (const std::string& name : benched_names()) ops += (ops.empty() ? "" : " | ") + name;
  coll->add_option("--op", a->op, ops)->capture_default_str();
  coll->add_option("--algo", a->algo, "ring | tree | naive | dbtree | hierarchical | nvls | auto (the tuning model's pick per "
                                      "size) | default (ring; tree for broadcast; pairwise for alltoall); alltoall: pairwise | "
                                      "grouped; with --sweep: only this one")->capture_default_str();
  coll->add_option("--proto", a->proto, "Protocol (NCCL_PROTO): auto | simple | ll | ll128")->capture_default_str();
  CLI::Option* world = coll->add_option("--world", a->world, "Number of ranks (--sweep: the profile's, up to 16)")
                           ->check(whole_number(1, 64))->capture_default_str();
  coll->add_option("--min-bytes", a->min_bytes, "Smallest message (bytes)")->check(whole_number(4, int64_t{1} << 31))->capture_default_str();
  coll->add_option("--max-bytes", a->max_bytes, "Largest message (bytes)")->check(whole_number(4, int64_t{1} << 31))->capture_default_str();
  coll->add_option("--iters", a->iters, "Timed iterations per size (default: by size)")->check(whole_number(1, 100000));
  coll->add_option("--warmup", a->warmup, "Untimed iterations per size")->check(whole_number(0, 1000))->capture_default_str();
  coll->add_option("--root", a->root, "Broadcast root")->check(whole_number(0, 63))->capture_default_str();
  coll->add_option("--profile", a->profile, "Also print modeled time on a hardware profile (" + join(profile_names(), ", ") + ")");
  coll->add_option("--fault", a->faults, "Inject a fault: skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M");
  coll->add_option("--timeout", a->timeout_s, "Watchdog timeout in seconds")->check(real_number(0.01, 3600))->capture_default_str();
  coll->add_flag("--json", a->json, "Print one JSON object");
  coll->add_option("--sweep", a->sweep, "MIN:MAX, e.g. 8B:1G (nccl-tests -b 8 -e 1G -f 2): every algorithm of --op, modeled for "
                                        "--profile (default nvlink8) and measured on this machine's threads, with the crossovers");
  coll->add_option("--measured-max", a->measured_max, "--sweep: the largest size measured here (the model goes on to MAX)")
      ->capture_default_str();
  coll->add_flag("--csv", a->csv, "--sweep: print CSV rows instead of tables");
  return [a, world](Streams& io) {
    a->world_given = world->count() > 0;
    return a->sweep.empty() ? run_bench(*a, io) : run_sweep(*a, io);
  };
}

}  // namespace dtlab::cli
