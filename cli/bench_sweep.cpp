// dtlab-cli bench collectives --sweep MIN:MAX: for every algorithm the op runs, an nccl-tests-style
// table (size, count, type, time, algbw, busbw, #wrong) first MODELED for a hardware profile by the
// tuning model (engine/trace/tuning.h: each algorithm at its best protocol), then MEASURED on this
// machine's threads backend (up to --measured-max, so the sweep stays quick), each followed by the
// sizes where the fastest algorithm changes. --csv prints the same rows as CSV.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "cli/bench_collectives.h"
#include "engine/core/check.h"
#include "engine/trace/tuning.h"

namespace dtlab::cli {

namespace {

constexpr int64_t kMaxSweepBytes = int64_t{1} << 40;  // 1 TiB: the model goes anywhere, memory does not
constexpr int kMaxDefaultWorld = 16;                  // a profile's world up to this is the sweep's default

struct Row {
  int64_t S = 0;
  Protocol proto = Protocol::Default;
  double seconds = 0;
  std::string wrong = "N/A";  // modeled rows check nothing (nccl-tests prints N/A with -c 0)
};

struct Sweep {
  const BenchArgs& a;
  Streams& io;
  CollectiveOp op;
  int n;
  HardwareProfile profile;
  Protocol proto;
  std::vector<Algorithm> algos;

  const CollectiveTraits& traits() const { return collective_traits(op); }

  void header(const std::string& title) {
    if (a.csv) return;
    io.out << "#\n# " << title << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "#%12s %12s %6s %6s %5s %6s %11s %9s %9s %7s\n", "size", "count", "type", "redop",
                  "root", "proto", "time", "algbw", "busbw", "#wrong");
    io.out << line;
    std::snprintf(line, sizeof line, "#%12s %12s %6s %6s %5s %6s %11s %9s %9s %7s\n", "(B)", "(elements)", "", "", "", "",
                  "(us)", "(GB/s)", "(GB/s)", "");
    io.out << line;
  }

  void row(const char* section, Algorithm algo, const Row& r) {
    const CollectiveTraits& t = traits();
    const double algbw = r.seconds > 0 ? static_cast<double>(r.S) / r.seconds / 1e9 : 0;
    const double busbw = algbw * bus_bandwidth_factor(t.op, n, algo);
    const long long S = r.S, count = r.S / 4;
    const int root = t.has_root ? a.root : -1;
    char line[256];
    if (a.csv)
      std::snprintf(line, sizeof line, "%s,%s,%lld,%lld,float,%s,%d,%s,%.3f,%.3f,%.3f,%s\n", section, algorithm_name(algo), S,
                    count, t.reduces ? "sum" : "none", root, protocol_name(r.proto), r.seconds * 1e6, algbw, busbw,
                    r.wrong.c_str());
    else
      std::snprintf(line, sizeof line, " %12lld %12lld %6s %6s %5d %6s %11.2f %9.3f %9.3f %7s\n", S, count, "float",
                    t.reduces ? "sum" : "none", root, protocol_name(r.proto), r.seconds * 1e6, algbw, busbw, r.wrong.c_str());
    io.out << line;
  }

