// Import of PyTorch profiler traces (trace_import.h). Three passes:
//  1. read: each file is streamed through zlib (gzread reads plain files as they are) into
//     nlohmann's SAX parser; only complete events ("ph": "X") and distributedInfo are kept, as
//     compact records, so no document tree of a 100 MB file is ever built;
//  2. classify: per rank, spans into compute / communication / copies / issue ops / annotations, and
//     the rank's collectives (issue op + communication span, with the sizes the format records);
//  3. align and analyse: the k-th world-wide collective of every rank is one collective; its end is
//     one moment on every rank, so each rank's clock is mapped onto rank 0's, piecewise linearly
//     between those ends (clock offset and drift); then arrivals, bandwidths, DDP buckets and the
//     per-rank time breakdown. Field names and their sources: docs/trace_formats.md.
#include "engine/trace/trace_import.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <unordered_map>

#include "engine/core/check.h"
#include "engine/core/collective.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"  // os_reason
#include "engine/trace/trace_input.h"

namespace dtlab {

const char* trace_format_name(TraceFormat f) {
  return f == TraceFormat::Kineto ? "kineto" : "legacy autograd profiler";
}

const char* span_class_name(SpanClass c) {
  switch (c) {
    case SpanClass::Compute: return "compute";
    case SpanClass::Comm: return "communication";
    case SpanClass::Memcpy: return "memory copy";
    case SpanClass::Issue: return "collective issue";
    case SpanClass::Annotation: return "annotation";
  }
  return "?";
}

double busbw_factor(const std::string& c, int n) {
  if (n <= 1) return 1;
  if (const std::optional<CollectiveOp> op = find_collective(c)) return bus_bandwidth_factor(*op, n);
  // c10d names with no dtlab op (all-to-all's other spellings, gather, scatter): nccl-tests' (n-1)/n.
  if (c == "alltoall" || c == "alltoall_base" || c == "gather" || c == "scatter")
    return static_cast<double>(n - 1) / n;
  return 1;  // send/recv and anything else
}

std::vector<int> ImportedTrace::buckets_per_iteration() const {
  std::vector<int> out(ranks.empty() ? 0 : ranks[0].steps.size(), 0);
  for (const TraceCollective& c : collectives)
    if (c.bucket >= 0 && c.iteration >= 0 && c.iteration < static_cast<int>(out.size())) out[static_cast<size_t>(c.iteration)]++;
  return out;
}

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// 1. reading

// One complete event as the file has it (strings interned later; names cut to kMaxTraceNameBytes).
struct RawEvent {
  std::string name, cat, pid, tid;
  double ts = 0, dur = 0;
  bool has_ts = false, has_dur = false;
  bool complete = false;  // "ph": "X"
  int64_t index = 0;      // 1-based, among the file's events (for messages)
  // args
  std::string coll_name, dtype, pg_ranks, pg_name;
  int64_t in_nelems = -1, out_nelems = -1, group_size = -1, seq = -1;
};

struct RawFile {
  std::string path;               // as given (for messages)
  std::string display;            // file name
  TraceFormat format = TraceFormat::Legacy;
  int64_t dist_rank = -1, dist_world = -1;
  std::string backend;
  std::vector<RawEvent> events;   // complete events only
  int64_t all_events = 0;
  bool fractional_ts = false;
};

// What a profiler can record, so that a corrupted number is refused rather than computed with.
// Timestamps are µs on the profiler's clock: time since the profiler started (legacy), since boot
// (Kineto's, ~5e12 after two months up) or Unix time (older Kineto: 1.7e15 in 2024). Unix time in µs
// reaches 3e15 in the year 2065, so nothing beyond it is a clock reading.
constexpr double kMaxTimestampUs = 3e15;
// A profiled region lasts seconds to hours; 1e12 µs is 11.6 days, so no span lasts longer and no
// file's events lie further apart.
constexpr double kMaxSpanUs = 1e12;
// A collective's message: 2^48 bytes (256 TiB, said so in check_event) is more than any job's whole memory.
constexpr int64_t kMaxCollectiveBytes = int64_t{1} << 48;

// c10d's element sizes; -1 for a dtype it does not name.
int64_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"Float", 4}, {"float", 4}, {"Double", 8}, {"double", 8}, {"Half", 2}, {"BFloat16", 2},
      {"Long", 8}, {"Int", 4}, {"Short", 2}, {"Char", 1}, {"Byte", 1}, {"Bool", 1},
      {"Float8_e4m3fn", 1}, {"Float8_e5m2", 1}, {"ComplexFloat", 8}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? -1 : it->second;
}

// nelems x element size, or -1 when either is unknown or the product overflows.
int64_t message_bytes(int64_t nelems, int64_t elem_size) {
  int64_t bytes = 0;
  if (nelems < 0 || elem_size < 0 || __builtin_mul_overflow(nelems, elem_size, &bytes)) return -1;
  return bytes;
}

