// Rank 0's side of the monitor (engine/monitor/monitor.h): the listener, one reader and two gate
// workers per feed, and the viewer's loop.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/comm/tcp.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/monitor/step_report.h"

namespace dtlab {

using nlohmann::json;

// One connected rank r > 0.
struct MonitorHub::Feed {
  int rank = -1;
  std::shared_ptr<MonitorLink> link;
  int64_t shift_ns = 0;             // add to its wall times: its recorder started this much later
  std::vector<int32_t> label_map;   // its label id -> rank 0's
  std::mutex mu;                    // pending, done
  std::condition_variable cv;
  bool has[kStepperLanes] = {};     // a gate request per lane (each lane is one thread: at most one)
  GateWire pending[kStepperLanes];
  bool done = false;                // the connection ended: gate workers exit
};

MonitorHub::MonitorHub(const MonitorOptions& opt, TraceRecorder& rec, Stepper& stepper, std::string config_json,
                       int64_t total_steps, std::function<RankMonitorStatus()> local_status,
                       std::function<void(const std::string&)> on_fail)
    : opt_(opt), rec_(rec), stepper_(stepper), config_json_(std::move(config_json)), total_steps_(total_steps),
      local_status_(std::move(local_status)), on_fail_(std::move(on_fail)),
      status_(static_cast<size_t>(opt.world_size)) {
  std::string why;
  int port = opt_.port;
  listen_fd_ = tcp::listen_on(resolve_ipv4(opt_.addr), port, 64, why);
  if (listen_fd_ < 0)
    throw Error("--monitor " + std::to_string(opt_.port) + " cannot listen on " + opt_.addr + ":" +
                std::to_string(opt_.port) + " (" + why + "); pick another port");
  opt_.port = port;
  accept_thread_ = std::thread([this] { accept_loop(); });
}

MonitorHub::~MonitorHub() {
  stop_ = true;
  stepper_.abort();  // a gate worker may wait in a paused stepper; the run is over either way
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : feeds_) {
      std::lock_guard<std::mutex> fl(f->mu);
      f->done = true;
      f->cv.notify_all();
    }
  }
  cv_.notify_all();
  // Only the accept thread adds threads; once it is joined the list is final.
  accept_thread_.join();
  for (std::thread& t : threads_) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::string MonitorHub::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

std::vector<RankMonitorStatus> MonitorHub::ranks() const {
  std::vector<RankMonitorStatus> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = status_;
  }
  if (local_status_) out[0] = local_status_();
  out[0].connected = true;
  return out;
}

void MonitorHub::add_report(const StepReport& r) {
  std::lock_guard<std::mutex> lock(mu_);
  reports_.push_back(step_report_to_json(r));
}

void MonitorHub::finish(const std::string& error) {
  std::unique_lock<std::mutex> lock(mu_);
  // The feeds' last events come before their Bye; a rank that failed may never say it.
  cv_.wait_for(lock, std::chrono::duration<double>(opt_.timeout_s), [&] {
    for (int r = 1; r < opt_.world_size; r++) {
      const RankMonitorStatus& s = status_[static_cast<size_t>(r)];
      if (s.connected && !s.finished) return false;
    }
    return true;
  });
  ended_ = true;
  end_error_ = error;
  cv_.notify_all();
  // The viewer loop sends what is left and End, then lets go of the viewer.
  cv_.wait_for(lock, std::chrono::duration<double>(std::min(opt_.timeout_s, 5.0)),
               [&] { return !viewer_ || viewer_->closed(); });
}

