// The monitor's framing and the JSON forms of what crosses it (engine/monitor/monitor.h).
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <type_traits>

#include "engine/comm/tcp.h"
#include "engine/core/check.h"
#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/train/train.h"

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
  payload.resize(f.bytes);
  if (f.bytes && !tcp::read_all(fd_, payload.data(), f.bytes, deadline, why)) {
    closed_ = true;
    return WaitEnd::Closed;
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
  RankMonitorStatus s;
  s.compute_activity = j.at("compute").get<std::string>();
  s.comm_activity = j.at("comm").get<std::string>();
  s.current_seq = j.at("current_seq").get<int64_t>();
  s.done_seq = j.at("done_seq").get<int64_t>();
  s.desc.op = static_cast<CollectiveOp>(j.at("op").get<int>());
  s.desc.algo = static_cast<Algorithm>(j.at("algo").get<int>());
  s.desc.reduce = static_cast<ReduceOp>(j.at("reduce").get<int>());
  s.desc.dtype = static_cast<DType>(j.at("dtype").get<int>());
  s.desc.count = j.at("count").get<int64_t>();
  s.desc.root = j.at("root").get<int>();
  s.steps_done = j.at("steps_done").get<int>();
  s.steps = j.at("steps").get<int>();
  s.connected = j.at("connected").get<bool>();
  s.finished = j.at("finished").get<bool>();
  s.memory.current = j.at("mem_current").get<std::array<int64_t, kNumMemCategories>>();
  s.memory.peak = j.at("mem_peak").get<std::array<int64_t, kNumMemCategories>>();
  s.memory.total_current = j.at("mem_total").get<int64_t>();
  s.memory.total_peak = j.at("mem_total_peak").get<int64_t>();
  s.memory.allocations = j.at("allocations").get<int64_t>();
  s.memory.frees = j.at("frees").get<int64_t>();
  return s;
}

namespace {

json pos_json(const GatePos& p) { return json::array({p.seq, p.sub, p.iter, p.action}); }
GatePos pos_from(const json& j) {
  return GatePos{j.at(0).get<int64_t>(), j.at(1).get<int32_t>(), j.at(2).get<int32_t>(), j.at(3).get<int32_t>()};
}

}  // namespace

json stepper_json(const StepperState& s) {
  json gates = json::array();
  for (const RankGateState& g : s.gates)
    gates.push_back({{"blocked", g.blocked}, {"kind", static_cast<int>(g.kind)}, {"pos", pos_json(g.pos)},
                     {"iteration", g.iteration}, {"lane", g.lane}});
  return {{"paused", s.paused},  {"speed", s.speed}, {"allowed", pos_json(s.allowed)},
          {"frontier", pos_json(s.frontier)}, {"gates", gates}, {"generation", s.generation}};
}

StepperState stepper_from(const json& j) {
  StepperState s;
  s.paused = j.at("paused").get<bool>();
  s.speed = j.at("speed").get<double>();
  s.allowed = pos_from(j.at("allowed"));
  s.frontier = pos_from(j.at("frontier"));
  s.generation = j.at("generation").get<uint64_t>();
  for (const json& g : j.at("gates")) {
    RankGateState r;
    r.blocked = g.at("blocked").get<bool>();
    r.kind = static_cast<GateKind>(g.at("kind").get<int>());
    r.pos = pos_from(g.at("pos"));
    r.iteration = g.at("iteration").get<int32_t>();
    r.lane = g.at("lane").get<int>();
    s.gates.push_back(r);
  }
  return s;
}

std::string step_report_to_json(const StepReport& r) {
  json j = {{"step", r.step},       {"total_steps", r.total_steps}, {"epoch", r.epoch},
            {"batch", r.batch_size}, {"loss", r.loss},              {"accuracy", r.accuracy},
            {"step_seconds", r.step_seconds}, {"samples_per_sec", r.samples_per_sec},
            {"samples", r.samples}, {"overlap", r.overlap},         {"branch_taken", r.branch_taken},
            {"bubble", r.bubble}};
  return j.dump();
}

StepReport step_report_from_json(const std::string& text) {
  const json j = json::parse(text);
  StepReport r;
  r.step = j.at("step").get<int64_t>();
  r.total_steps = j.at("total_steps").get<int64_t>();
  r.epoch = j.at("epoch").get<int64_t>();
  r.batch_size = j.at("batch").get<int64_t>();
  r.loss = j.at("loss").get<float>();
  r.accuracy = j.at("accuracy").get<double>();
  r.step_seconds = j.at("step_seconds").get<double>();
  r.samples_per_sec = j.at("samples_per_sec").get<double>();
  r.samples = j.at("samples").get<int64_t>();
  r.overlap = j.at("overlap").get<double>();
  r.branch_taken = j.at("branch_taken").get<bool>();
  r.bubble = j.at("bubble").get<std::vector<double>>();
  return r;
}

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