// "event 12 (\"ncclDevKernel_AllReduce_Sum...\")" for messages.
std::string event_label(const RawEvent& e) {
  return "event " + std::to_string(e.index) + (e.name.empty() ? std::string() : " (\"" + bounded_name(e.name, 48) + "\")");
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Refuses a complete event's times and sizes beyond what a profiler records (the bounds above).
void check_event(const RawFile& f, const RawEvent& e) {
  auto refuse = [&](const char* field, const std::string& value, const std::string& why) {
    throw Error(f.display + ": " + event_label(e) + " has \"" + field + "\" " + value + ", " + why +
                ": the file is corrupted or was not written by a profiler; export the trace again.");
  };
  if (!std::isfinite(e.ts) || std::fabs(e.ts) > kMaxTimestampUs)
    refuse("ts", number_text(e.ts) + " us", "beyond any clock a profiler reads (at most 3e15 us, Unix time in the year 2065)");
  if (e.has_dur && (!std::isfinite(e.dur) || e.dur < 0 || e.dur > kMaxSpanUs))
    refuse("dur", number_text(e.dur) + " us",
           e.dur < 0 ? std::string("a negative duration") : "longer than any profiled region (at most 1e12 us, 11.6 days)");
  const int64_t es = std::max<int64_t>(dtype_bytes(e.dtype), 1);  // an unknown dtype's elements are at least a byte
  for (const auto& [field, n] : {std::pair<const char*, int64_t>{"In msg nelems", e.in_nelems}, {"Out msg nelems", e.out_nelems}}) {
    if (n < -1) refuse(field, std::to_string(n), "a negative element count");
    const int64_t bytes = message_bytes(n, es);
    if (n > 0 && (bytes < 0 || bytes > kMaxCollectiveBytes))
      refuse(field, std::to_string(n), std::string("more than 256 TiB") + (e.dtype.empty() ? "" : " of " + bounded_name(e.dtype, 24)) +
                                           " in one message, more than any job's memory");
  }
}

// After reading: a file whose events lie further apart than kMaxSpanUs holds a corrupted timestamp;
// the event furthest from the median is named.
void check_extent(const RawFile& f) {
  if (f.events.empty()) return;
  double lo = INFINITY, hi = -INFINITY;
  for (const RawEvent& e : f.events) {
    lo = std::min(lo, e.ts);
    hi = std::max(hi, e.ts + e.dur);
  }
  if (hi - lo <= kMaxSpanUs) return;
  std::vector<double> ts;
  ts.reserve(f.events.size());
  for (const RawEvent& e : f.events) ts.push_back(e.ts);
  std::nth_element(ts.begin(), ts.begin() + static_cast<std::ptrdiff_t>(ts.size() / 2), ts.end());
  const double median = ts[ts.size() / 2];
  const RawEvent* worst = &f.events[0];
  double far = -1;
  for (const RawEvent& e : f.events) {
    const double d = std::max(std::fabs(e.ts - median), std::fabs(e.ts + e.dur - median));
    if (d > far) far = d, worst = &e;
  }
  throw Error(f.display + ": " + event_label(*worst) + " has \"ts\" " + number_text(worst->ts) + " us and \"dur\" " +
              number_text(worst->dur) + " us, " + number_text(far / 1e6) + " s away from the file's other events (a profiler "
              "records at most 1e12 us, 11.6 days, in one file): the file is corrupted; export the trace again.");
}

// SAX handler: keeps complete events and distributedInfo, skips everything else; refuses JSON nested
// deeper than kMaxTraceJsonDepth and events with values no profiler records (check_event).
class TraceSax {
 public:
  explicit TraceSax(RawFile& f) : f_(f) {}
  enum class Role : uint8_t { RootObject, Events, Event, Args, Dist, Other };

  bool null() { return scalar_skip(); }
  bool boolean(bool) { return scalar_skip(); }
  bool number_integer(int64_t v) { return number(static_cast<double>(v), v, true); }
  bool number_unsigned(uint64_t v) {
    return number(static_cast<double>(v), v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v), true);
  }
  bool number_float(double v, const std::string&) { return number(v, saturate(v), false); }
  bool string(std::string& s) {
    if (stack_.empty()) root_scalar_ = true;
    else value(&s, 0, 0, false);
    return true;
  }
  bool binary(json::binary_t&) { return scalar_skip(); }
  bool key(std::string& k) {
    key_ = k;
    return true;
  }
  bool start_object(size_t) { return push(false); }
  bool end_object() {
    if (stack_.back() == Role::Event) commit();
    stack_.pop_back();
    return true;
  }
  bool start_array(size_t) { return push(true); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception&) {
    error_pos = static_cast<int64_t>(pos);
    return false;
  }

  bool saw_events = false, root_array = false, root_object = false, root_scalar_ = false, too_deep = false;
  int64_t error_pos = -1;  // nlohmann's: the count of characters read, the offending one included

 private:
  bool push(bool array) {
    if (stack_.size() >= static_cast<size_t>(kMaxTraceJsonDepth)) {
      too_deep = true;
      return false;
    }
    Role r = Role::Other;
    if (stack_.empty()) {
      root_array = array;
      root_object = !array;
      r = array ? Role::Events : Role::RootObject;
      if (array) f_.format = TraceFormat::Legacy;
    } else {
      const Role parent = stack_.back();
      if (parent == Role::RootObject && array && key_ == "traceEvents") {
        r = Role::Events;
        f_.format = TraceFormat::Kineto;
      } else if (parent == Role::RootObject && !array && key_ == "distributedInfo") {
        r = Role::Dist;
      } else if (parent == Role::Events && !array) {
        r = Role::Event;
        ev_ = RawEvent{};
        saw_events = true;
      } else if (parent == Role::Event && !array && key_ == "args") {
        r = Role::Args;
      }
    }
    stack_.push_back(r);
    key_.clear();
    return true;
  }
  bool scalar_skip() {
    if (stack_.empty()) root_scalar_ = true;
    return true;
  }
  bool number(double d, int64_t i, bool integral) {
    if (stack_.empty()) {
      root_scalar_ = true;
      return true;
    }
    value(nullptr, d, i, integral);
    return true;
  }
  // A kept string, cut to the bound (a 100 KB kernel name is drawn as its first 256 bytes).
  static std::string text(const std::string* s, int64_t i, size_t max = kMaxTraceNameBytes) {
    return s ? bounded_name(*s, max) : std::to_string(i);
  }
  // A scalar under key_ in the innermost container.
  void value(const std::string* s, double d, int64_t i, bool integral) {
    const Role r = stack_.back();
    if (r == Role::Event) {
      const std::string& k = key_;
      if (k == "name") { if (s) ev_.name = text(s, i); }
      else if (k == "cat") { if (s) ev_.cat = text(s, i); }
      else if (k == "ph") { ev_.complete = s && *s == "X"; }
      else if (k == "ts") {
        if (!s) { ev_.ts = d; ev_.has_ts = true; if (!integral && d != std::floor(d)) f_.fractional_ts = true; }
        else ev_.has_ts = parse_number(*s, ev_.ts);
      } else if (k == "dur") {
        if (!s) { ev_.dur = d; ev_.has_dur = true; }
        else ev_.has_dur = parse_number(*s, ev_.dur);
      } else if (k == "pid") { ev_.pid = text(s, i); }
      else if (k == "tid") { ev_.tid = text(s, i); }
    } else if (r == Role::Args) {
      const std::string& k = key_;
      if (k == "Collective name") { if (s) ev_.coll_name = text(s, i); }
      else if (k == "In msg nelems" || k == "In msg size") { ev_.in_nelems = s ? to_i64(*s) : i; }
      else if (k == "Out msg nelems" || k == "Out msg size") { ev_.out_nelems = s ? to_i64(*s) : i; }
      else if (k == "Group size") { ev_.group_size = s ? to_i64(*s) : i; }
      else if (k == "dtype") { if (s) ev_.dtype = text(s, i); }
      else if (k == "Process Group Ranks") { if (s) ev_.pg_ranks = text(s, i, kMaxTraceRankListBytes); }
      else if (k == "Process Group Name") { ev_.pg_name = text(s, i); }
      else if (k == "Seq" || k == "seq") { ev_.seq = s ? to_i64(*s) : i; }
    } else if (r == Role::Dist) {
      if (key_ == "rank") f_.dist_rank = s ? to_i64(*s) : i;
      else if (key_ == "world_size") f_.dist_world = s ? to_i64(*s) : i;
      else if (key_ == "backend" && s) f_.backend = text(s, i);
    }
  }
  // A JSON number as a whole number, without undefined behaviour for NaN, infinities or 1e300.
  static int64_t saturate(double v) {
    if (!(v == v)) return 0;
    if (v >= 9.2e18) return INT64_MAX;
    if (v <= -9.2e18) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
  static bool parse_number(const std::string& s, double& out) {
    char* end = nullptr;
    out = std::strtod(s.c_str(), &end);
    return end && end != s.c_str();
  }
  static int64_t to_i64(const std::string& s) {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);  // saturates at the int64 range
    return end && end != s.c_str() ? v : -1;
  }
  void commit() {
    f_.all_events++;
    if (ev_.complete && ev_.has_ts) {
      ev_.index = f_.all_events;
      check_event(f_, ev_);
      if (!ev_.has_dur) ev_.dur = 0;
      f_.events.push_back(std::move(ev_));
    }
    ev_ = RawEvent{};
  }

  RawFile& f_;
  std::vector<Role> stack_;
  std::string key_;
  RawEvent ev_;
};

