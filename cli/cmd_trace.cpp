// dtlab-cli trace summarize DIR|FILES: reads a multi-rank PyTorch profiler trace (engine/trace/
// trace_import.h) and prints what the lab's views show of it: the ranks and how their clocks were
// aligned, every collective across ranks (bytes, busy time, bandwidths, who arrived last and how
// late), DDP's buckets per iteration, the per-rank time breakdown, and, with --model (or a
// dtlab.json beside the traces), the same model run in dtlab under --profile beside it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/text_table.h"
#include "engine/comm/communicator.h"  // CommError
#include "engine/core/check.h"
#include "engine/core/collective.h"
#include "engine/core/format.h"
#include "engine/trace/cost_model.h"  // profile_names
#include "engine/train/trace_compare.h"

namespace dtlab::cli {

namespace {

// The name column left-aligned, the figures after it right-aligned.
const std::vector<bool> kNamesThenNumbers = [] {
  std::vector<bool> r(64, true);
  r[0] = false;
  return r;
}();

struct TraceArgs {
  std::vector<std::string> paths;
  std::vector<int> ranks;
  std::string model, profile = "this";
  int64_t batch = 0;
  bool all = false;
};

constexpr size_t kRowsShown = 24;  // collectives listed without --all

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Microseconds as nccl-tests and the profilers print them, or ms / s when large.
std::string us(double v) {
  const double a = std::fabs(v);
  if (a < 1000) return fmt(a < 10 ? "%.3f us" : "%.1f us", v);
  if (a < 1e6) return fmt("%.3f ms", v / 1e3);
  return fmt("%.3f s", v / 1e6);
}

std::string pct(double part, double whole) { return whole > 0 ? fmt("%.1f%%", 100 * part / whole) : "-"; }


int summarize(const TraceArgs& a, Streams& io) {
  TraceImportOptions opt;
  opt.ranks = a.ranks;
  if (io.terminal)
    opt.progress = [&](double f) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "\rreading traces: %3.0f%%", 100 * f);
      io.err << buf << std::flush;
    };
  const TraceMeta meta = read_trace_meta(a.paths);  // dtlab.json beside the traces: what ran
  const ImportedTrace tr = import_traces(a.paths, opt);
  if (io.terminal) io.err << "\r                      \r" << std::flush;
  // The comparison first: a bad model or dtlab.json is one sentence with nothing printed before it.
  TraceCompareOptions co = compare_options(meta);
  if (!a.model.empty()) co.model = a.model;
  if (a.batch > 0) co.batch = a.batch;
  co.profile = a.profile;
  std::optional<TraceComparison> cmp;
  if (!co.model.empty()) {
    // The model (and batch) dtlab.json gave, not a flag: a sentence about them names the file.
    const bool from_file = a.model.empty() && !meta.path.empty();
    try {
      cmp = compare_trace(tr, co);
    } catch (const CommError&) {
      throw;
    } catch (const Error& e) {
      if (!from_file) throw;
      throw Error(meta.path + " describes the traced model as " + co.model + ", which dtlab cannot train to compare: " + e.what() +
                  "; correct its \"model\", or give --model");
    }
  }
  std::ostream& out = io.out;
  const int world = static_cast<int>(tr.ranks.size());

  out << "dtlab trace: " << world << (world == 1 ? " rank" : " ranks") << ", " << trace_format_name(tr.format) << " format"
      << (tr.backend.empty() ? std::string() : ", backend " + tr.backend) << ", " << tr.iterations << (tr.iterations == 1 ? " iteration" : " iterations") << " (ProfilerStep#N), "
      << with_commas(tr.events) << " events, " << us(tr.duration_us) << " aligned\n";
  for (const RankTrace& r : tr.ranks) out << "  rank " << r.rank << ": " << r.file << "\n";

  out << "\nclock alignment: each rank's clock is mapped onto rank 0's, piecewise linearly between the ends of the\n"
         "collectives every rank took part in (the end of a collective is one moment on every rank); timestamp\n"
         "resolution "
      << us(tr.resolution_us) << "\n";
  std::vector<std::vector<std::string>> rows = {{"rank", "offset", "range over anchors", "anchors", "residual after"}};
  for (const RankTrace& r : tr.ranks) {
    const RankAlignment& al = r.alignment;
    if (r.rank == 0) {
      rows.push_back({"0", "reference", "-", std::to_string(al.anchors), "-"});
      continue;
    }
    rows.push_back({std::to_string(r.rank), fmt("%+.3f us", al.offset_us),
                    fmt("%+.3f", al.offset_min_us) + " .. " + fmt("%+.3f us", al.offset_max_us), std::to_string(al.anchors),
                    fmt("%.3f us", al.residual_max_us)});
  }
  print_table(out, rows, kNamesThenNumbers, "  ");

