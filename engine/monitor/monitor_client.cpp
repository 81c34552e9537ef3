// The monitor's two clients (engine/monitor/monitor.h): a rank's feed, and the viewer's mirror.
#include <nlohmann/json.hpp>

#include "engine/comm/tcp.h"
#include "engine/core/check.h"
#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/monitor/step_report.h"

namespace dtlab {

using nlohmann::json;

namespace {

// Connects and says hello; dtlab::Error naming the address when nothing answers in time.
std::unique_ptr<MonitorLink> connect_monitor(const std::string& host, int port, double timeout_s, MonitorMsg hello,
                                             const std::string& payload, const std::string& hint) {
  std::string why;
  const std::string ip = resolve_ipv4(host);
  const int fd = tcp::connect_retry(ip, port, tcp::now_s() + timeout_s, why);
  if (fd < 0)
    throw Error("nothing answers at " + host + ":" + std::to_string(port) + " (" + why + ") within " +
                std::to_string(static_cast<int>(timeout_s)) + " s; " + hint);
  auto link = std::make_unique<MonitorLink>(fd, timeout_s);
  if (!link->send(hello, payload)) throw Error("the connection to " + host + ":" + std::to_string(port) + " failed at once; " + hint);
  return link;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Feed

MonitorFeed::MonitorFeed(const MonitorOptions& opt, TraceRecorder& rec, std::function<RankMonitorStatus()> status)
    : opt_(opt), rec_(rec), status_fn_(std::move(status)), pump_(rec) {
  const json hello = {{"rank", opt_.rank}, {"world", opt_.world_size}, {"start_ns", rec_.start_ns()}};
  link_ = connect_monitor(opt_.addr, opt_.port, opt_.timeout_s, MonitorMsg::FeedHello, hello.dump(),
                          "rank 0 serves the monitor when it runs with --monitor; check rank 0's output");
  pump_thread_ = std::thread([this] { pump_loop(); });
  read_thread_ = std::thread([this] { read_loop(); });
}

MonitorFeed::~MonitorFeed() {
  stop_ = true;
  cancel();
  if (pump_thread_.joinable()) pump_thread_.join();
  if (read_thread_.joinable()) read_thread_.join();
  link_->close();
}

bool MonitorFeed::flush_locked() {
  if (!pump_.pump(*link_, {opt_.rank})) return false;
  if (!status_fn_) return true;
  const std::string s = status_json(status_fn_()).dump();
  if (s == last_status_) return true;
  last_status_ = s;
  return link_->send(MonitorMsg::Status, s);
}

void MonitorFeed::pump_loop() {
  while (!stop_) {
    {
      std::lock_guard<std::mutex> lock(send_mu_);
      if (!flush_locked()) break;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(kMonitorTickS));
  }
}

void MonitorFeed::read_loop() {
  MonitorMsg type;
  std::string payload;
  while (!stop_) {
    const WaitEnd end = link_->recv(type, payload, 0.1);
    if (end == WaitEnd::Timeout) continue;
    if (end != WaitEnd::Ok || type == MonitorMsg::Refused) break;
    if (type != MonitorMsg::GateReply) continue;
    GateWire g;
    try {
      g = gate_from(payload);
    } catch (const std::exception&) {
      continue;  // not an answer rank 0 sends
    }
    std::lock_guard<std::mutex> lock(mu_);
    replies_[g.id] = g.ok;
    cv_.notify_all();
  }
  cancel();  // rank 0 is gone: nobody will open this rank's gates
}

bool MonitorFeed::gate(int rank, int lane, const GateInfo& gate) {
  GateWire g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    g.id = next_id_++;
  }
  g.rank = rank;
  g.lane = lane;
  g.gate = gate;
  const std::string msg = gate_json(g);
  {
    // What this rank did before the gate reaches the viewer before the gate holds it.
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!flush_locked() || !link_->send(MonitorMsg::GateRequest, msg)) {
      cancel();
      return false;
    }
  }
  // The person at the viewer decides when this opens; a lost connection or an abort ends it.
  std::unique_lock<std::mutex> lock(mu_);
  waiting_++;
  cv_.wait(lock, [&] { return cancelled_ || replies_.count(g.id); });
  waiting_--;
  auto it = replies_.find(g.id);
  if (it == replies_.end()) return false;
  const bool ok = it->second != 0;
  replies_.erase(it);
  return ok;
}

void MonitorFeed::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

bool MonitorFeed::holding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_ > 0;
}

void MonitorFeed::finish() {
  std::lock_guard<std::mutex> lock(send_mu_);
  if (bye_sent_) {
    flush_locked();  // what the teardown recorded since
    return;
  }
  bye_sent_ = true;
  if (flush_locked()) link_->send(MonitorMsg::Bye, nullptr, 0);
}

// ---------------------------------------------------------------------------------------------
// Viewer