  // "tree -> dbtree at 8 KiB; dbtree -> hierarchical at 128 KiB": where the fastest algorithm changes.
  void crossovers(const char* section, const std::vector<std::vector<Row>>& rows) {
    std::vector<std::pair<std::string, int64_t>> changes;
    const std::vector<Row>* sizes = nullptr;  // any algorithm's rows: they share the sizes
    for (const std::vector<Row>& r : rows)
      if (!r.empty()) sizes = &r;
    int prev = -1;
    for (size_t i = 0; sizes && i < sizes->size(); i++) {
      int best = -1;
      for (size_t k = 0; k < rows.size(); k++)
        if (!rows[k].empty() && (best < 0 || rows[k][i].seconds < rows[static_cast<size_t>(best)][i].seconds))
          best = static_cast<int>(k);
      if (best < 0) continue;
      if (prev >= 0 && best != prev)
        changes.push_back({std::string(algorithm_name(algos[static_cast<size_t>(prev)])) + " -> " +
                               algorithm_name(algos[static_cast<size_t>(best)]),
                           (*sizes)[i].S});
      prev = best;
    }
    if (a.csv) {
      for (const auto& [what, S] : changes) io.out << "crossover," << section << "," << what << "," << S << "\n";
      return;
    }
    io.out << "# " << section << " crossovers: ";
    if (changes.empty()) io.out << (prev >= 0 ? std::string(algorithm_name(algos[static_cast<size_t>(prev)])) + " fastest at every size" : "none");
    for (size_t i = 0; i < changes.size(); i++)
      io.out << (i ? "; " : "") << changes[i].first << " at " << format_bytes(static_cast<double>(changes[i].second));
    io.out << "\n";
  }
};

// The algorithms of the sweep: --algo's one, or every one the op runs that the profile offers.
std::vector<Algorithm> sweep_algorithms(const BenchArgs& a, CollectiveOp op) {
  const CollectiveTraits& t = collective_traits(op);
  if (a.algo != "default" && a.algo != "auto") {
    const Algorithm one = parse_algorithm_choice(a.algo, op);
    check_algorithm(op, one);
    return {one};
  }
  std::vector<Algorithm> all;
  for (Algorithm x : kAlgorithms)
    if (t.runs(x)) all.push_back(x);
  return all;
}

// The modeled tables; returns the algorithms the profile offers (those the measured part runs).
std::vector<Algorithm> model_tables(Sweep& s, const std::vector<int64_t>& sizes) {
  std::vector<std::vector<Row>> rows(s.algos.size());
  std::vector<Algorithm> offered;
  for (size_t k = 0; k < s.algos.size(); k++) {
    const Algorithm algo = s.algos[k];
    const Prediction probe = select(s.profile, s.n, s.op, 1, algo, s.proto);
    if (!probe.available && s.algos.size() > 1) {
      if (!s.a.csv) s.io.out << "#\n# " << algorithm_name(algo) << ": not modeled: " << probe.why_not << "\n";
      continue;
    }
    offered.push_back(algo);
    s.header(std::string(algorithm_name(algo)) + ", MODELED for " + s.profile.name + " (the tuning model, at its best protocol)");
    for (int64_t S : sizes) {
      const Prediction p = select(s.profile, s.n, s.op, static_cast<double>(S), algo, s.proto);
      rows[k].push_back(Row{S, p.proto, p.seconds});
      s.row("modeled", algo, rows[k].back());
    }
  }
  s.crossovers("modeled", rows);
  return offered;
}

void measured_tables(Sweep& s, const std::vector<Algorithm>& offered, const std::vector<int64_t>& sizes, int64_t& wrong) {
  if (sizes.empty()) return;
  WorldOptions opt;
  opt.record = false;  // like nccl-tests: measure the collective, not the profiler
  opt.timeout_s = s.a.timeout_s;
  opt.protocol = s.proto;
  opt.profile = s.profile.name;
  BenchRun run(s.n, s.op, sizes.back(), opt, s.a.root);
  std::vector<std::vector<Row>> rows(s.algos.size());
  for (size_t k = 0; k < s.algos.size(); k++) {
    const Algorithm algo = s.algos[k];
    if (std::find(offered.begin(), offered.end(), algo) == offered.end()) continue;
    s.header(std::string(algorithm_name(algo)) + ", MEASURED on this machine's threads backend");
    for (int64_t S : sizes) {
      const int iters = s.a.iters > 0 ? s.a.iters : static_cast<int>(std::clamp<int64_t>((64 << 20) / std::max<int64_t>(S, 1), 2, 50));
      const Measurement m = run.measure(algo, S, iters, s.a.warmup);
      wrong += m.wrong;
      const Prediction p = select(s.profile, s.n, s.op, static_cast<double>(S), algo, s.proto);
      rows[k].push_back(Row{S, p.proto, m.seconds, std::to_string(m.wrong)});
      s.row("measured", algo, rows[k].back());
    }
  }
  s.crossovers("measured", rows);
}

}  // namespace