// `end_bytes`: the input's size once it was read to its end, else -1 (a parse error before the end).
void parse_stream(std::istream& in, RawFile& f, const std::function<std::string()>& read_error,
                  const std::function<int64_t()>& end_bytes) {
  TraceSax sax(f);
  bool ok = false;
  try {
    ok = json::sax_parse(in, &sax, json::input_format_t::json, true);
  } catch (const std::bad_alloc&) {
    std::vector<RawEvent>().swap(f.events);
    throw Error(f.display + " holds more events than this machine's memory can keep (" + with_commas(f.all_events) +
                " read so far): open fewer ranks, or profile fewer steps (torch.profiler's schedule).");
  }
  const std::string zerr = read_error ? read_error() : "";
  if (!zerr.empty())
    throw Error(f.display + " could not be read to its end (" + zerr +
                "): it is a truncated or corrupted gzip file; copy or export it again.");
  if (sax.too_deep) throw Error(too_deep_sentence(f.display));
  if (!ok) {
    if (!sax.root_array && !sax.root_object)
      throw Error(f.display + " is not JSON: a PyTorch profiler trace is a JSON file written by "
                  "export_chrome_trace (optionally gzipped).");
    // nlohmann counts the end of input as one more character read: an error there is a cut file.
    const int64_t size = end_bytes ? end_bytes() : -1;
    if (size >= 0 && sax.error_pos > size)
      throw Error(f.display + " ends at byte " + std::to_string(size) + " before its JSON is complete: the file is "
                  "truncated (was the job still writing it?); export the trace again.");
    const int64_t at = std::max<int64_t>(sax.error_pos - 1, 0);
    throw Error(f.display + " breaks its JSON at byte " + std::to_string(at) + (size >= 0 ? " of " + std::to_string(size) : std::string()) +
                " (counted from 0): the bytes there are not JSON, so the file is corrupted, not cut short; export the trace again.");
  }
  if (sax.root_scalar_ || (!sax.root_array && !sax.root_object) || (sax.root_object && f.format != TraceFormat::Kineto))
    throw Error(f.display + " is JSON but not a PyTorch profiler trace: it has no \"traceEvents\" list "
                "(Kineto) and is not an event list (legacy profiler).");
  if (f.events.empty())
    throw Error(f.display + " has no complete events (\"ph\": \"X\"): it is not a profiler trace of a run, "
                "or the profiler recorded nothing (was the profiled region empty?).");
  check_extent(f);
}

// ---------------------------------------------------------------------------------------------
// 2. classification

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool contains_ci(const std::string& s, const char* needle) {
  const size_t n = std::strlen(needle);
  if (s.size() < n) return false;
  for (size_t i = 0; i + n <= s.size(); i++) {
    size_t j = 0;
    while (j < n && std::tolower(static_cast<unsigned char>(s[i + j])) == needle[j]) j++;
    if (j == n) return true;
  }
  return false;
}

// c10d's names for a collective, from the op and span names PyTorch records.
std::string c10d_name(std::string s) {
  if (starts_with(s, "c10d::")) s = s.substr(6);
  else if (starts_with(s, "gloo:")) s = s.substr(5);
  else if (starts_with(s, "nccl:")) s = s.substr(5);
  while (!s.empty() && s.back() == '_') s.pop_back();
  while (!s.empty() && s.front() == '_') s.erase(s.begin());
  static const std::map<std::string, std::string> alias = {
      {"all_reduce", "allreduce"}, {"allreduce", "allreduce"}, {"all_gather", "allgather"},
      {"allgather_base", "allgather"}, {"all_gather_into_tensor", "allgather"}, {"allgather", "allgather"},
      {"allgather_into_tensor_coalesced", "allgather"},
      {"reduce_scatter_base", "reduce_scatter"}, {"reduce_scatter_tensor", "reduce_scatter"},
      {"reduce_scatter", "reduce_scatter"}, {"broadcast", "broadcast"}, {"reduce", "reduce"},
      {"barrier", "barrier"}, {"alltoall_base", "all_to_all"}, {"alltoall", "all_to_all"},
      {"all_to_all", "all_to_all"}, {"gather", "gather"}, {"scatter", "scatter"}, {"send", "send"},
      {"recv", "recv"}, {"recv_any_source", "recv"}, {"allreduce_coalesced", "allreduce"}};
  const auto it = alias.find(s);
  return it == alias.end() ? s : it->second;
}

// From an NCCL kernel name ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)").
std::string nccl_kernel_collective(const std::string& k) {
  if (contains_ci(k, "allreduce")) return "allreduce";
  if (contains_ci(k, "allgather")) return "allgather";
  if (contains_ci(k, "reducescatter")) return "reduce_scatter";
  if (contains_ci(k, "broadcast")) return "broadcast";
  if (contains_ci(k, "sendrecv")) return "send/recv";
  if (contains_ci(k, "reduce")) return "reduce";
  return "nccl";
}

int64_t collective_bytes(const RankCollective& c) {
  const int64_t es = dtype_bytes(c.dtype);
  return message_bytes(c.name == "allgather" || c.name == "gather" ? c.out_nelems : c.in_nelems, es);
}

bool is_annotation(const RawEvent& e) {
  return starts_with(e.name, "ProfilerStep#") || e.cat == "user_annotation" || e.cat == "gpu_user_annotation" ||
         e.name == "DistributedDataParallel.forward" || starts_with(e.name, "Optimizer.") ||
         starts_with(e.name, "## ");
}

bool is_issue(const RawEvent& e) {
  return e.name == "record_param_comms" || starts_with(e.name, "c10d::") || starts_with(e.name, "nccl:");
}

struct Interner {
  std::vector<std::string>& names;
  std::unordered_map<std::string, int32_t> ids;
  int32_t operator()(const std::string& s) {
    const auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(names.size());
    names.push_back(s);
    ids.emplace(s, id);
    return id;
  }
};

// Per-thread nesting depth (spans sorted by begin, longer first).
void assign_depths(std::vector<TraceSpan>& spans) {
  std::map<int32_t, std::vector<double>> open;  // thread -> ends of open spans
  for (TraceSpan& s : spans) {
    std::vector<double>& st = open[s.thread];
    while (!st.empty() && st.back() <= s.raw_begin_us) st.pop_back();
    s.depth = static_cast<int16_t>(std::min<size_t>(st.size(), 32767));
    st.push_back(s.raw_begin_us + (s.end_us - s.begin_us));
  }
}

// An op that issued a collective: its span in the rank's spans and the event it came from.
struct Issue {
  size_t span;
  const RawEvent* e;
};

// "[0, 1]" (torch.profiler's "Process Group Ranks") as ranks; empty when it is not such a list.
std::vector<int> parse_rank_list(const std::string& text) {
  std::vector<int> ranks;
  int64_t v = -1;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      v = (v < 0 ? 0 : v) * 10 + (c - '0');
      if (v > INT32_MAX) return {};
    } else if (c == ',' || c == ']') {
      if (v < 0) return {};
      ranks.push_back(static_cast<int>(v));
      v = -1;
      if (c == ']') break;
    } else if (c != '[' && c != ' ') {
      return {};
    }
  }
  return ranks;
}

