// The monitor's framing and the JSON forms of what crosses it (engine/monitor/monitor.h).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <type_traits>
#include <utility>

#include "engine/comm/tcp.h"
#include "engine/core/check.h"
#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/monitor/step_report.h"

namespace dtlab {

using nlohmann::json;
static_assert(std::is_trivially_copyable_v<Event>, "events cross the monitor as raw bytes");

namespace {

constexpr uint32_t kMonitorMagic = 0x4e4f4d44;  // "DMON"

struct Frame {
  uint32_t magic = kMonitorMagic;
  MonitorMsg type = MonitorMsg::Hello;
  uint8_t pad[3] = {};
  uint64_t bytes = 0;
};
static_assert(sizeof(Frame) == 16, "Frame is sent as raw bytes");

// Frames larger than this are a broken stream, not a message.
constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 30;

// What a decoder throws for a payload no dtlab run sends; the loops drop that message.
[[noreturn]] void malformed(const std::string& what) { throw Error("malformed monitor message: " + what); }

// A whole number of type T: a fraction, 1e300 or a value outside T is refused here, where nlohmann's
// get<T>() would convert a double out of T's range (undefined behavior).
template <class T>
T whole(const json& v, const char* key) {
  if (v.is_number_unsigned()) {
    if (const uint64_t u = v.get<uint64_t>(); std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    if (const int64_t i = v.get<int64_t>(); std::in_range<T>(i)) return static_cast<T>(i);
  }
  malformed(std::string("\"") + key + "\" is " + v.dump() + ", not a whole number in range");
}
template <class T>
T whole_at(const json& j, const char* key) { return whole<T>(j.at(key), key); }

// A recorder's start on the steady clock (ns since boot): receivers subtract two of them.
int64_t start_ns_at(const json& j) {
  const int64_t ns = whole_at<int64_t>(j, "start_ns");
  if (ns < 0 || ns >= kMaxMonitorNs) malformed("\"start_ns\" is not a steady clock's reading");
  return ns;
}

}  // namespace

MonitorLink::MonitorLink(int fd, double timeout_s) : fd_(fd), timeout_s_(timeout_s) {}

MonitorLink::~MonitorLink() {
  close();
  if (fd_ >= 0) ::close(fd_);
}

void MonitorLink::close() {
  if (!closed_.exchange(true) && fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool MonitorLink::send(MonitorMsg type, const void* data, size_t bytes) {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (closed_) return false;
  Frame f;
  f.type = type;
  f.bytes = bytes;
  const double deadline = tcp::now_s() + timeout_s_;
  std::string why;
  if (!tcp::write_all(fd_, &f, sizeof f, deadline, bytes ? MSG_MORE : 0, why) ||
      (bytes && !tcp::write_all(fd_, data, bytes, deadline, 0, why))) {
    closed_ = true;
    return false;
  }
  return true;
}

WaitEnd MonitorLink::recv(MonitorMsg& type, std::string& payload, double wait_s) {
  if (closed_) return WaitEnd::Closed;
  if (!tcp::wait_fd(fd_, POLLIN, tcp::now_s() + wait_s)) return closed_ ? WaitEnd::Closed : WaitEnd::Timeout;
  Frame f;
  std::string why;
  const double deadline = tcp::now_s() + timeout_s_;
  if (!tcp::read_all(fd_, &f, sizeof f, deadline, why) || f.magic != kMonitorMagic || f.bytes > kMaxFrameBytes) {
    closed_ = true;
    return WaitEnd::Closed;
  }
  // Grown as the bytes arrive: a header claiming a gigabyte costs only what the peer really sends.
  constexpr uint64_t kChunk = uint64_t{1} << 20;
  payload.clear();
  while (payload.size() < f.bytes) {
    const size_t have = payload.size(), n = static_cast<size_t>(std::min(kChunk, f.bytes - have));
    payload.resize(have + n);
    if (!tcp::read_all(fd_, payload.data() + have, n, deadline, why)) {
      closed_ = true;
      return WaitEnd::Closed;
    }
  }
  type = f.type;
  return WaitEnd::Ok;
}

// ---------------------------------------------------------------------------------------------

json status_json(const RankMonitorStatus& s) {
  json j = {{"compute", s.compute_activity},  {"comm", s.comm_activity},
            {"current_seq", s.current_seq},   {"done_seq", s.done_seq},
            {"op", static_cast<int>(s.desc.op)}, {"algo", static_cast<int>(s.desc.algo)},
            {"reduce", static_cast<int>(s.desc.reduce)}, {"dtype", static_cast<int>(s.desc.dtype)},
            {"count", s.desc.count},          {"root", s.desc.root},
            {"steps_done", s.steps_done},     {"steps", s.steps},
            {"connected", s.connected},       {"finished", s.finished},
            {"mem_current", s.memory.current}, {"mem_peak", s.memory.peak},
            {"mem_total", s.memory.total_current}, {"mem_total_peak", s.memory.total_peak},
            {"allocations", s.memory.allocations}, {"frees", s.memory.frees}};
  return j;
}

RankMonitorStatus status_from(const json& j) {
  auto memory = [&](const char* key) {
    std::array<int64_t, kNumMemCategories> out{};
    const json& a = j.at(key);
    if (!a.is_array() || a.size() != out.size()) malformed(std::string("\"") + key + "\" is not one number per memory category");
    for (size_t i = 0; i < out.size(); i++) out[i] = whole<int64_t>(a[i], key);
    return out;
  };
  RankMonitorStatus s;
  s.compute_activity = j.at("compute").get<std::string>();
  s.comm_activity = j.at("comm").get<std::string>();
  s.current_seq = whole_at<int64_t>(j, "current_seq");
  s.done_seq = whole_at<int64_t>(j, "done_seq");
  s.desc.op = static_cast<CollectiveOp>(whole_at<uint8_t>(j, "op"));
  s.desc.algo = static_cast<Algorithm>(whole_at<uint8_t>(j, "algo"));
  s.desc.reduce = static_cast<ReduceOp>(whole_at<uint8_t>(j, "reduce"));
  s.desc.dtype = static_cast<DType>(whole_at<uint8_t>(j, "dtype"));
  s.desc.count = whole_at<int64_t>(j, "count");
  s.desc.root = whole_at<int>(j, "root");
  s.steps_done = whole_at<int>(j, "steps_done");
  s.steps = whole_at<int>(j, "steps");
  s.connected = j.at("connected").get<bool>();
  s.finished = j.at("finished").get<bool>();
  s.memory.current = memory("mem_current");
  s.memory.peak = memory("mem_peak");
  s.memory.total_current = whole_at<int64_t>(j, "mem_total");
  s.memory.total_peak = whole_at<int64_t>(j, "mem_total_peak");
  s.memory.allocations = whole_at<int64_t>(j, "allocations");
  s.memory.frees = whole_at<int64_t>(j, "frees");
  return s;
}

namespace {

json op_json(const OpRef& o) {
  return {{"group", o.group}, {"seq", o.seq}, {"p2p", o.p2p}, {"src", o.src}, {"dst", o.dst}, {"tag", o.tag},
          {"members", o.members}};
}
OpRef op_from(const json& j) {
  OpRef o;
  o.group = whole_at<int32_t>(j, "group");
  o.seq = whole_at<int64_t>(j, "seq");
  o.p2p = j.at("p2p").get<bool>();
  o.src = whole_at<int16_t>(j, "src");
  o.dst = whole_at<int16_t>(j, "dst");
  o.tag = whole_at<int32_t>(j, "tag");
  o.members = whole_at<uint64_t>(j, "members");
  if (o.p2p && (o.src < 0 || o.src >= 64 || o.dst < 0 || o.dst >= 64)) malformed("a send/recv between ranks out of range");
  return o;
}

json gate_info_json(const GateInfo& g) {
  return {{"kind", static_cast<int>(g.kind)}, {"iteration", g.iteration}, {"action", g.action},
          {"op", op_json(g.op)}, {"op2", op_json(g.op2)}, {"step", g.step}, {"participants", g.participants},
          {"backward", g.backward}, {"model_time", g.model_time}, {"label", g.label}, {"trace_group", g.trace_group},
          {"coll", static_cast<int>(g.coll)}, {"bytes", g.bytes}};
}
GateInfo gate_info_from(const json& j) {
  GateInfo g;
  const int kind = whole_at<int>(j, "kind");
  if (kind < 0 || kind > static_cast<int>(GateKind::Grad)) malformed("gate kind " + std::to_string(kind));
  g.kind = static_cast<GateKind>(kind);
  g.iteration = whole_at<int32_t>(j, "iteration");
  g.action = whole_at<int32_t>(j, "action");
  g.op = op_from(j.at("op"));
  g.op2 = op_from(j.at("op2"));
  g.step = whole_at<int32_t>(j, "step");
  g.participants = whole_at<uint64_t>(j, "participants");
  g.backward = j.at("backward").get<bool>();
  g.model_time = j.at("model_time").get<double>();
  g.label = j.at("label").get<std::string>();
  g.trace_group = whole_at<int32_t>(j, "trace_group");
  const int coll = whole_at<int>(j, "coll");
  if (coll < 0 || coll > static_cast<int>(CollectiveOp::AllToAll)) malformed("gate operation " + std::to_string(coll));
  g.coll = static_cast<CollectiveOp>(coll);
  g.bytes = whole_at<int64_t>(j, "bytes");
  return g;
}

std::vector<int> ranks_from(const json& j) {
  std::vector<int> v;
  for (const json& r : j) v.push_back(whole<int>(r, "rank"));
  return v;
}
json pending_json(const PendingItem& p) {
  return {{"valid", p.valid}, {"kind", static_cast<int>(p.kind)}, {"gate", gate_info_json(p.gate)},
          {"members", p.members}, {"arrived", p.arrived}, {"missing", p.missing}};
}
PendingItem pending_from(const json& j) {
  PendingItem p;
  p.valid = j.at("valid").get<bool>();
  p.gate = gate_info_from(j.at("gate"));
  p.kind = p.gate.kind;
  p.members = ranks_from(j.at("members"));
  p.arrived = ranks_from(j.at("arrived"));
  p.missing = ranks_from(j.at("missing"));
  return p;
}

}  // namespace

json stepper_json(const StepperState& s) {
  json gates = json::array();
  for (const RankGateState& g : s.gates)
    gates.push_back({{"blocked", g.blocked}, {"lane", g.lane}, {"gate", gate_info_json(g.gate)}});
  json live = json::array();
  for (bool l : s.live) live.push_back(l);
  return {{"paused", s.paused},       {"pause_all", s.pause_all},     {"mode", static_cast<int>(s.mode)},
          {"speed", s.speed},         {"gates", gates},               {"pending", pending_json(s.pending)},
          {"focused", pending_json(s.focused)}, {"focus_rank", s.focus_rank}, {"focus_group", s.focus_group},
          {"waiting", s.waiting},     {"live", live},                 {"released", s.released},
          {"generation", s.generation}};
}

StepperState stepper_from(const json& j) {
  StepperState s;
  s.paused = j.at("paused").get<bool>();
  s.pause_all = j.at("pause_all").get<bool>();
  const int mode = whole_at<int>(j, "mode");
  if (mode < 0 || mode > static_cast<int>(GateKind::Grad)) malformed("stepper mode " + std::to_string(mode));
  s.mode = static_cast<GateKind>(mode);
  s.speed = j.at("speed").get<double>();
  s.generation = whole_at<uint64_t>(j, "generation");
  s.released = whole_at<uint64_t>(j, "released");
  for (const json& g : j.at("gates")) {
    RankGateState r;
    r.blocked = g.at("blocked").get<bool>();
    r.lane = whole_at<int>(g, "lane");
    r.gate = gate_info_from(g.at("gate"));
    s.gates.push_back(r);
  }
  s.pending = pending_from(j.at("pending"));
  s.focused = pending_from(j.at("focused"));
  s.focus_rank = whole_at<int>(j, "focus_rank");
  s.focus_group = j.at("focus_group").get<std::string>();
  s.waiting = j.at("waiting").get<std::string>();
  for (const json& l : j.at("live")) s.live.push_back(l.get<bool>());
  return s;
}

std::string gate_json(const GateWire& g) {
  return json{{"id", g.id}, {"rank", g.rank}, {"lane", g.lane}, {"ok", g.ok}, {"gate", gate_info_json(g.gate)}}.dump();
}

std::string step_report_to_json(const StepReport& r) {
  json j = {{"step", r.step},       {"total_steps", r.total_steps}, {"epoch", r.epoch},
            {"batch", r.batch_size}, {"loss", r.loss},              {"accuracy", r.accuracy},
            {"step_seconds", r.step_seconds}, {"samples_per_sec", r.samples_per_sec},
            {"samples", r.samples}, {"overlap", r.overlap},         {"branch_taken", r.branch_taken},
            {"bubble", r.bubble}};
  if (r.grad_norm >= 0) j["grad_norm"] = r.grad_norm, j["clip_coef"] = r.clip_coef;  // --clip-grad-norm
  return j.dump();
}

StepReport step_report_from_json(const std::string& text) {
  const json j = json::parse(text);
  StepReport r;
  r.step = whole_at<int64_t>(j, "step");
  r.total_steps = whole_at<int64_t>(j, "total_steps");
  r.epoch = whole_at<int64_t>(j, "epoch");
  r.batch_size = whole_at<int64_t>(j, "batch");
  r.loss = j.at("loss").get<float>();
  r.accuracy = j.at("accuracy").get<double>();
  r.step_seconds = j.at("step_seconds").get<double>();
  r.samples_per_sec = j.at("samples_per_sec").get<double>();
  r.samples = whole_at<int64_t>(j, "samples");
  r.overlap = j.at("overlap").get<double>();
  r.branch_taken = j.at("branch_taken").get<bool>();
  r.bubble = j.at("bubble").get<std::vector<double>>();
  if (j.contains("grad_norm")) r.grad_norm = j.at("grad_norm").get<double>(), r.clip_coef = j.at("clip_coef").get<double>();
  return r;
}

// ---------------------------------------------------------------------------------------------
// Decoders of what arrives on a connection (monitor_internal.h).

FeedHelloWire feed_hello_from(const std::string& payload) {
  const json j = json::parse(payload);
  FeedHelloWire h;
  h.rank = whole_at<int>(j, "rank");
  h.world = whole_at<int>(j, "world");
  h.start_ns = start_ns_at(j);
  return h;
}

HelloWire hello_from(const std::string& payload) {
  const json j = json::parse(payload);
  HelloWire h;
  h.config = j.at("config").get<std::string>();
  h.world = whole_at<int>(j, "world");
  h.total_steps = whole_at<int64_t>(j, "total_steps");
  h.backend = j.at("backend").get<std::string>();
  h.device = j.at("device").get<std::string>();
  h.start_ns = start_ns_at(j);
  if (h.world < 1 || h.world > kMaxMonitorWorld)
    malformed("a world of " + std::to_string(h.world) + " ranks; a launched world has 1 to " + std::to_string(kMaxMonitorWorld));
  return h;
}

LabelsWire labels_from(const std::string& payload) {
  const json j = json::parse(payload);
  LabelsWire m;
  m.first = whole_at<size_t>(j, "first");
  m.labels = j.at("labels").get<std::vector<std::string>>();
  if (m.first > kMaxMonitorLabels || m.labels.size() > kMaxMonitorLabels - m.first)
    malformed("labels up to " + std::to_string(m.first) + " + " + std::to_string(m.labels.size()) + "; a run has at most " +
              std::to_string(kMaxMonitorLabels));
  return m;
}

std::vector<Event> events_from(const std::string& payload) {
  std::vector<Event> out(payload.size() / sizeof(Event));
  for (size_t i = 0; i < out.size(); i++) {
    Event& e = out[i];
    std::memcpy(static_cast<void*>(&e), payload.data() + i * sizeof(Event), sizeof(Event));
    // Receivers shift wall times by a start difference, subtract them and add up ring step bytes:
    // bounded here so none of that overflows.
    auto in_range = [](int64_t v) { return v > -kMaxMonitorNs && v < kMaxMonitorNs; };
    const bool ok = e.kind <= EventKind::GradClip && e.lane <= Lane::Comm && in_range(e.wall_begin_ns) &&
                    in_range(e.wall_end_ns) && (e.kind != EventKind::RingStep || (e.step.bytes >= 0 && e.step.bytes <= kMaxMonitorStepBytes));
    if (!ok) malformed("event " + std::to_string(i) + " is not one a recorder makes");
  }
  return out;
}

GateWire gate_from(const std::string& payload) {
  const json j = json::parse(payload);
  GateWire g;
  g.id = whole_at<uint64_t>(j, "id");
  g.rank = whole_at<int32_t>(j, "rank");
  g.lane = whole_at<int32_t>(j, "lane");
  g.ok = j.at("ok").get<bool>();
  g.gate = gate_info_from(j.at("gate"));
  if (g.rank < 0 || g.rank >= kMaxMonitorWorld) malformed("a gate of rank " + std::to_string(g.rank));
  if (g.lane < 0 || g.lane >= kStepperLanes) malformed("a gate on lane " + std::to_string(g.lane));
  return g;
}

ViewerStatusWire viewer_status_from(const std::string& payload) {
  const json j = json::parse(payload);
  ViewerStatusWire v;
  v.stepper = stepper_from(j.at("stepper"));
  const json& ranks = j.at("ranks");
  if (!ranks.is_array()) malformed("\"ranks\" is not a list");
  for (const json& r : ranks) v.ranks.push_back(status_from(r));
  return v;
}

CommandWire command_from(const std::string& payload) {
  const json j = json::parse(payload);
  CommandWire c;
  c.cmd = j.at("cmd").get<std::string>();
  if (c.cmd == "run") {
    c.speed = j.value("speed", 0.0);
    if (!std::isfinite(c.speed) || c.speed < 0) malformed("run at speed " + std::to_string(c.speed));
  } else if (c.cmd == "step") {
    const int kind = whole_at<int>(j, "kind");
    if (kind < 0 || kind > static_cast<int>(GateKind::Grad)) malformed("step kind " + std::to_string(kind));
    c.kind = static_cast<GateKind>(kind);
  } else if (c.cmd == "focus") {
    c.focus_rank = whole_at<int>(j, "rank");
    c.focus_group = j.at("group").get<std::string>();
    if (c.focus_rank < -1 || c.focus_rank >= kMaxMonitorWorld) malformed("focus on rank " + std::to_string(c.focus_rank));
  } else if (c.cmd != "pause") {
    malformed("unknown command '" + c.cmd + "'");
  }
  return c;
}

std::string end_from(const std::string& payload) { return json::parse(payload).at("error").get<std::string>(); }

// ---------------------------------------------------------------------------------------------

EventPump::EventPump(const TraceRecorder& rec)
    : rec_(rec), next_order_(static_cast<size_t>(rec.world_size()), 0) {}

bool EventPump::pump(MonitorLink& link, const std::vector<int>& ranks) {
  if (rec_.label_count() > labels_sent_) {
    const std::vector<std::string> all = rec_.labels();
    json j = {{"first", labels_sent_},
              {"labels", std::vector<std::string>(all.begin() + static_cast<std::ptrdiff_t>(labels_sent_), all.end())}};
    if (!link.send(MonitorMsg::Labels, j.dump())) return false;
    labels_sent_ = all.size();
  }
  buf_.clear();
  auto take = [&](int r) {
    const size_t before = buf_.size();
    rec_.events_since(r, next_order_[static_cast<size_t>(r)], buf_);
    for (size_t i = before; i < buf_.size(); i++)
      next_order_[static_cast<size_t>(r)] = std::max(next_order_[static_cast<size_t>(r)], buf_[i].order + 1);
  };
  if (ranks.empty())
    for (int r = 0; r < rec_.world_size(); r++) take(r);
  else
    for (int r : ranks) take(r);
  // Merged by order, so a receiver that re-records them keeps every rank's relative order.
  std::sort(buf_.begin(), buf_.end(), [](const Event& a, const Event& b) { return a.order < b.order; });
  constexpr size_t kBatch = 4096;
  for (size_t i = 0; i < buf_.size(); i += kBatch) {
    const size_t n = std::min(kBatch, buf_.size() - i);
    if (!link.send(MonitorMsg::Events, buf_.data() + i, n * sizeof(Event))) return false;
  }
  return true;
}

void parse_monitor_address(const std::string& text, std::string& host, int& port) {
  const size_t colon = text.rfind(':');
  const std::string how = "; write HOST:PORT, e.g. 127.0.0.1:29600 (the --monitor port of the launched train)";
  if (colon == std::string::npos || colon == 0) throw Error("'" + text + "' is not an address" + how);
  host = text.substr(0, colon);
  const std::string p = text.substr(colon + 1);
  int v = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || v < 1 || v > 65535)
    throw Error("'" + p + "' in '" + text + "' is not a port (1-65535)" + how);
  port = v;
}

}  // namespace dtlab