int64_t parse_size(const std::string& text, const std::string& flag) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) i++;
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  for (const auto& [names, bits] : std::initializer_list<std::pair<std::vector<std::string>, int>>{
           {{"", "B"}, 0}, {{"K", "KB", "KIB"}, 10}, {{"M", "MB", "MIB"}, 20}, {{"G", "GB", "GIB"}, 30}, {{"T", "TB", "TIB"}, 40}})
    if (std::find(names.begin(), names.end(), unit) != names.end()) shift = bits;
  const bool digits = i > 0 && i <= 13;
  const double value = digits ? std::stod(text.substr(0, i)) * static_cast<double>(int64_t{1} << std::max(shift, 0)) : 0;
  if (!digits || shift < 0 || value < 1)
    throw Error(flag + ": '" + text + "' is not a size; write sizes like 8B, 64K, 1G (K, M, G are 1024, 1024^2, 1024^3)");
  if (value > static_cast<double>(kMaxSweepBytes)) throw Error(flag + ": '" + text + "' is larger than 1 TiB; sweep smaller sizes");
  return static_cast<int64_t>(value);
}

std::pair<int64_t, int64_t> parse_size_range(const std::string& text) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || text.find(':', colon + 1) != std::string::npos)
    throw Error("--sweep " + text + " is not a size range; write MIN:MAX, e.g. --sweep 8B:1G");
  const int64_t lo = parse_size(text.substr(0, colon), "--sweep " + text);
  const int64_t hi = parse_size(text.substr(colon + 1), "--sweep " + text);
  if (lo > hi) throw Error("--sweep " + text + " starts above where it ends; write the smaller size first");
  return {lo, hi};
}

int run_sweep(const BenchArgs& a, Streams& io) {
  const CollectiveOp op = parse_bench_op(a.op);
  const auto [lo, hi] = parse_size_range(a.sweep);
  const int64_t measured_max = parse_size(a.measured_max, "--measured-max");
  HardwareProfile profile = find_profile(a.profile.empty() ? "nvlink8" : a.profile);
  const int profile_world = profile.gpus_per_node * profile.nodes;
  const int n = a.world_given ? a.world : profile_world <= kMaxDefaultWorld ? profile_world : 4;
  if (a.root >= n) throw Error("--root " + std::to_string(a.root) + " is out of range for --world " + std::to_string(n));
  Sweep s{a, io, op, n, profile, parse_protocol_choice(a.proto), sweep_algorithms(a, op)};
  if (s.algos.size() == 1) check_forced_choice(profile, op, s.algos[0], s.proto);
  const int nodes = (n + profile.gpus_per_node - 1) / profile.gpus_per_node;
  if (a.csv) io.out << "section,algorithm,size,count,type,redop,root,proto,time_us,algbw_gbps,busbw_gbps,wrong\n";
  else
    io.out << "# dtlab-cli bench collectives --sweep " << format_bytes(static_cast<double>(lo)) << " to "
           << format_bytes(static_cast<double>(hi)) << ": " << a.op << ", " << n << " ranks; busbw = algbw * "
           << s.traits().busbw_formula()
           << (s.traits().op == CollectiveOp::AllReduce ? " (nvls too, as all_reduce_perf prints it: it can pass the ring's bound)" : "")
           << " (nccl-tests)\n# modeled for " << profile.name << " (" << profile.description
           << "; " << n << " ranks over " << nodes << (nodes == 1 ? " node" : " nodes") << "), measured up to "
           << format_bytes(static_cast<double>(std::min(hi, measured_max))) << " (--measured-max)\n";
  const std::vector<Algorithm> offered = model_tables(s, bench_sizes(op, n, lo, hi));
  int64_t wrong = 0;
  if (lo <= measured_max) measured_tables(s, offered, bench_sizes(op, n, lo, std::min(hi, measured_max)), wrong);
  if (!a.csv) io.out << "# Out of bounds values : " << wrong << (wrong ? " ERROR" : " OK") << "\n";
  return wrong ? 1 : 0;
}

}  // namespace dtlab::cli