// What the op that issued a collective records of it: its name (where it has one), sizes, dtype,
// group size and sequence number.
void fill_from_issue(RankCollective& c, const RawEvent& e) {
  const std::string named = !e.coll_name.empty() ? c10d_name(e.coll_name) : c10d_name(e.name);
  if (!named.empty()) c.name = named;
  c.in_nelems = e.in_nelems;
  c.out_nelems = e.out_nelems;
  c.dtype = e.dtype;
  c.group_size = e.group_size < -1 || e.group_size > INT32_MAX ? INT32_MAX : static_cast<int>(e.group_size);
  c.seq = e.seq;
  c.group_name = e.pg_name;
  c.group_ranks = parse_rank_list(e.pg_ranks);
}

// The rank's collectives: the issue ops in order, each paired with the k-th communication span, with
// the sizes the issue op records.
void pair_collectives(RankTrace& r, const std::string& file, std::vector<Issue>& issues, std::vector<size_t>& comm_spans,
                      const std::vector<std::string>& names, std::vector<std::string>& warnings) {
  const int rank = r.rank;
  std::sort(issues.begin(), issues.end(),
            [&](const Issue& a, const Issue& b) { return r.spans[a.span].raw_begin_us < r.spans[b.span].raw_begin_us; });
  std::sort(comm_spans.begin(), comm_spans.end(),
            [&](size_t a, size_t b) { return r.spans[a].raw_begin_us < r.spans[b].raw_begin_us; });
  // record_param_comms also marks ops that move no data on the wire of their own ("wait", "init").
  issues.erase(std::remove_if(issues.begin(), issues.end(),
                              [](const Issue& i) {
                                const std::string n = i.e->coll_name.empty() ? c10d_name(i.e->name) : c10d_name(i.e->coll_name);
                                return n == "wait" || n == "init" || n == "monitored_barrier";
                              }),
               issues.end());
  if (comm_spans.empty() && !issues.empty()) {
    // Nothing ran on a communication lane: in a one-rank world NCCL launches no kernel (it copies
    // within the device, or does nothing in place). The collectives are still the job's: list them,
    // each timed by the op that issued it.
    warnings.push_back(fs::path(file).filename().string() + ": rank " + std::to_string(rank) + " issued " +
                       std::to_string(issues.size()) +
                       " collectives but none ran on its communication lane (as in a one-rank world); "
                       "each is timed by the op that issued it.");
    for (const Issue& is : issues) {
      const RawEvent& e = *is.e;
      TraceSpan& sp = r.spans[is.span];
      RankCollective c;
      fill_from_issue(c, e);
      c.issue_us = sp.raw_begin_us;
      c.begin_us = sp.raw_begin_us;
      c.end_us = sp.end_us;
      c.bytes = collective_bytes(c);
      c.span = static_cast<int>(is.span);
      c.issue_timed = true;
      sp.collective = static_cast<int32_t>(r.collectives.size());
      r.collectives.push_back(std::move(c));
    }
    return;
  }
  const size_t n = comm_spans.size();
  if (!issues.empty() && issues.size() != n)
    warnings.push_back(fs::path(file).filename().string() + ": rank " + std::to_string(rank) + " issued " +
                       std::to_string(issues.size()) + " collectives but " + std::to_string(n) +
                       " ran on its communication lane; paired them in order.");
  for (size_t k = 0; k < n; k++) {
    TraceSpan& cs = r.spans[comm_spans[k]];
    RankCollective c;
    const std::string& span_name = names[static_cast<size_t>(cs.name)];
    c.name = starts_with(span_name, "gloo:") ? c10d_name(span_name) : nccl_kernel_collective(span_name);
    if (k < issues.size()) {
      fill_from_issue(c, *issues[k].e);
      c.issue_us = r.spans[issues[k].span].raw_begin_us;
      r.spans[issues[k].span].collective = static_cast<int32_t>(r.collectives.size());
    }
    c.bytes = collective_bytes(c);
    c.begin_us = cs.raw_begin_us;
    c.end_us = cs.end_us;
    c.span = static_cast<int>(comm_spans[k]);
    cs.collective = static_cast<int32_t>(r.collectives.size());
    r.collectives.push_back(std::move(c));
  }
}

// Builds a rank's spans and collectives on its own (raw) clock; alignment comes later.
RankTrace classify(RawFile& f, int rank, Interner& intern, std::vector<std::string>& warnings) {
  RankTrace r;
  r.rank = rank;
  r.file = f.path;
  r.format = f.format;
  r.backend = f.backend;
  r.world_size = f.dist_world > 0 ? static_cast<int>(f.dist_world) : -1;  // assemble() checked it is the world
  const bool gpu = std::any_of(f.events.begin(), f.events.end(), [](const RawEvent& e) { return e.cat == "kernel"; });
  // Threads that run gloo's collectives (their other spans are gloo's, not compute).
  std::map<std::string, int32_t> thread_ids;
  auto thread_of = [&](const RawEvent& e) {
    const std::string key = e.pid + "\x1f" + e.tid;
    const auto it = thread_ids.find(key);
    if (it != thread_ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(r.threads.size());
    const bool device = e.cat == "kernel" || e.cat == "gpu_memcpy" || e.cat == "gpu_memset" || e.cat == "gpu_user_annotation";
    r.threads.push_back(device ? "GPU " + e.pid + " / stream " + e.tid : "pid " + e.pid + " / tid " + e.tid);
    thread_ids.emplace(key, id);
    return id;
  };
  // A gloo op is a span on gloo's worker thread; with CUDA tensors Kineto also projects it onto the
  // GPU stream as a gpu_user_annotation, which is a mark there, not a second collective.
  auto gloo_op = [](const RawEvent& e) { return starts_with(e.name, "gloo:") && e.cat != "gpu_user_annotation"; };
  std::map<int32_t, bool> comm_thread;
  for (const RawEvent& e : f.events)
    if (gloo_op(e)) comm_thread[thread_of(e)] = true;

  std::vector<Issue> param_comms, c10d_ops;
  std::vector<size_t> comm_spans;
  for (const RawEvent& e : f.events) {
    TraceSpan s;
    s.raw_begin_us = e.ts;
    s.begin_us = e.ts;
    s.end_us = e.ts + e.dur;
    s.thread = thread_of(e);
    if (starts_with(e.name, "ProfilerStep#")) {
      s.cls = SpanClass::Annotation;
      s.lane = TraceLane::Annotation;
      int n = -1;  // the step's number, where it fits an int ("ProfilerStep#99999999999" has none)
      const char* digits = e.name.c_str() + std::strlen("ProfilerStep#");
      std::from_chars(digits, e.name.c_str() + e.name.size(), n);
      if (e.cat != "gpu_user_annotation") r.steps.push_back({n, e.ts, e.ts + e.dur});
    } else if (e.cat == "kernel") {
      const bool nccl = contains_ci(e.name, "nccl");
      s.cls = nccl ? SpanClass::Comm : SpanClass::Compute;
      s.lane = nccl ? TraceLane::Comm : TraceLane::Compute;
    } else if (e.cat == "gpu_memcpy" || e.cat == "gpu_memset") {
      s.cls = SpanClass::Memcpy;
      s.lane = TraceLane::Memcpy;
    } else if (gloo_op(e)) {
      s.cls = SpanClass::Comm;
      s.lane = TraceLane::Comm;
    } else if (is_issue(e)) {
      s.cls = SpanClass::Issue;
      s.lane = TraceLane::Comm;
    } else if (is_annotation(e)) {
      s.cls = SpanClass::Annotation;
      s.lane = TraceLane::Annotation;
    } else if (gpu || e.cat == "python_function") {
      continue;  // host-side ops of a GPU run (the GPU's kernels are its compute); Python frames
    } else if (comm_thread.count(s.thread)) {
      continue;  // gloo's own bookkeeping on its worker thread
    } else {
      s.cls = SpanClass::Compute;
      s.lane = TraceLane::Compute;
    }
    s.name = intern(e.name);
    const size_t idx = r.spans.size();
    r.spans.push_back(s);
    if (s.cls == SpanClass::Comm) comm_spans.push_back(idx);
    if (e.name == "record_param_comms" && !e.coll_name.empty()) param_comms.push_back({idx, &e});
    else if (starts_with(e.name, "c10d::")) c10d_ops.push_back({idx, &e});
  }

  pair_collectives(r, f.path, param_comms.empty() ? c10d_ops : param_comms, comm_spans, intern.names, warnings);
  std::sort(r.spans.begin(), r.spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
    if (a.raw_begin_us != b.raw_begin_us) return a.raw_begin_us < b.raw_begin_us;
    return a.end_us - a.begin_us > b.end_us - b.begin_us;
  });
  for (size_t i = 0; i < r.spans.size(); i++)
    if (r.spans[i].collective >= 0 &&
        (r.spans[i].cls == SpanClass::Comm || r.collectives[static_cast<size_t>(r.spans[i].collective)].issue_timed))
      r.collectives[static_cast<size_t>(r.spans[i].collective)].span = static_cast<int>(i);
  assign_depths(r.spans);
  std::sort(r.steps.begin(), r.steps.end(), [](const RankTrace::Step& a, const RankTrace::Step& b) { return a.begin_us < b.begin_us; });
  return r;
}

