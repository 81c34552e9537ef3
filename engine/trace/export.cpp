// Chrome Trace Event JSON writer. Events are written one by one as text, so a trace of millions of
// events never exists as one JSON tree in memory; the file is written in ~1 MiB chunks through
// AtomicFile.
//
// Output order: by rank, then start time, then longer (outer) spans first. Viewers nest "X" events
// on one thread by containment; when a parent and child start at the same instant we write the
// parent first rather than rely on each viewer's tie-break. The recorder's own order is the other
// way round (a collective is recorded when it ends, after its steps).
#include "engine/trace/export.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <concepts>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>

#include "engine/core/check.h"
#include "engine/io/atomic_file.h"

namespace dtlab {
namespace {

using Sink = std::function<void(std::string_view)>;

constexpr int kComputeTid = 0;
constexpr int kCommTid = 1;
constexpr size_t kChunkBytes = size_t{1} << 20;

struct Span {
  double ts = 0, dur = 0;  // microseconds, the unit of the format
};

Span span_of(const Event& e, TraceClock clock) {
  if (clock == TraceClock::Wall)
    return {static_cast<double>(e.wall_begin_ns) / 1e3,
            static_cast<double>(std::max<int64_t>(0, e.wall_end_ns - e.wall_begin_ns)) / 1e3};
  return {e.model_begin * 1e6, std::max(0.0, e.model_end - e.model_begin) * 1e6};
}

// Tie-break for spans that start and end together: outer ones first.
int nest_depth(EventKind k) {
  switch (k) {
    case EventKind::Iteration:
    case EventKind::BucketAllReduce: return 0;  // outside the collective it labels
    case EventKind::PipelineAction: return 1;   // inside its iteration, around its layers' compute
    case EventKind::Compute:
    case EventKind::Collective: return 2;
    case EventKind::RingStep:
    case EventKind::Gate: return 3;
    default: return 4;  // instants and counters
  }
}

// torch.profiler prints c10::ScalarType names.
const char* pytorch_dtype(DType d) {
  switch (d) {
    case DType::F32: return "Float";
    case DType::BF16: return "BFloat16";
    case DType::F16: return "Half";
    case DType::F64: return "Double";
    default: return "Long";
  }
}

// Appends one JSON object straight to the output buffer. An nlohmann object per event made a
// 1M-event export take 5.6 s, mostly allocation; writing text directly takes 1.3 s, sort and
// fsync included. Keys and names come from our own tables; user text (the title) goes through nlohmann.
class JsonOut {
 public:
  explicit JsonOut(std::string& s) : s_(s) {}
  JsonOut& open(std::string_view key = {}) {
    if (!key.empty()) this->key(key);
    s_ += '{';
    first_[++depth_] = true;
    return *this;
  }
  JsonOut& close() {
    s_ += '}';
    --depth_;
    return *this;
  }
  JsonOut& field(std::string_view k, std::string_view v) {
    key(k);
    quoted(v);
    return *this;
  }
  template <std::integral T>
  JsonOut& field(std::string_view k, T v) {
    key(k);
    char buf[24];
    s_.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    return *this;
  }
  JsonOut& field(std::string_view k, double v) {
    key(k);
    char buf[32];  // shortest round-trip form; JSON has no NaN or infinity
    s_.append(buf, std::to_chars(buf, buf + sizeof buf, std::isfinite(v) ? v : 0.0).ptr);
    return *this;
  }