  const CollectiveTraits& all_reduce = collective_traits(CollectiveOp::AllReduce);
  out << "\ncollectives (matched across ranks; busy = end - last rank's start; bandwidths as nccl-tests: algbw = bytes / busy,\n"
         "busbw = algbw x "
      << (world > 1 ? std::string(all_reduce.busbw_formula()) + " for " + all_reduce.display_name : "1") << "):\n";
  // A straggler only when the last rank came later than the timestamps can tell apart.
  auto late = [&](const TraceCollective& c) { return world > 1 && c.last_arrival_us - c.first_arrival_us > tr.resolution_us; };
  rows = {{"#", "iter", "bucket", "op", "bytes", "busy", "algbw GB/s", "busbw GB/s", "last to arrive", "late by"}};
  const size_t shown = a.all ? tr.collectives.size() : std::min(tr.collectives.size(), kRowsShown);
  for (size_t i = 0; i < shown; i++) {
    const TraceCollective& c = tr.collectives[i];
    rows.push_back({std::to_string(i), c.iteration >= 0 ? std::to_string(c.iteration) : "-",
                    c.bucket >= 0 ? std::to_string(c.bucket) : "-", c.name,
                    c.bytes >= 0 ? with_commas(c.bytes) : "not recorded", us(c.busy_us),
                    c.algbw_gbs >= 0 ? fmt("%.3f", c.algbw_gbs) : "-", c.busbw_gbs >= 0 ? fmt("%.3f", c.busbw_gbs) : "-",
                    late(c) ? "rank " + std::to_string(c.last_rank) : "-",
                    late(c) ? us(c.last_arrival_us - c.first_arrival_us) : "together"});
  }
  if (tr.collectives.empty()) out << "  (none)\n";
  else print_table(out, rows, kNamesThenNumbers, "  ");
  if (shown < tr.collectives.size())
    out << "  ... " << with_commas(static_cast<int64_t>(tr.collectives.size() - shown)) << " more (--all lists every one)\n";

  const std::vector<int> per_iter = tr.buckets_per_iteration();
  if (!per_iter.empty()) {
    // Runs of equal counts: "2 in iterations 0-343" rather than 344 numbers.
    std::string list;
    for (size_t i = 0; i < per_iter.size();) {
      size_t j = i;
      while (j + 1 < per_iter.size() && per_iter[j + 1] == per_iter[i]) j++;
      list += (list.empty() ? "" : ", ") + std::to_string(per_iter[i]);
      if (j > i) list += " (iterations " + std::to_string(i) + "-" + std::to_string(j) + ")";
      else if (per_iter.size() > 1) list += " (iteration " + std::to_string(i) + ")";
      i = j + 1;
    }
    out << "\nDDP buckets (all-reduces per iteration, in launch order): " << list << "\n";
  }

  out << "\nbreakdown per rank (from its first to its last ProfilerStep; the columns sum to the wall time):\n";
  rows = {{"rank", "wall", "compute", "overlapped comm", "exposed comm", "copies", "idle", "arrived last"}};
  for (int r = 0; r < world; r++) {
    const RankBreakdown& b = tr.breakdown[static_cast<size_t>(r)];
    auto cell = [&](double v) { return us(v) + " (" + pct(v, b.wall_us) + ")"; };
    rows.push_back({std::to_string(r), us(b.wall_us), cell(b.compute_us), cell(b.overlapped_us), cell(b.exposed_comm_us),
                    cell(b.memcpy_us), cell(b.idle_us), std::to_string(b.straggled)});
  }
  print_table(out, rows, kNamesThenNumbers, "  ");

  if (cmp) {
    out << "\ncompare: " << co.model << " trained by dtlab (ddp, world " << world << ", batch " << co.batch << ", profile " << a.profile
        << "), buckets after the rebuild:\n";
    for (const std::string& b : cmp->dtlab_buckets) out << "  " << b << "\n";
    rows = {{"#", "iter", "bucket", "trace bytes", "dtlab bytes", "measured", "modeled", "measured / modeled"}};
    size_t listed = 0;
    for (const CompareRow& r : cmp->rows)
      if (a.all || listed++ < kRowsShown)
      rows.push_back({std::to_string(r.collective), std::to_string(r.iteration), std::to_string(r.bucket),
                      r.trace_bytes >= 0 ? with_commas(r.trace_bytes) : "not recorded",
                      r.dtlab_bytes >= 0 ? with_commas(r.dtlab_bytes) : "no such bucket", us(r.measured_us),
                      r.modeled_us >= 0 ? us(r.modeled_us) : "-", r.ratio >= 0 ? fmt("%.2fx", r.ratio) : "-"});
    print_table(out, rows, kNamesThenNumbers, "  ");
    out << "  " << cmp->summary << (cmp->sizes_agree ? "" : "; the recorded sizes differ from dtlab's buckets: is --model the traced model?")
        << "\n";
  }
  for (const std::string& w : tr.warnings) out << "note: " << w << "\n";
  return 0;
}

}  // namespace

Runner add_trace_command(CLI::App& app) {
  auto a = std::make_shared<TraceArgs>();
  app.require_subcommand(1);
  CLI::App* sum = app.add_subcommand("summarize", "Read a multi-rank PyTorch profiler trace (Kineto or legacy; plain or gzip) and print its collectives, alignment and breakdown");
  sum->add_option("paths", a->paths, "A directory of per-rank traces, or the files")->required();
  sum->add_option("--ranks", a->ranks, "Rank of each file, in order, for traces that record none (legacy), e.g. 0,1")->delimiter(',');
  sum->add_option("--model", a->model, "dtlab's spec of the traced model, to compare with a dtlab run (default: dtlab.json beside the traces)");
  sum->add_option("--profile", a->profile, "Hardware profile of the dtlab run compared with: " + join(profile_names(), ", "))->capture_default_str();
  sum->add_flag("--all", a->all, "List every collective (default: the first " + std::to_string(kRowsShown) + ")");
  sum->add_option("--batch", a->batch, "Per-rank batch of the compared dtlab run (default: dtlab.json's, else 32)")->check(whole_number(1, int64_t{1} << 20));
  return [a](Streams& io) { return summarize(*a, io); };
}

}  // namespace dtlab::cli