// ---------------------------------------------------------------------------------------------
// 3. alignment and analysis

// Piecewise-linear map from a rank's raw clock to rank 0's, through (raw end, reference end) pairs.
struct ClockMap {
  std::vector<double> x, y;  // raw, reference (both increasing)
  double operator()(double t) const {
    if (x.empty()) return t;
    if (t <= x.front()) return t + (y.front() - x.front());
    if (t >= x.back()) return t + (y.back() - x.back());
    const size_t i = static_cast<size_t>(std::upper_bound(x.begin(), x.end(), t) - x.begin());
    const double f = (t - x[i - 1]) / (x[i] - x[i - 1]);
    const double off = (y[i - 1] - x[i - 1]) + f * ((y[i] - x[i]) - (y[i - 1] - x[i - 1]));
    return t + off;
  }
};

// Merged [begin, end] intervals of a rank's compute spans (aligned clock).
std::vector<std::pair<double, double>> compute_union(const RankTrace& r) {
  std::vector<std::pair<double, double>> v;
  for (const TraceSpan& s : r.spans)
    if (s.cls == SpanClass::Compute && s.end_us > s.begin_us) v.emplace_back(s.begin_us, s.end_us);
  return merge_intervals(std::move(v));
}

// Of [b, e], the time outside the merged intervals.
double uncovered(const std::vector<std::pair<double, double>>& merged, double b, double e) {
  double covered = 0;
  auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(b, -static_cast<double>(INFINITY)));
  if (it != merged.begin()) --it;
  for (; it != merged.end() && it->first < e; ++it) covered += std::max(0.0, std::min(e, it->second) - std::max(b, it->first));
  return std::max(0.0, (e - b) - covered);
}

// Lengths of a rank's time in each state over [b, e], from its spans on the aligned clock.
void breakdown_of(const RankTrace& r, RankBreakdown& out) {
  struct Edge { double t; int cls; int delta; };
  std::vector<Edge> edges;
  for (const TraceSpan& s : r.spans) {
    int cls = -1;
    if (s.cls == SpanClass::Compute) cls = 0;
    else if (s.cls == SpanClass::Comm) cls = 1;
    else if (s.cls == SpanClass::Memcpy) cls = 2;
    if (cls < 0) continue;
    const double b = std::max(s.begin_us, out.begin_us), e = std::min(s.end_us, out.end_us);
    if (e <= b) continue;
    edges.push_back({b, cls, +1});
    edges.push_back({e, cls, -1});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.t < b.t; });
  int active[3] = {0, 0, 0};
  double t = out.begin_us;
  auto account = [&](double until) {
    const double len = until - t;
    if (len <= 0) return;
    if (active[0] > 0 && active[1] > 0) out.overlapped_us += len;
    else if (active[0] > 0) out.compute_us += len;
    else if (active[1] > 0) out.exposed_comm_us += len;
    else if (active[2] > 0) out.memcpy_us += len;
    else out.idle_us += len;
  };
  for (const Edge& e : edges) {
    account(e.t);
    t = std::max(t, e.t);
    active[e.cls] += e.delta;
  }
  account(out.end_us);
  out.wall_us = out.end_us - out.begin_us;
}

// The world-wide collectives of each rank (sub-group ones are shown per rank, not matched), and how
// many of them every rank has.
struct Matching {
  std::vector<std::vector<int>> wide;  // per rank: indices into its collectives
  size_t common = 0;
  int world = 0;
};

// Pairs the k-th world-wide collective of every rank; one sentence when they disagree.
Matching match_collectives(ImportedTrace& tr) {
  Matching m;
  const int world = m.world = static_cast<int>(tr.ranks.size());
  m.wide.assign(static_cast<size_t>(world), {});
  auto& wide = m.wide;
  int subgroup = 0;
  for (int r = 0; r < world; r++) {
    const RankTrace& rt = tr.ranks[static_cast<size_t>(r)];
    for (size_t k = 0; k < rt.collectives.size(); k++) {
      const int g = rt.collectives[k].group_size;
      if (g < 0 || g == world) wide[static_cast<size_t>(r)].push_back(static_cast<int>(k));
      else subgroup++;
    }
  }
  if (subgroup > 0)
    tr.warnings.push_back(std::to_string(subgroup) + " collectives ran on process groups smaller than the world; "
                          "they are shown on their ranks' lanes but not matched across ranks.");
  size_t& common = m.common;
  common = wide.empty() ? 0 : wide[0].size();
  for (int r = 1; r < world; r++) {
    const size_t n = wide[static_cast<size_t>(r)].size();
    if (n != wide[0].size())
      tr.warnings.push_back("rank " + std::to_string(r) + " ran " + std::to_string(n) + " world-wide collectives and rank 0 ran " +
                            std::to_string(wide[0].size()) + ": the profilers covered different windows (or a rank hung); "
                            "matched the first " + std::to_string(std::min(n, common)) + ".");
    common = std::min(common, n);
  }
  for (size_t k = 0; k < common && world > 1; k++) {
    const RankCollective& c0 = tr.ranks[0].collectives[static_cast<size_t>(wide[0][k])];
    for (int r = 1; r < world; r++) {
      const RankCollective& c = tr.ranks[static_cast<size_t>(r)].collectives[static_cast<size_t>(wide[static_cast<size_t>(r)][k])];
      if (c.name != c0.name || (c.bytes >= 0 && c0.bytes >= 0 && c.bytes != c0.bytes))
        throw Error("collective " + std::to_string(k + 1) + " is " + c0.name +
                    (c0.bytes >= 0 ? " of " + human_bytes(c0.bytes) : std::string()) + " in " +
                    fs::path(tr.ranks[0].file).filename().string() + " but " + c.name +
                    (c.bytes >= 0 ? " of " + human_bytes(c.bytes) : std::string()) + " in " +
                    fs::path(tr.ranks[static_cast<size_t>(r)].file).filename().string() +
                    ": these files are not the ranks of one run, or their profilers started at different "
                    "iterations; open the traces of one run, recorded with the same schedule.");
    }
  }

  return m;
}

