// compare_trace (trace_compare.h): trains the traced model with dtlab's DDP on the threads backend
// for three iterations (iteration 0 uses torch's one bucket, then the buckets are rebuilt, as in the
// traced job), and pairs the last iteration's bucket all-reduces with the trace's, bucket by bucket.
#include "engine/train/trace_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/trace_input.h"
#include "engine/train/train.h"

namespace dtlab {

TraceMeta read_trace_meta(const std::vector<std::string>& paths) {
  TraceMeta m;
  if (paths.empty()) return m;
  check_trace_sidecar(paths);  // reachable, small, not nested past what the JSON walks below survive
  std::error_code ec;
  const std::filesystem::path first(paths[0]);
  const std::filesystem::path p = (std::filesystem::is_directory(first, ec) ? first : first.parent_path()) / "dtlab.json";
  if (!std::filesystem::is_regular_file(p, ec)) return m;
  m.path = p.string();
  std::ifstream f(p, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error(m.path + " is not a JSON object; it describes the traced job, e.g. {\"model\": \"mlp:2,512,512,3\", \"batch\": 32}");
  auto wrong = [&](const char* key, const char* what) {
    return Error(m.path + ": \"" + key + "\" must be " + what + " (it is " + j[key].dump().substr(0, 40) + ")");
  };
  if (j.contains("model")) {
    if (!j["model"].is_string()) throw wrong("model", "a model spec like \"mlp:2,512,512,3\"");
    m.model = j["model"].get<std::string>();
  }
  if (j.contains("batch")) {
    if (!j["batch"].is_number_integer() || j["batch"].get<int64_t>() < 1 || j["batch"].get<int64_t>() > (int64_t{1} << 20))
      throw wrong("batch", "a whole number of samples per rank from 1");
    m.batch = j["batch"].get<int64_t>();
  }
  if (j.contains("world")) {
    if (!j["world"].is_number_integer() || j["world"].get<int64_t>() < 1 || j["world"].get<int64_t>() > 4096)
      throw wrong("world", "a whole number of ranks from 1");
    m.world = static_cast<int>(j["world"].get<int64_t>());
  }
  if (j.contains("bucket_cap_mb")) {
    if (!j["bucket_cap_mb"].is_number() || !(j["bucket_cap_mb"].get<double>() > 0) || j["bucket_cap_mb"].get<double>() > 1e6)
      throw wrong("bucket_cap_mb", "a positive number of MiB");
    m.bucket_cap_mb = j["bucket_cap_mb"].get<double>();
  }
  if (j.contains("first_bucket_mb")) {
    if (!j["first_bucket_mb"].is_number() || !(j["first_bucket_mb"].get<double>() > 0) || j["first_bucket_mb"].get<double>() > 1e6)
      throw wrong("first_bucket_mb", "a positive number of MiB");
    m.first_bucket_mb = j["first_bucket_mb"].get<double>();
  }
  return m;
}

TraceCompareOptions compare_options(const TraceMeta& meta) {
  TraceCompareOptions o;
  o.model = meta.model;
  o.batch = meta.batch;
  o.bucket_cap_mb = meta.bucket_cap_mb;
  o.first_bucket_mb = meta.first_bucket_mb;
  return o;
}

TraceComparison compare_trace(const ImportedTrace& trace, const TraceCompareOptions& opt) {
  if (opt.model.empty())
    throw Error("no model to compare with: give dtlab's spec of the traced model (e.g. --model mlp:2,512,512,3), "
                "or put it in the trace directory's dtlab.json.");
  find_profile(opt.profile);  // throws a sentence listing the profiles
  if (trace.iterations == 0)
    throw Error("the trace marks no iterations (no ProfilerStep#N spans), so its all-reduces cannot be paired "
                "with DDP's buckets; record it with torch.profiler's step() (or tools/record_torch_trace.py).");
  const int world = static_cast<int>(trace.ranks.size());
  TrainConfig c;
  c.strategy = Strategy::Ddp;  // a one-rank DDP job all-reduces its buckets too
  c.world_size = world;
  c.model = ModelSpec::parse(opt.model);
  c.batch = opt.batch;
  c.steps = 3;
  c.profile = opt.profile;
  c.seed = 0;
  c.ddp.bucket_cap_bytes = static_cast<int64_t>(std::llround(opt.bucket_cap_mb * 1024 * 1024));
  c.ddp.first_bucket_bytes =
      std::min(static_cast<int64_t>(std::llround(opt.first_bucket_mb * 1024 * 1024)), c.ddp.bucket_cap_bytes);
  Trainer t(c);
  t.run();
  const std::vector<Event> evs = t.recorder().events(0);
  int32_t last_iter = -1;
  for (const Event& e : evs)
    if (e.kind == EventKind::BucketAllReduce) last_iter = std::max(last_iter, e.iteration);

  TraceComparison out;
  out.model = opt.model;
  out.profile = opt.profile;
  out.world = world;
  struct Bucket { int64_t bytes; double modeled_us; };
  std::map<int, Bucket> buckets;
  for (const Event& e : evs) {
    if (e.kind != EventKind::BucketAllReduce || e.iteration != last_iter) continue;
    buckets[e.bucket.bucket] = {e.bucket.bytes, (e.model_end - e.model_begin) * 1e6};
    out.dtlab_buckets.push_back("bucket " + std::to_string(e.bucket.bucket) + ": " + t.recorder().label(e.bucket.label) +
                                " (" + human_bytes(e.bucket.bytes) + ")");
  }
  std::vector<double> ratios;
  for (size_t i = 0; i < trace.collectives.size(); i++) {
    const TraceCollective& tc = trace.collectives[i];
    if (tc.bucket < 0) continue;
    CompareRow row;
    row.collective = static_cast<int>(i);
    row.iteration = tc.iteration;
    row.bucket = tc.bucket;
    row.name = tc.name;
    row.trace_bytes = tc.bytes;
    row.measured_us = tc.busy_us;
    const auto it = buckets.find(tc.bucket);
    if (it != buckets.end()) {
      row.dtlab_bytes = it->second.bytes;
      row.modeled_us = it->second.modeled_us;
      if (row.modeled_us > 0) {
        row.ratio = row.measured_us / row.modeled_us;
        ratios.push_back(row.ratio);
      }
    }
    if (row.trace_bytes >= 0 && row.trace_bytes != row.dtlab_bytes) out.sizes_agree = false;
    out.rows.push_back(row);
  }
  char line[256];
  if (ratios.empty() && world == 1 && !out.rows.empty()) {
    std::snprintf(line, sizeof line, "one rank: its all-reduces move no data and dtlab models none of them; their sizes %s",
                  out.sizes_agree ? "equal dtlab's buckets" : "differ from dtlab's buckets");
  } else if (ratios.empty()) {
    std::snprintf(line, sizeof line, "no all-reduce of the trace pairs with one of dtlab's %zu buckets", buckets.size());
  } else {
    std::sort(ratios.begin(), ratios.end());
    const double median = ratios[ratios.size() / 2];
    std::snprintf(line, sizeof line, "measured / modeled (%s): median %.2fx over %zu all-reduces (%.2fx to %.2fx)",
                  opt.profile.c_str(), median, ratios.size(), ratios.front(), ratios.back());
  }
  out.summary = line;
  return out;
}

}  // namespace dtlab
