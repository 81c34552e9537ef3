#include "app/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <tuple>

#include "app/snapshot_builder.h"
#include "app/timeline_index.h"
#include "app/views/views.h"
#include "cli/train_flags.h"
#include "engine/comm/plan.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/train/settings.h"

namespace dtlab::app {

namespace {

std::string link_name(const LinkLoad& l) {
  char buf[96];
  switch (l.kind) {
    case LinkKind::PortOut:
    case LinkKind::PortIn:
      std::snprintf(buf, sizeof buf, "rank %d port %s", l.index, l.kind == LinkKind::PortOut ? "out" : "in");
      break;
    case LinkKind::RailOut:
    case LinkKind::RailIn:
      std::snprintf(buf, sizeof buf, "node %d NIC %d %s", l.node, l.index, l.kind == LinkKind::RailOut ? "out" : "in");
      break;
    case LinkKind::Switch:
      if (l.node < 0) std::snprintf(buf, sizeof buf, "the network switch");
      else std::snprintf(buf, sizeof buf, "node %d's switch", l.node);
      break;
  }
  return buf;
}

// What one collective puts on each link, summed over its steps as the cost model charges them.
struct LinkTotal {
  LinkLoad link;  // kind, node, index (load and seconds unused)
  double bytes = 0, seconds = 0;
};
using LinkKey = std::tuple<int, int, int>;

void add_step(const CostModel& cost, const std::vector<std::pair<int, int>>& pairs, double bytes, std::map<LinkKey, LinkTotal>& out) {
  if (pairs.empty() || bytes <= 0) return;
  for (const LinkLoad& l : cost.link_loads(pairs, bytes)) {
    LinkTotal& t = out[{static_cast<int>(l.kind), l.node, l.index}];
    t.link = l;
    t.bytes += static_cast<double>(l.load) * bytes;
    t.seconds += l.seconds;
  }
}

void add_collective(const Snapshot& s, const CostModel& cost, int rank, const Event& e, std::map<LinkKey, LinkTotal>& out) {
  const CollectiveInfo& ci = e.coll;
  const int world = cost.world_size();
  if (ci.op == CollectiveOp::Send) {  // a pipeline's activation or gradient: rank -> peer
    if (ci.root >= 0 && ci.root < world && rank != ci.root) add_step(cost, {{rank, ci.root}}, static_cast<double>(ci.bytes), out);
    return;
  }
  CollectiveView cv;  // what modeled_step_bytes reads: the algorithm, the payload, the group
  cv.op = ci.op, cv.algo = ci.algo, cv.bytes = ci.bytes, cv.world = world, cv.root = ci.root;
  if (ci.group != 0) {
    const size_t label = static_cast<size_t>(ci.group - 1);
    std::string name;
    if (label >= s.labels.size() || !parse_group_label(s.labels[label], name, cv.members)) return;
    cv.world = static_cast<int>(cv.members.size());
  }
  const int n = cv.world, node_size = cost.profile().gpus_per_node;
  const int steps = algorithm_step_count(ci.op, ci.algo, n, node_size);
  for (int st = 0; st < steps; st++) {
    const std::vector<StepTransfer> plan = algorithm_step_plan(ci.op, ci.algo, n, ci.root, st, node_size);
    std::vector<std::pair<int, int>> pairs;
    for (const StepTransfer& x : plan) {
      auto global = [&](int r) { return r < 0 || cv.members.empty() ? r : cv.members[static_cast<size_t>(r)]; };
      if (x.src >= n || x.dst >= n) continue;
      pairs.emplace_back(global(x.src), global(x.dst));
    }
    add_step(cost, pairs, modeled_step_bytes(cv, cost, plan), out);
  }
}

std::string percent_change(double a, double b) {
  if (a <= 0 || b < 0) return "";
  const double pct = 100.0 * (b - a) / a;
  if (std::fabs(pct) < 0.5) return "same";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.0f%%", pct);
  return buf;
}

// +1 when B's value is the better one, -1 worse, 0 the same (within half a percent) or unknown.
int lower_is_better(double a, double b) {
  if (a <= 0 || b < 0 || std::fabs(b - a) < 0.005 * a) return 0;
  return b < a ? 1 : -1;
}

}  // namespace

RunSummary summarize_run(const Snapshot& s) {
  RunSummary r;
  if (s.events.empty()) return r;
  const std::vector<Event>& ev0 = s.events[0];
  const Event* it = nullptr;
  for (auto e = ev0.rbegin(); e != ev0.rend(); ++e)
    if (e->kind == EventKind::Iteration) {
      it = &*e;
      break;
    }
  if (!it) return r;
  r.valid = true;
  r.iteration = it->iteration;
  r.step_model_s = it->model_end - it->model_begin;
  r.step_wall_s = static_cast<double>(it->wall_end_ns - it->wall_begin_ns) * 1e-9;
  r.overlap = overlap_of(s, r.iteration);

  std::unique_ptr<CostModel> cost;
  if (s.topology.valid && s.topology.world == static_cast<int>(s.events.size()))
    cost = std::make_unique<CostModel>(s.topology.profile, s.topology.world);
  std::map<LinkKey, LinkTotal> links;
  std::map<std::pair<int32_t, uint64_t>, bool> seen;  // a world or group collective counts once
  for (size_t rank = 0; rank < s.events.size(); rank++) {
    int64_t peak = -1;
    for (const Event& e : s.events[rank]) {
      if (e.iteration != r.iteration) continue;
      if (e.kind == EventKind::MemAlloc) peak = std::max(peak, e.mem.total);
      if (e.kind != EventKind::Collective || e.coll.op == CollectiveOp::Recv) continue;
      if (e.coll.op != CollectiveOp::Send && !seen.emplace(std::make_pair(e.coll.group, e.coll.seq), true).second) continue;
      r.collectives++;
      r.collective_bytes += e.coll.bytes;
      if (cost) add_collective(s, *cost, static_cast<int>(rank), e, links);
    }
    // An iteration that allocated nothing new on this rank peaks at what the rank holds.
    if (peak < 0 && rank < s.memory.size()) peak = s.memory[rank].stats.total_current;
    if (peak > r.peak_bytes) r.peak_bytes = peak, r.peak_rank = static_cast<int>(rank);
  }
  const LinkTotal* slowest = nullptr;
  for (const auto& [key, t] : links)
    if (!slowest || t.seconds > slowest->seconds) slowest = &t;
  if (slowest) {
    r.slowest_link = link_name(slowest->link);
    r.slowest_link_bytes = slowest->bytes;
    r.slowest_link_s = slowest->seconds;
  }
  return r;
}

std::vector<DifferenceRow> difference_rows(const RunSummary& a, const RunSummary& b) {
  std::vector<DifferenceRow> rows;
  const bool both = a.valid && b.valid;
  auto value = [](const RunSummary& r, const std::string& text) { return r.valid ? text : std::string("not yet"); };
  // A row of a figure where less is better (times, bytes).
  auto less_better = [&](const char* what, double va, double vb, const std::string& ta, const std::string& tb, bool known) {
    DifferenceRow d{what, value(a, ta), value(b, tb), "", 0};
    if (both && known) d.change = percent_change(va, vb), d.better = lower_is_better(va, vb);
    rows.push_back(d);
  };
  less_better("step time (modeled)", a.step_model_s, b.step_model_s, time_text(a.step_model_s), time_text(b.step_model_s), true);
  {
    auto pct = [](double o) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%.0f%%", 100 * o);
      return o < 0 ? std::string("-") : std::string(buf);
    };
    DifferenceRow d{"all-reduce hidden", value(a, pct(a.overlap)), value(b, pct(b.overlap)), "", 0};
    if (both && a.overlap >= 0 && b.overlap >= 0) {
      const double pts = std::round(100 * (b.overlap - a.overlap));
      char buf[32];
      std::snprintf(buf, sizeof buf, "%+.0f pts", pts);
      d.change = pts == 0 ? "same" : buf;
      d.better = pts > 0 ? 1 : pts < 0 ? -1 : 0;
    }
    rows.push_back(d);
  }
  less_better("peak memory", static_cast<double>(a.peak_bytes), static_cast<double>(b.peak_bytes), human_bytes(a.peak_bytes),
              human_bytes(b.peak_bytes), true);
  const bool links = !a.slowest_link.empty() && !b.slowest_link.empty();
  auto or_dash = [](const RunSummary& r, const std::string& t) { return r.slowest_link.empty() ? std::string("-") : t; };
  rows.push_back({"slowest link", value(a, or_dash(a, a.slowest_link)), value(b, or_dash(b, b.slowest_link)),
                  both && links ? (a.slowest_link == b.slowest_link ? "same" : "another") : "", 0});
  auto bytes = [](double v) { return human_bytes(static_cast<int64_t>(std::llround(v))); };
  less_better("bytes on it", a.slowest_link_bytes, b.slowest_link_bytes, or_dash(a, bytes(a.slowest_link_bytes)),
              or_dash(b, bytes(b.slowest_link_bytes)), links);
  less_better("its busy time", a.slowest_link_s, b.slowest_link_s, or_dash(a, time_text(a.slowest_link_s)),
              or_dash(b, time_text(b.slowest_link_s)), links);
  return rows;
}