// Maps each rank's clock onto rank 0's. Collectives may end out of issue order (gloo runs two at once
// on its worker threads), so the pairs (this rank's end, rank 0's end) are sorted by rank 0's end and
// the longest run in which this rank's ends increase too is kept: a map through them is monotone.
void align_clocks(ImportedTrace& tr, const Matching& m) {
  const int world = m.world;
  for (int r = 0; r < world; r++) {
    RankTrace& rt = tr.ranks[static_cast<size_t>(r)];
    ClockMap map;
    if (r > 0) {
      std::vector<std::pair<double, double>> pairs;  // (y: rank 0's end, x: this rank's end)
      for (size_t k = 0; k < m.common; k++)
        pairs.emplace_back(tr.ranks[0].collectives[static_cast<size_t>(m.wide[0][k])].end_us,
                           rt.collectives[static_cast<size_t>(m.wide[static_cast<size_t>(r)][k])].end_us);
      // Longest chain strictly increasing in both, in O(n log n) (patience sorting): among equal
      // reference ends the larger own end comes first, so no two of them can both be in a chain.
      std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first < b.first : a.second > b.second;
      });
      const size_t n = pairs.size();
      std::vector<int> tails, prev(n, -1);  // tails[l]: index of the smallest end of a chain of length l+1
      for (size_t i = 0; i < n; i++) {
        const auto pos = std::lower_bound(tails.begin(), tails.end(), pairs[i].second,
                                          [&](int t, double x) { return pairs[static_cast<size_t>(t)].second < x; });
        if (pos != tails.begin()) prev[i] = *(pos - 1);
        if (pos == tails.end()) tails.push_back(static_cast<int>(i));
        else *pos = static_cast<int>(i);
      }
      const int best = tails.empty() ? -1 : tails.back();
      std::vector<double> offs;
      for (int i = best; i >= 0; i = prev[static_cast<size_t>(i)]) {
        map.x.push_back(pairs[static_cast<size_t>(i)].second);
        map.y.push_back(pairs[static_cast<size_t>(i)].first);
        offs.push_back(pairs[static_cast<size_t>(i)].first - pairs[static_cast<size_t>(i)].second);
      }
      std::reverse(map.x.begin(), map.x.end());
      std::reverse(map.y.begin(), map.y.end());
      RankAlignment& a = rt.alignment;
      a.anchors = static_cast<int>(offs.size());
      if (!offs.empty()) {
        double sum = 0;
        for (double o : offs) sum += o;
        a.offset_us = sum / static_cast<double>(offs.size());
        a.offset_min_us = *std::min_element(offs.begin(), offs.end());
        a.offset_max_us = *std::max_element(offs.begin(), offs.end());
      } else if (!rt.spans.empty() && !tr.ranks[0].spans.empty()) {
        // Nothing to align on: line up the first events.
        a.offset_us = a.offset_min_us = a.offset_max_us = tr.ranks[0].spans.front().raw_begin_us - rt.spans.front().raw_begin_us;
        map.x = {rt.spans.front().raw_begin_us};
        map.y = {tr.ranks[0].spans.front().raw_begin_us};
        tr.warnings.push_back("rank " + std::to_string(r) + " shares no collective with rank 0: its clock is lined up on its first event, not aligned.");
      }
    } else {
      rt.alignment.anchors = static_cast<int>(m.common);
    }
    for (TraceSpan& s : rt.spans) {
      const double dur = s.end_us - s.begin_us;
      s.begin_us = map(s.raw_begin_us);
      s.end_us = map(s.raw_begin_us + dur);
      if (s.end_us < s.begin_us) s.end_us = s.begin_us;
    }
    for (RankCollective& c : rt.collectives) {
      c.begin_us = map(c.begin_us);
      c.end_us = map(c.end_us);
    }
    for (RankTrace::Step& st : rt.steps) {
      st.begin_us = map(st.begin_us);
      st.end_us = map(st.end_us);
    }
  }
}

// Issue times from the aligned issue spans, then every time shifted so the earliest event is 0.
void zero_clock(ImportedTrace& tr) {
  // Issue times from the (aligned) issue spans; NaN until the clock is zeroed, then -1 for none.
  for (RankTrace& rt : tr.ranks)
    for (RankCollective& c : rt.collectives) c.issue_us = NAN;
  for (RankTrace& rt : tr.ranks)
    for (const TraceSpan& s : rt.spans)
      if (s.cls == SpanClass::Issue && s.collective >= 0) rt.collectives[static_cast<size_t>(s.collective)].issue_us = s.begin_us;

  // Zero the clock at the earliest event.
  double t0 = INFINITY, t1 = -INFINITY;
  for (const RankTrace& rt : tr.ranks)
    for (const TraceSpan& s : rt.spans) {
      t0 = std::min(t0, s.begin_us);
      t1 = std::max(t1, s.end_us);
    }
  if (!std::isfinite(t0)) t0 = t1 = 0;
  for (RankTrace& rt : tr.ranks) {
    rt.first_us = INFINITY;
    rt.last_us = -INFINITY;
    for (TraceSpan& s : rt.spans) {
      s.begin_us -= t0;
      s.end_us -= t0;
      rt.first_us = std::min(rt.first_us, s.begin_us);
      rt.last_us = std::max(rt.last_us, s.end_us);
    }
    for (RankCollective& c : rt.collectives) {
      c.issue_us = std::isnan(c.issue_us) ? -1 : c.issue_us - t0;
      c.begin_us -= t0;
      c.end_us -= t0;
    }
    for (RankTrace::Step& st : rt.steps) {
      st.begin_us -= t0;
      st.end_us -= t0;
    }
  }
  tr.duration_us = t1 - t0;

}