void MonitorHub::accept_loop() {
  const double wait_until = tcp::now_s() + opt_.wait_s;
  while (!stop_) {
    if (!ever_viewed_ && tcp::now_s() > wait_until) {
      const std::string msg = "no viewer attached to " + opt_.addr + ":" + std::to_string(opt_.port) + " within " +
                              seconds_text(opt_.wait_s) + "; start 'dtlab --attach " + opt_.addr + ":" +
                              std::to_string(opt_.port) + "' while the run waits, or drop --monitor";
      {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = msg;
      }
      ever_viewed_ = true;  // fire once
      if (on_fail_) on_fail_(msg);
    }
    const int fd = tcp::accept_one(listen_fd_, tcp::now_s() + 0.1);
    if (fd < 0) continue;
    auto link = std::make_shared<MonitorLink>(fd, opt_.timeout_s);
    MonitorMsg type;
    std::string payload;
    if (link->recv(type, payload, opt_.timeout_s) != WaitEnd::Ok) continue;
    if (type == MonitorMsg::FeedHello) {
      auto f = std::make_shared<Feed>();
      f->link = link;
      try {
        const FeedHelloWire h = feed_hello_from(payload);
        f->rank = h.rank;
        f->shift_ns = h.start_ns - rec_.start_ns();
        if (h.world != opt_.world_size || f->rank <= 0 || f->rank >= opt_.world_size)
          throw Error("rank " + std::to_string(f->rank) + " of a world of " + std::to_string(h.world));
      } catch (const std::exception& e) {
        link->send(MonitorMsg::Refused, std::string("rank 0's monitor expects ranks 1..") +
                                            std::to_string(opt_.world_size - 1) + "; got " + e.what());
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        status_[static_cast<size_t>(f->rank)].connected = true;
        feeds_.push_back(f);
      }
      threads_.emplace_back([this, f] { feed_loop(f); });
      for (int lane = 0; lane < kStepperLanes; lane++) threads_.emplace_back([this, f, lane] { gate_worker(f, lane); });
    } else if (type == MonitorMsg::ViewerHello) {
      std::lock_guard<std::mutex> lock(mu_);
      if (viewer_ && !viewer_->closed()) {
        link->send(MonitorMsg::Refused, "a viewer is already attached to this run; close it first");
        continue;
      }
      viewer_ = link;
      ever_viewed_ = true;
      threads_.emplace_back([this, link] { viewer_loop(link); });
    } else {
      link->send(MonitorMsg::Refused, "this is a dtlab run's monitor; connect with 'dtlab --attach HOST:PORT'");
    }
  }
}

void MonitorHub::ingest_events(Feed& f, const std::string& payload) {
  for (Event& e : events_from(payload)) {
    if (e.rank != f.rank) continue;  // a feed speaks for its own rank only
    e.wall_begin_ns += f.shift_ns;
    e.wall_end_ns += f.shift_ns;
    auto remap = [&](int32_t& id) {
      if (id >= 0 && static_cast<size_t>(id) < f.label_map.size()) id = f.label_map[static_cast<size_t>(id)];
    };
    auto remap_group = [&](int32_t& group) {  // 0: the world; else 1 + a label id (a process group)
      if (group <= 0) return;
      int32_t id = group - 1;
      remap(id);
      group = id + 1;
    };
    switch (e.kind) {
      case EventKind::BucketAssigned:
      case EventKind::GradReady:
      case EventKind::BucketReady:
      case EventKind::BucketLaunch:
      case EventKind::BucketAllReduce: remap(e.bucket.label); break;
      case EventKind::FsdpUnit: remap(e.fsdp.label); break;
      case EventKind::CollectiveIssue:
      case EventKind::Collective: remap_group(e.coll.group); break;
      case EventKind::RingStep: remap_group(e.step.group); break;
      default: break;
    }
    rec_.record(e);
  }
}