namespace {

// A number as a person writes it: "0.1" for the 0.09999942779541016 a MiB cap of 104857 bytes reads
// back as; any other text as it is.
std::string readable(const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size()) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

}  // namespace

std::vector<SettingDifference> setting_differences(const RunConfigView& a, const RunConfigView& b) {
  const TrainConfig defaults;
  auto value_of = [&](const std::vector<std::pair<std::string, std::string>>& rows, const std::string& flag) {
    for (const auto& [f, v] : rows)
      if (f == flag) return v;
    const Setting* s = find_setting(flag);
    return s ? setting_text(*s, defaults) : std::string("default");
  };
  std::vector<SettingDifference> out;
  std::vector<std::string> flags;
  for (const auto* rows : {&a.settings, &b.settings})
    for (const auto& [f, v] : *rows)
      if (std::find(flags.begin(), flags.end(), f) == flags.end()) flags.push_back(f);
  for (const std::string& f : flags) {
    const std::string va = value_of(a.settings, f), vb = value_of(b.settings, f);
    if (va != vb) out.push_back({f, readable(va), readable(vb)});
  }
  return out;
}

std::string side_caption(const std::vector<SettingDifference>& diff, bool a) {
  if (diff.empty()) return "the same settings";
  std::string out;
  for (const SettingDifference& d : diff) {
    if (!out.empty()) out += ' ';
    const std::string& v = a ? d.a : d.b;
    out += d.flag + (v.empty() ? std::string(" (off)") : " " + v);
  }
  return out;
}

void apply_compare_flags(TrainConfig& config, const std::vector<std::string>& words) {
  if (words.empty()) throw Error("compare needs the settings of run B, e.g. 'compare --bucket-cap-mb 25' or 'compare --algo dbtree'");
  CLI::App app{"compare", "compare"};
  cli::TrainFlags f;
  cli::add_train_flags(app, f, config, SettingScope::Both);
  std::vector<std::string> args(words.rbegin(), words.rend());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw Error("compare: " + cli::parse_error_sentence(e, "dtlab --help"));
  }
  cli::finish_train_flags(f, config);
}

}  // namespace dtlab::app