// Each collective's iteration: the step its issue (else its begin) falls in.
void assign_iterations(ImportedTrace& tr) {
  for (RankTrace& rt : tr.ranks)
    for (RankCollective& c : rt.collectives) {
      const double at = c.issue_us >= 0 ? c.issue_us : c.begin_us;
      // The last step beginning at or before it (steps are in time order and do not overlap).
      const auto it = std::upper_bound(rt.steps.begin(), rt.steps.end(), at,
                                       [](double t, const RankTrace::Step& st) { return t < st.begin_us; });
      if (it != rt.steps.begin() && at <= (it - 1)->end_us) c.iteration = static_cast<int>(it - 1 - rt.steps.begin());
    }

}

// One TraceCollective per matched k: arrivals, busy time, bandwidths, DDP's bucket number.
void build_collectives(ImportedTrace& tr, const Matching& m) {
  const int world = m.world;
  std::map<int, int> buckets_in;  // iteration -> all-reduces so far
  for (size_t k = 0; k < m.common; k++) {
    TraceCollective tc;
    const RankCollective& c0 = tr.ranks[0].collectives[static_cast<size_t>(m.wide[0][k])];
    tc.name = c0.name;
    tc.bytes = c0.bytes;
    tc.dtype = c0.dtype;
    tc.iteration = c0.iteration;
    tc.first_arrival_us = INFINITY;
    tc.last_arrival_us = -INFINITY;
    double last_begin = -INFINITY;
    bool moved = true;  // every rank's part ran on its communication lane (none is issue-timed)
    tc.end_us = -INFINITY;
    for (int r = 0; r < world; r++) {
      const int idx = m.wide[static_cast<size_t>(r)][k];
      tc.rank_index.push_back(idx);
      const RankCollective& c = tr.ranks[static_cast<size_t>(r)].collectives[static_cast<size_t>(idx)];
      const double arrival = c.issue_us >= 0 ? c.issue_us : c.begin_us;
      tc.first_arrival_us = std::min(tc.first_arrival_us, arrival);
      if (arrival > tc.last_arrival_us) {
        tc.last_arrival_us = arrival;
        tc.last_rank = r;
      }
      last_begin = std::max(last_begin, c.begin_us);
      tc.end_us = std::max(tc.end_us, c.end_us);
      moved = moved && !c.issue_timed;
    }
    tc.busy_us = std::max(0.0, tc.end_us - last_begin);
    // An issue-timed collective's span is the host's call, not data on a wire: no bandwidth.
    if (moved && tc.bytes >= 0 && tc.busy_us > 0) {
      tc.algbw_gbs = static_cast<double>(tc.bytes) / (tc.busy_us * 1e3);
      tc.busbw_gbs = tc.algbw_gbs * busbw_factor(tc.name, world);
    }
    if (tc.name == "allreduce" && tc.iteration >= 0) tc.bucket = buckets_in[tc.iteration]++;
    tr.collectives.push_back(std::move(tc));
  }

}

// Per rank: the breakdown of its profiled steps, each collective's exposed time, its straggles.
void build_breakdowns(ImportedTrace& tr, const Matching& m) {
  const int world = m.world;
  tr.breakdown.assign(static_cast<size_t>(world), RankBreakdown{});
  for (int r = 0; r < world; r++) {
    const RankTrace& rt = tr.ranks[static_cast<size_t>(r)];
    RankBreakdown& b = tr.breakdown[static_cast<size_t>(r)];
    if (!rt.steps.empty()) {
      b.begin_us = rt.steps.front().begin_us;
      b.end_us = rt.steps.back().end_us;
      for (const RankTrace::Step& st : rt.steps) b.end_us = std::max(b.end_us, st.end_us);
    } else {
      b.begin_us = rt.first_us;
      b.end_us = rt.last_us;
    }
    breakdown_of(rt, b);
  }
  for (RankTrace& rt : tr.ranks) {
    const auto merged = compute_union(rt);
    for (RankCollective& c : rt.collectives) c.exposed_us = uncovered(merged, c.begin_us, c.end_us);
  }
  if (world > 1)
    for (const TraceCollective& c : tr.collectives)
      if (c.last_rank >= 0 && c.last_arrival_us - c.first_arrival_us > tr.resolution_us)
        tr.breakdown[static_cast<size_t>(c.last_rank)].straggled++;

}

// How far each rank's ends still are from rank 0's after alignment; a warning for dropped anchors.
void report_residuals(ImportedTrace& tr, const Matching& m) {
  const int world = m.world;
  for (int r = 1; r < world; r++) {
    double worst = 0;
    for (size_t k = 0; k < m.common; k++) {
      const double e0 = tr.ranks[0].collectives[static_cast<size_t>(m.wide[0][k])].end_us;
      const double er = tr.ranks[static_cast<size_t>(r)].collectives[static_cast<size_t>(m.wide[static_cast<size_t>(r)][k])].end_us;
      worst = std::max(worst, std::fabs(er - e0));
    }
    RankAlignment& al = tr.ranks[static_cast<size_t>(r)].alignment;
    al.residual_max_us = worst;
    if (al.anchors < static_cast<int>(m.common))
      tr.warnings.push_back("rank " + std::to_string(r) + ": " + std::to_string(static_cast<int>(m.common) - al.anchors) + " of " +
                            std::to_string(m.common) + " collectives ended in a different order than on rank 0, so they "
                            "could not anchor its clock; their ends still differ by up to " +
                            std::to_string(static_cast<int64_t>(std::llround(worst))) + " us after alignment.");
  }
}

void analyse(ImportedTrace& tr) {
  const Matching m = match_collectives(tr);
  align_clocks(tr, m);
  zero_clock(tr);
  assign_iterations(tr);
  build_collectives(tr, m);
  build_breakdowns(tr, m);
  report_residuals(tr, m);
  tr.iterations = tr.ranks.empty() ? 0 : static_cast<int>(tr.ranks[0].steps.size());
}

// A file's rank as it was given (the explicit list, distributedInfo, or its name), with the text
// that names it: a name's digits parse into an int64 that saturates, so "rank99999999999" is a rank
// too large for any job, said as written, not an exception.
struct GivenRank {
  int64_t value = -1;  // -1: none
  std::string text;
};

GivenRank rank_from_name(const std::string& path) {
  static const std::regex re("rank[_\\-]?([0-9]+)", std::regex::icase);
  std::smatch m;
  const std::string name = fs::path(path).filename().string();
  if (!std::regex_search(name, m, re)) return {};
  const std::string digits = m[1].str();
  GivenRank g{0, bounded_name(digits, 24)};
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), g.value);
  if (ec == std::errc::result_out_of_range) g.value = INT64_MAX;
  return g;
}

// "rank 3 is missing" / "ranks 3, 5 and 9 are missing" / "ranks 3, 5, 7, 9 and 120 more are missing".
std::string missing_ranks(const std::vector<char>& present) {
  std::vector<int> missing;
  for (size_t r = 0; r < present.size(); r++)
    if (!present[r]) missing.push_back(static_cast<int>(r));
  constexpr size_t kNamed = 4;
  std::string s = missing.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < missing.size() && i < kNamed; i++)
    s += (i == 0 ? "" : i + 1 == missing.size() ? " and " : ", ") + std::to_string(missing[i]);
  if (missing.size() > kNamed) s += " and " + with_commas(static_cast<int64_t>(missing.size() - kNamed)) + " more";
  return s + (missing.size() == 1 ? " is missing" : " are missing");
}