MonitorClient::MonitorClient(const std::string& address, double timeout_s) : address_(address) {
  std::string host;
  int port = 0;
  parse_monitor_address(address, host, port);
  link_ = connect_monitor(host, port, timeout_s, MonitorMsg::ViewerHello, std::string(),
                          "start the run first: dtlab-cli launch --nproc-per-node N -- train ... --monitor " +
                              std::to_string(port));
  MonitorMsg type;
  std::string payload;
  const WaitEnd end = link_->recv(type, payload, timeout_s);
  if (end != WaitEnd::Ok)
    throw Error(address + " accepted the connection but sent no greeting within " +
                std::to_string(static_cast<int>(timeout_s)) + " s; is it a dtlab run's --monitor port?");
  // The peer's own words, bounded and on one line: whatever answers at that address may not be a dtlab run.
  if (type == MonitorMsg::Refused) throw Error(address + " refused the viewer: " + tcp::peer_text(payload.data(), payload.size(), 2000));
  if (type != MonitorMsg::Hello) throw Error(address + " is not a dtlab run's monitor");
  try {
    const HelloWire h = hello_from(payload);
    config_json_ = h.config;
    world_ = h.world;
    total_steps_ = h.total_steps;
    backend_ = h.backend;
    device_ = h.device;
    rec_ = std::make_unique<TraceRecorder>(world_);
    rec_->set_start_ns(h.start_ns);
  } catch (const std::exception& e) {
    throw Error(address + " sent a greeting this dtlab cannot read (" + e.what() + "); run the same dtlab build on both sides");
  }
  ranks_.assign(static_cast<size_t>(world_), RankMonitorStatus{});
  reader_ = std::thread([this] { read_loop(); });
}

MonitorClient::~MonitorClient() {
  stop_ = true;
  if (reader_.joinable()) reader_.join();
  link_->close();
}

void MonitorClient::read_loop() {
  MonitorMsg type;
  std::string payload;
  bool got_end = false;
  while (!stop_) {
    const WaitEnd end = link_->recv(type, payload, 0.1);
    if (end == WaitEnd::Timeout) continue;
    if (end != WaitEnd::Ok) break;
    try {
      switch (type) {
        case MonitorMsg::Labels:
          for (const std::string& l : labels_from(payload).labels) rec_->intern(l);
          break;
        case MonitorMsg::Events:
          for (Event& e : events_from(payload))
            if (e.rank >= 0 && e.rank < world_) rec_->record(e);
          break;
        case MonitorMsg::Status: {
          ViewerStatusWire v = viewer_status_from(payload);
          std::lock_guard<std::mutex> lock(mu_);
          stepper_ = std::move(v.stepper);
          if (v.ranks.size() == ranks_.size()) ranks_ = std::move(v.ranks);
          cv_.notify_all();
          break;
        }
        case MonitorMsg::Report: {
          StepReport r = step_report_from_json(payload);
          std::lock_guard<std::mutex> lock(mu_);
          reports_.push_back(r);
          cv_.notify_all();
          break;
        }
        case MonitorMsg::End: {
          std::string error = end_from(payload);
          std::lock_guard<std::mutex> lock(mu_);
          error_ = std::move(error);
          ended_ = got_end = true;
          cv_.notify_all();
          break;
        }
        default: break;
      }
    } catch (const std::exception&) {
    }
    if (got_end) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!got_end && !stop_)
    error_ = "the connection to rank 0 at " + address_ + " closed before the run ended; rank 0's process exited or failed";
  ended_ = true;
  cv_.notify_all();
}

StepperState MonitorClient::stepper_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stepper_;
}

std::vector<RankMonitorStatus> MonitorClient::ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_;
}

std::vector<StepReport> MonitorClient::reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_.kept();
}

size_t MonitorClient::report_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_.total();
}

std::vector<StepReport> MonitorClient::reports_since(size_t& next) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StepReport> out = reports_.since(next);
  next = reports_.total();
  return out;
}

bool MonitorClient::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

bool MonitorClient::wait_ended(double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return ended_; });
}

std::string MonitorClient::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void MonitorClient::send_command(const std::string& text) { link_->send(MonitorMsg::Command, text); }

void MonitorClient::run(double speed) {
  send_command(json{{"cmd", "run"}, {"speed", speed}}.dump());
  std::lock_guard<std::mutex> lock(mu_);
  stepper_.paused = false;  // until the next status says otherwise
  stepper_.speed = speed;
}

void MonitorClient::pause() {
  send_command(json{{"cmd", "pause"}}.dump());
  std::lock_guard<std::mutex> lock(mu_);
  stepper_.paused = true;
}

void MonitorClient::step(GateKind kind) {
  send_command(json{{"cmd", "step"}, {"kind", static_cast<int>(kind)}}.dump());
  std::lock_guard<std::mutex> lock(mu_);
  stepper_.paused = true;
}

void MonitorClient::set_focus(int rank, const std::string& group) {
  send_command(json{{"cmd", "focus"}, {"rank", rank}, {"group", group}}.dump());
}

bool MonitorClient::wait_for(const std::function<bool(const StepperState&, const std::vector<RankMonitorStatus>&)>& pred,
                             double timeout_s) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return pred(stepper_, ranks_); });
}

}  // namespace dtlab