void MonitorHub::feed_loop(std::shared_ptr<Feed> f) {
  MonitorMsg type;
  std::string payload;
  while (!stop_) {
    const WaitEnd end = f->link->recv(type, payload, 0.1);
    if (end == WaitEnd::Timeout) continue;
    if (end != WaitEnd::Ok) break;
    try {
      switch (type) {
        case MonitorMsg::Labels: {
          const LabelsWire m = labels_from(payload);
          size_t at = m.first;
          for (const std::string& l : m.labels) {
            if (f->label_map.size() <= at) f->label_map.resize(at + 1, -1);
            f->label_map[at++] = rec_.intern(l);
          }
          break;
        }
        case MonitorMsg::Events: ingest_events(*f, payload); break;
        case MonitorMsg::Status: {
          RankMonitorStatus s = status_from(json::parse(payload));
          std::lock_guard<std::mutex> lock(mu_);
          RankMonitorStatus& mine = status_[static_cast<size_t>(f->rank)];
          s.connected = true;
          s.finished = mine.finished;
          mine = s;
          break;
        }
        case MonitorMsg::GateRequest: {
          GateWire g = gate_from(payload);
          if (g.rank != f->rank) break;  // a feed speaks for its own rank only
          // Its process group's trace id in rank 0's labels (the feed sent its labels before the gate).
          if (int32_t& tg = g.gate.trace_group; tg > 0) {
            const size_t id = static_cast<size_t>(tg - 1);
            tg = id < f->label_map.size() && f->label_map[id] >= 0 ? f->label_map[id] + 1 : 0;
          }
          std::lock_guard<std::mutex> lock(f->mu);
          f->pending[g.lane] = g;
          f->has[g.lane] = true;
          f->cv.notify_all();
          break;
        }
        case MonitorMsg::Bye: {
          {
            std::lock_guard<std::mutex> lock(mu_);
            status_[static_cast<size_t>(f->rank)].finished = true;
            cv_.notify_all();
          }
          stepper_.rank_done(f->rank);  // its program ended: the stepper stops waiting for it
          break;
        }
        default: break;
      }
    } catch (const std::exception&) {
      // A malformed message from our own build: drop it rather than the run.
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_[static_cast<size_t>(f->rank)].connected = false;
    status_[static_cast<size_t>(f->rank)].comm_activity = "its process is gone";
    cv_.notify_all();
  }
  stepper_.rank_done(f->rank);
  std::lock_guard<std::mutex> lock(f->mu);
  f->done = true;
  f->cv.notify_all();
}

// Passes a remote rank's gates through rank 0's stepper, so one Stepper sees the whole world.
void MonitorHub::gate_worker(std::shared_ptr<Feed> f, int lane) {
  while (true) {
    GateWire g;
    {
      std::unique_lock<std::mutex> lock(f->mu);
      f->cv.wait(lock, [&] { return f->has[lane] || f->done; });
      if (f->done) return;
      g = f->pending[lane];
      f->has[lane] = false;
    }
    g.ok = stepper_.gate(f->rank, lane, g.gate);
    f->link->send(MonitorMsg::GateReply, gate_json(g));
  }
}

void MonitorHub::command(const std::string& text) {
  try {
    const CommandWire c = command_from(text);
    if (c.cmd == "run") stepper_.run(c.speed);
    else if (c.cmd == "pause") stepper_.pause();
    else if (c.cmd == "step") stepper_.step(c.kind);
    else if (c.cmd == "focus") stepper_.set_focus(c.focus_rank, c.focus_group);
  } catch (const std::exception&) {
  }
}

void MonitorHub::viewer_loop(std::shared_ptr<MonitorLink> v) {
  json hello = {{"config", config_json_}, {"world", opt_.world_size}, {"total_steps", total_steps_},
                {"backend", "socket"},    {"device", "cpu"},          {"start_ns", rec_.start_ns()},
                {"address", opt_.addr + ":" + std::to_string(opt_.port)}};
  EventPump pump(rec_);
  size_t reports_sent = 0;
  uint64_t last_gen = UINT64_MAX;
  double last_status = 0;
  bool ok = v->send(MonitorMsg::Hello, hello.dump());
  MonitorMsg type;
  std::string payload;
  while (ok && !stop_) {
    const WaitEnd end = v->recv(type, payload, kMonitorTickS);
    if (end == WaitEnd::Closed) break;
    if (end == WaitEnd::Ok && type == MonitorMsg::Command) command(payload);
    bool ended;
    std::string error;
    std::vector<std::string> reports;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ended = ended_;
      error = end_error_;
      reports = reports_.since(reports_sent);
      reports_sent = reports_.total();
    }
    ok = pump.pump(*v);
    for (const std::string& r : reports) ok = ok && v->send(MonitorMsg::Report, r);
    const StepperState st = stepper_.state();
    if (ok && (st.generation != last_gen || tcp::now_s() - last_status > 0.1 || ended)) {
      last_gen = st.generation;
      last_status = tcp::now_s();
      json ranks = json::array();
      for (const RankMonitorStatus& s : this->ranks()) ranks.push_back(status_json(s));
      ok = v->send(MonitorMsg::Status, json{{"stepper", stepper_json(st)}, {"ranks", ranks}}.dump());
    }
    if (ok && ended) {
      v->send(MonitorMsg::End, json{{"error", error}}.dump());
      // Let the viewer read everything before the connection goes.
      for (int i = 0; i < 50 && v->recv(type, payload, 0.02) != WaitEnd::Closed; i++) {}
      break;
    }
  }
  v->close();
  const bool was_ended = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
    return ended_;
  }();
  // Detached mid-run: nobody holds the world any more.
  if (!was_ended && !stop_) stepper_.run(0);
}

}  // namespace dtlab