// The given ranks, sorted, with runs shortened ("0-1233, 1235-2999, 99999999999"), at most a few items.
std::string rank_list(std::vector<GivenRank> ranks) {
  std::sort(ranks.begin(), ranks.end(), [](const GivenRank& a, const GivenRank& b) { return a.value < b.value; });
  constexpr int kItems = 8;
  std::string s;
  int items = 0;
  size_t i = 0;
  for (; i < ranks.size() && items < kItems; items++) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j].value < INT64_MAX && ranks[j + 1].value == ranks[j].value + 1) j++;
    s += (s.empty() ? "" : ", ") + ranks[i].text;
    if (j >= i + 2) s += "-" + ranks[j].text;
    else if (j == i + 1) s += ", " + ranks[j].text;
    i = j + 1;
  }
  if (i < ranks.size()) s += " and " + with_commas(static_cast<int64_t>(ranks.size() - i)) + " more";
  return s;
}

ImportedTrace assemble(std::vector<RawFile>& files, const TraceImportOptions& opt) {
  if (!opt.ranks.empty() && opt.ranks.size() != files.size())
    throw Error(std::to_string(opt.ranks.size()) + " ranks were given for " + std::to_string(files.size()) +
                " trace files: give one rank per file, in the files' order.");
  ImportedTrace tr;
  std::vector<GivenRank> given(files.size());
  for (size_t i = 0; i < files.size(); i++) {
    RawFile& f = files[i];
    if (!opt.ranks.empty()) given[i] = {opt.ranks[i], std::to_string(opt.ranks[i])};
    else if (f.dist_rank >= 0) given[i] = {f.dist_rank, std::to_string(f.dist_rank) + (f.dist_rank == INT64_MAX ? " or more" : "")};
    else if (f.dist_rank < -1) throw Error(f.display + "'s distributedInfo says rank " + std::to_string(f.dist_rank) + "; ranks count from 0, so the file is corrupted.");
    else given[i] = rank_from_name(f.path);
    if (given[i].value < 0)
      throw Error(f.display + " records no rank (the legacy profiler does not, and it has no distributedInfo) "
                  "and its name has none: name the files rank0.json, rank1.json, ... or give the ranks in "
                  "order (dtlab-cli trace summarize --ranks 0,1,...; the lab's --trace-ranks).");
  }
  const int world = static_cast<int>(files.size());
  if (std::any_of(given.begin(), given.end(), [&](const GivenRank& g) { return g.value >= world; })) {
    // Some rank is then missing (n files, fewer than n ranks below n): say which first, so that among
    // 3,000 files the sentence still names it.
    std::vector<char> present(files.size(), 0);
    for (const GivenRank& g : given)
      if (g.value < world) present[static_cast<size_t>(g.value)] = 1;
    throw Error(missing_ranks(present) + ": the traces are of ranks " + rank_list(given) + ", but " + with_commas(world) +
                (world == 1 ? " file makes rank 0" : " files make ranks 0 to " + std::to_string(world - 1)) +
                "; open every rank's trace of the run (one file per rank).");
  }
  std::vector<int> seen(files.size(), -1);
  for (size_t i = 0; i < files.size(); i++) {
    const int r = static_cast<int>(given[i].value);
    if (seen[static_cast<size_t>(r)] >= 0)
      throw Error(files[i].display + " and " + files[static_cast<size_t>(seen[static_cast<size_t>(r)])].display +
                  " are both rank " + std::to_string(r) + ": open one trace per rank.");
    seen[static_cast<size_t>(r)] = static_cast<int>(i);
    if (files[i].dist_world > 0 && files[i].dist_world != world)
      throw Error(files[i].display + " says the job had world_size " + std::to_string(files[i].dist_world) + ", but " +
                  std::to_string(world) + " trace files were given: open every rank's trace of the run.");
  }
  Interner intern{tr.names, {}};
  tr.ranks.resize(files.size());
  tr.format = files.empty() ? TraceFormat::Legacy : files[0].format;
  double res = 1;
  for (size_t r = 0; r < files.size(); r++) {
    RawFile& f = files[static_cast<size_t>(seen[r])];
    if (f.format != tr.format)
      tr.warnings.push_back("the files mix the Kineto and legacy formats; read each as it is.");
    tr.events += f.all_events;
    if (f.fractional_ts) res = 0.001;
    tr.ranks[r] = classify(f, static_cast<int>(r), intern, tr.warnings);
    if (tr.backend.empty()) tr.backend = f.backend;
    std::vector<RawEvent>().swap(f.events);
  }
  if (tr.backend.empty()) {
    for (const RankTrace& rt : tr.ranks)
      for (const TraceSpan& s : rt.spans)
        if (s.cls == SpanClass::Comm && starts_with(tr.name(s.name), "gloo:")) tr.backend = "gloo";
  }
  tr.resolution_us = res;
  analyse(tr);
  return tr;
}

}  // namespace

ImportedTrace import_traces(const std::vector<std::string>& paths, const TraceImportOptions& opt) {
  const std::vector<std::string> files = find_trace_files(paths);
  int64_t total = 0;
  std::vector<int64_t> sizes;
  for (const std::string& f : files) {
    std::error_code ec;
    const auto n = fs::file_size(f, ec);
    sizes.push_back(ec ? 0 : static_cast<int64_t>(n));
    total += sizes.back();
  }
  std::vector<RawFile> raw(files.size());
  int64_t before = 0, reported = -(1 << 20);
  for (size_t i = 0; i < files.size(); i++) {
    RawFile& f = raw[i];
    f.path = files[i];
    f.display = files[i];
    auto on_read = [&](int64_t at) {
      if (!opt.progress || total <= 0) return;
      const int64_t done = before + at;
      if (done - reported < (1 << 20)) return;
      reported = done;
      opt.progress(std::min(1.0, static_cast<double>(done) / static_cast<double>(total)));
    };
    TraceFileBuf buf(files[i], f.display, on_read, opt.cancel);
    if (!buf.ok()) throw Error(files[i] + " cannot be opened (" + os_reason(errno) + "); check that it is readable.");
    std::istream in(&buf);
    parse_stream(in, f, [&] { return buf.error(); }, [&] { return buf.end_bytes(); });
    before += sizes[i];
  }
  if (opt.progress) opt.progress(1.0);
  return assemble(raw, opt);
}

std::vector<std::pair<double, double>> merge_intervals(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

ImportedTrace import_trace_texts(const std::vector<std::pair<std::string, std::string>>& texts,
                                 const TraceImportOptions& opt) {
  std::vector<RawFile> raw(texts.size());
  for (size_t i = 0; i < texts.size(); i++) {
    raw[i].path = raw[i].display = texts[i].first;
    std::istringstream in(texts[i].second);
    const auto size = static_cast<int64_t>(texts[i].second.size());
    parse_stream(in, raw[i], nullptr, [size] { return size; });
  }
  return assemble(raw, opt);
}

}  // namespace dtlab