 private:
  void key(std::string_view k) {
    if (!first_[depth_]) s_ += ',';
    first_[depth_] = false;
    quoted(k);
    s_ += ':';
  }
  void quoted(std::string_view v) {
    s_ += '"';
    for (char c : v) {
      if (c == '"' || c == '\\') s_ += '\\';
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';  // never produced by our names; keep JSON valid
      s_ += c;
    }
    s_ += '"';
  }
  std::string& s_;
  std::array<bool, 4> first_{};
  int depth_ = 0;
};

JsonOut& span_head(JsonOut& j, std::string_view name, const char* cat, int pid, int tid, Span s) {
  return j.open().field("name", name).field("cat", cat).field("ph", "X").field("pid", pid).field("tid", tid)
      .field("ts", s.ts).field("dur", s.dur);
}

void compute_event(JsonOut& j, const Event& e, Span s) {
  std::string name = compute_kind_name(e.compute.kind);
  if (e.compute.layer >= 0) name += " " + std::to_string(e.compute.layer);
  span_head(j, name, "compute", e.rank, kComputeTid, s).open("args");
  if (e.compute.layer >= 0) j.field("layer", e.compute.layer);
  j.field("flops", e.compute.flops);
  if (e.compute.bytes > 0) j.field("bytes", e.compute.bytes);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

// A process group's collective (CollectiveInfo::group != 0) names its group as torch.profiler's
// record_param_comms does (torch/csrc/profiler/util.h: "Process Group Name", "Process Group Ranks",
// the global ranks written "[0, 1]"; docs/course_sources.md §6c). The world's collectives write none.
void group_args(JsonOut& j, int32_t group, const TraceExportOptions& opt) {
  if (group <= 0 || static_cast<size_t>(group - 1) >= opt.labels.size()) return;
  std::string name;
  std::vector<int> ranks;
  if (!parse_group_label(opt.labels[static_cast<size_t>(group - 1)], name, ranks)) return;
  std::string list = "[";
  for (size_t i = 0; i < ranks.size(); i++) list += (i ? ", " : "") + std::to_string(ranks[i]);
  j.field("Process Group Name", name).field("Process Group Ranks", list + "]");
}

void collective_event(JsonOut& j, const Event& e, Span s, const TraceExportOptions& opt) {
  const CollectiveInfo& c = e.coll;
  span_head(j, collective_name(c.op), "collective", e.rank, kCommTid, s).open("args");
  // The first five keys are torch.profiler's record_param_comms args, spelled as it spells them.
  j.field("Collective name", collective_name(c.op))
      .field("In msg nelems", c.in_count)
      .field("Out msg nelems", c.out_count)
      .field("Group size", c.group_size)
      .field("dtype", pytorch_dtype(c.dtype))
      .field("algorithm", algorithm_name(c.algo))
      .field("protocol", protocol_name(c.proto))
      .field("seq", c.seq)
      .field("bytes", c.bytes);
  if (collective_traits(c.op).reduces) j.field("reduce_op", reduce_op_name(c.reduce));
  // All-to-all: equal blocks or a size per pair (all_to_all_v), and the elements of the rank's own
  // block, copied locally and never sent (In msg nelems - kept nelems leave the rank).
  if (c.op == CollectiveOp::AllToAll) j.field("split", c.split_sizes ? "per pair" : "equal").field("kept nelems", c.kept_count);
  if (c.root >= 0) j.field("root", c.root);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  group_args(j, c.group, opt);
  j.close().close();
}

void ring_step_event(JsonOut& j, const Event& e, Span s, const TraceExportOptions& opt) {
  const RingStepInfo& st = e.step;
  std::string name = st.phase == RingPhase::None ? "step " : std::string(ring_phase_name(st.phase)) + " step ";
  name += std::to_string(st.step);
  span_head(j, name, "ring_step", e.rank, kCommTid, s)
      .open("args")
      .field("seq", st.seq)
      .field("step", st.step)
      .field("steps", st.steps)
      .field("chunk", st.chunk)
      .field("src", st.src)
      .field("dst", st.dst)
      .field("bytes", st.bytes)
      .field("phase", ring_phase_name(st.phase));
  group_args(j, st.group, opt);
  j.close().close();
}

void issue_event(JsonOut& j, const Event& e, Span s, const TraceExportOptions& opt) {
  std::string name = std::string("issue ") + collective_name(e.coll.op) + " #" + std::to_string(e.coll.seq);
  j.open().field("name", name).field("cat", "collective_issue").field("ph", "i").field("s", "t")
      .field("pid", e.rank).field("tid", kComputeTid).field("ts", s.ts)
      .open("args").field("seq", e.coll.seq).field("Collective name", collective_name(e.coll.op))
      .field("bytes", e.coll.bytes);
  group_args(j, e.coll.group, opt);
  j.close().close();
}

std::string_view label_of(const TraceExportOptions& opt, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= opt.labels.size()) return {};
  return opt.labels[static_cast<size_t>(id)];
}

// DDP's reducer: instants on the compute lane, and the bucket's all-reduce as a span on the comm
// lane around the collective it ran as.
void bucket_event(JsonOut& j, const Event& e, Span s, const TraceExportOptions& opt) {
  const BucketInfo& b = e.bucket;
  const std::string_view names = label_of(opt, b.label);
  std::string name;
  switch (e.kind) {
    case EventKind::BucketAssigned: name = "bucket " + std::to_string(b.bucket) + " assigned"; break;
    case EventKind::GradReady: name = "grad ready " + std::string(names); break;
    case EventKind::BucketReady: name = "bucket " + std::to_string(b.bucket) + " ready"; break;
    case EventKind::BucketLaunch: name = "launch bucket " + std::to_string(b.bucket); break;
    default: name = "DDP bucket " + std::to_string(b.bucket); break;
  }
  if (e.kind == EventKind::BucketAllReduce) {
    span_head(j, name, "ddp", e.rank, kCommTid, s);
  } else {
    j.open().field("name", name).field("cat", "ddp").field("ph", "i").field("s", "t")
        .field("pid", e.rank).field("tid", kComputeTid).field("ts", s.ts);
  }
  j.open("args").field("bucket", b.bucket).field("num_buckets", b.num_buckets).field("bytes", b.bytes);
  if (e.kind == EventKind::GradReady) j.field("param", b.param).field("name", names);
  else j.field("params", names).field("num_params", b.num_params);
  if (e.kind == EventKind::BucketLaunch || e.kind == EventKind::BucketAllReduce) j.field("seq", b.seq);
  j.field("generation", b.generation);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

// FSDP unit verbs as instants on the compute lane: "unshard unit 1" with the state after it.
void fsdp_event(JsonOut& j, const Event& e, Span s, const TraceExportOptions& opt) {
  const FsdpInfo& f = e.fsdp;
  std::string name = std::string(fsdp_verb_name(f.verb)) + " unit " + std::to_string(f.unit);
  j.open().field("name", name).field("cat", "fsdp").field("ph", "i").field("s", "t")
      .field("pid", e.rank).field("tid", kComputeTid).field("ts", s.ts);
  j.open("args").field("unit", f.unit).field("state", fsdp_state_name(f.state)).field("numel", f.numel)
      .field("chunk", f.chunk).field("shard_world", f.shard_world);
  if (f.verb == FsdpVerb::Layout) j.field("params", label_of(opt, f.label));
  if ((f.verb == FsdpVerb::Unshard || f.verb == FsdpVerb::ReduceGrad) && f.seq != UINT64_MAX) j.field("seq", f.seq);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

// The loss scaler's decision as an instant on the compute lane: "step skipped (inf/NaN)" or "loss scale".
void loss_scale_event(JsonOut& j, const Event& e, Span s) {
  const LossScaleInfo& l = e.scaler;
  j.open().field("name", l.skipped ? "step skipped (inf/NaN)" : "loss scale").field("cat", "amp").field("ph", "i")
      .field("s", "t").field("pid", e.rank).field("tid", kComputeTid).field("ts", s.ts);
  j.open("args").field("scale", static_cast<double>(l.scale)).field("next_scale", static_cast<double>(l.next_scale))
      .field("found_inf", static_cast<int>(l.found_inf)).field("skipped", static_cast<int>(l.skipped)).field("growth_tracker", l.growth_tracker);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

// --clip-grad-norm's step as an instant on the compute lane: "clip grad norm" with the norm and factor.
void grad_clip_event(JsonOut& j, const Event& e, Span s) {
  const GradClipInfo& c = e.clip;
  j.open().field("name", "clip grad norm").field("cat", "clip").field("ph", "i").field("s", "t").field("pid", e.rank)
      .field("tid", kComputeTid).field("ts", s.ts);
  j.open("args").field("total_norm", c.total_norm).field("max_norm", static_cast<double>(c.max_norm))
      .field("clip_coef", static_cast<double>(c.coef));
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

// A pipeline action as PyTorch prints it ("1F3", "0W2") on the compute lane, around its layers.
void pipeline_event(JsonOut& j, const Event& e, Span s) {
  const PipelineActionInfo& p = e.pipe;
  span_head(j, action_str(Action{p.stage, p.type, p.mb}), "pipeline", e.rank, kComputeTid, s)
      .open("args")
      .field("stage", p.stage)
      .field("microbatch", p.mb)
      .field("step", p.step)
      .field("index", p.index)
      .field("stages", p.num_stages)
      .field("microbatches", p.microbatches)
      .field("replica", p.replica)
      .field("bytes", p.bytes);
  if (e.iteration >= 0) j.field("iteration", e.iteration);
  j.close().close();
}

void memory_event(JsonOut& j, const Event& e, Span s, const std::array<int64_t, kNumMemCategories>& current) {
  j.open().field("name", "memory").field("cat", "memory").field("ph", "C").field("pid", e.rank).field("ts", s.ts)
      .open("args");
  for (int c = 0; c < kNumMemCategories; ++c)
    j.field(mem_category_name(static_cast<MemCategory>(c)), current[static_cast<size_t>(c)]);
  j.close().close();
}

void metadata(JsonOut& j, const char* name, int pid, int tid, const char* arg, std::string_view text) {
  j.open().field("name", name).field("ph", "M").field("pid", pid).field("tid", tid)
      .open("args").field(arg, text).close().close();
}

void metadata(JsonOut& j, const char* name, int pid, int tid, const char* arg, int value) {
  j.open().field("name", name).field("ph", "M").field("pid", pid).field("tid", tid)
      .open("args").field(arg, value).close().close();
}

// Collects events into ~1 MiB chunks for the sink.
class ChunkWriter {
 public:
  explicit ChunkWriter(const Sink& sink) : sink_(sink) { buf_.reserve(kChunkBytes + 4096); }
  void raw(std::string_view s) { buf_ += s; }
  // Starts the next array element; write one object into the returned JsonOut, then call done().
  JsonOut next() {
    buf_ += first_ ? "\n" : ",\n";
    first_ = false;
    return JsonOut(buf_);
  }
  void done() {
    if (buf_.size() >= kChunkBytes) flush();
  }
  void flush() {
    if (!buf_.empty()) sink_(buf_);
    buf_.clear();
  }

 private:
  const Sink& sink_;
  std::string buf_;
  bool first_ = true;
};

void write_chrome_trace(const std::vector<Event>& events, const TraceExportOptions& opt, const Sink& sink) {
  const size_t n = events.size();
  std::vector<Span> spans(n);
  int max_rank = -1;
  for (size_t i = 0; i < n; ++i) {
    DTLAB_CHECK(events[i].rank >= 0, "trace event with a negative rank");
    spans[i] = span_of(events[i], opt.clock);
    max_rank = std::max(max_rank, events[i].rank);
  }

  // Memory counters: replay memory events in recording order, so each counter sample shows every
  // category as it stood right after that event, whatever order the samples are written in.
  std::vector<size_t> by_order(n);
  std::iota(by_order.begin(), by_order.end(), size_t{0});
  std::stable_sort(by_order.begin(), by_order.end(),
                   [&](size_t a, size_t b) { return events[a].order < events[b].order; });
  using Counters = std::array<int64_t, kNumMemCategories>;
  std::vector<Counters> rank_now(static_cast<size_t>(max_rank + 1), Counters{});
  std::vector<Counters> samples;
  std::vector<uint32_t> sample_of(n, 0);
  std::vector<bool> has_rank(static_cast<size_t>(max_rank + 1), false);
  for (size_t i : by_order) {
    const Event& e = events[i];
    has_rank[static_cast<size_t>(e.rank)] = true;
    if (e.kind != EventKind::MemAlloc && e.kind != EventKind::MemFree) continue;
    Counters& now = rank_now[static_cast<size_t>(e.rank)];
    now[static_cast<size_t>(e.mem.category)] = e.mem.current;
    sample_of[i] = static_cast<uint32_t>(samples.size());
    samples.push_back(now);
  }

  std::vector<size_t> out_order(n);
  std::iota(out_order.begin(), out_order.end(), size_t{0});
  std::sort(out_order.begin(), out_order.end(), [&](size_t a, size_t b) {
    const Event &ea = events[a], &eb = events[b];
    if (ea.rank != eb.rank) return ea.rank < eb.rank;
    if (spans[a].ts != spans[b].ts) return spans[a].ts < spans[b].ts;
    if (spans[a].dur != spans[b].dur) return spans[a].dur > spans[b].dur;
    if (nest_depth(ea.kind) != nest_depth(eb.kind)) return nest_depth(ea.kind) < nest_depth(eb.kind);
    if (ea.order != eb.order) return ea.order < eb.order;
    return a < b;
  });

  ChunkWriter w(sink);
  nlohmann::ordered_json other{{"clock", opt.clock == TraceClock::Wall ? "wall" : "modeled"}};
  if (!opt.title.empty()) other["title"] = opt.title;
  w.raw("{\"displayTimeUnit\":\"ms\",\"otherData\":");
  // Replace rather than throw on invalid UTF-8 in a user-typed title: the trace is still worth having.
  w.raw(other.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  w.raw(",\"traceEvents\":[");

  for (int r = 0; r <= max_rank; ++r) {
    if (!has_rank[static_cast<size_t>(r)]) continue;
    auto meta = [&](const char* name, int tid, const char* arg, auto value) {
      JsonOut j = w.next();
      metadata(j, name, r, tid, arg, value);
      w.done();
    };
    meta("process_name", 0, "name", "rank " + std::to_string(r));
    meta("process_sort_index", 0, "sort_index", r);
    meta("thread_name", kComputeTid, "name", std::string_view("compute"));
    meta("thread_sort_index", kComputeTid, "sort_index", kComputeTid);
    meta("thread_name", kCommTid, "name", std::string_view("comm"));
    meta("thread_sort_index", kCommTid, "sort_index", kCommTid);
  }

  for (size_t i : out_order) {
    const Event& e = events[i];
    const Span s = spans[i];
    JsonOut j = w.next();
    switch (e.kind) {
      case EventKind::Compute: compute_event(j, e, s); break;
      case EventKind::CollectiveIssue: issue_event(j, e, s, opt); break;
      case EventKind::Collective: collective_event(j, e, s, opt); break;
      case EventKind::RingStep: ring_step_event(j, e, s, opt); break;
      case EventKind::MemAlloc:
      case EventKind::MemFree: memory_event(j, e, s, samples[sample_of[i]]); break;
      case EventKind::Iteration:
        span_head(j, "iteration " + std::to_string(e.iteration), "iteration", e.rank, kComputeTid, s).close();
        break;
      case EventKind::Gate:
        span_head(j, "paused", "gate", e.rank, e.lane == Lane::Comm ? kCommTid : kComputeTid, s);
        if (e.iteration >= 0) j.open("args").field("iteration", e.iteration).close();
        j.close();
        break;
      case EventKind::BucketAssigned:
      case EventKind::GradReady:
      case EventKind::BucketReady:
      case EventKind::BucketLaunch:
      case EventKind::BucketAllReduce: bucket_event(j, e, s, opt); break;
      case EventKind::FsdpUnit: fsdp_event(j, e, s, opt); break;
      case EventKind::PipelineAction: pipeline_event(j, e, s); break;
      case EventKind::LossScale: loss_scale_event(j, e, s); break;
      case EventKind::GradClip: grad_clip_event(j, e, s); break;
    }
    w.done();
  }
  w.raw("\n]}\n");
  w.flush();
}

}  // namespace

std::string chrome_trace_json(const std::vector<Event>& events, const TraceExportOptions& opt) {
  std::string out;
  write_chrome_trace(events, opt, [&](std::string_view chunk) { out += chunk; });
  return out;
}

void export_chrome_trace(const std::string& path, const std::vector<Event>& events,
                         const TraceExportOptions& opt) {
  check_output_path("trace file", path);
  AtomicFile file(path);
  write_chrome_trace(events, opt, [&](std::string_view chunk) { file.write(chunk.data(), chunk.size()); });
  file.commit();
}

}  // namespace dtlab
