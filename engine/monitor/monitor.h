// The monitor: a launched world (one process per rank, `dtlab-cli launch ... -- train --monitor
// PORT`) seen and stepped from one window. Rank 0's process runs the hub; it listens on
// MASTER_ADDR:PORT for two kinds of connection:
//   feeds   every other rank sends its trace events, interned labels and status (activities,
//           memory, the collective its comm worker is in), and asks the hub before passing any
//           stepper gate: rank 0's Stepper decides for the whole world, so pausing, stepping a
//           ring step, a collective or an iteration works across processes exactly as it does
//           across threads (and keeps its no-deadlock rule, since it sees every rank's gates);
//   viewer  `dtlab --attach ADDR:PORT` (or a test) receives the run's configuration, every rank's
//           events (merged into rank 0's recorder), the stepper's state and the ranks' status,
//           and sends the stepper's commands. One viewer at a time; it may detach and attach again
//           (the recorder's window is replayed), and the run goes on freely while none is attached.
// A run with a monitor starts paused and waits for its first viewer up to monitor_wait_s, then
// fails with a sentence saying how to attach. Every other wait is bounded by the timeout, except a
// gate held by the person at the viewer; a lost connection ends those too.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/queued_comm.h"
#include "engine/comm/socket_mesh.h"  // WaitEnd
#include "engine/core/memory.h"
#include "engine/monitor/bounded_log.h"
#include "engine/monitor/step_report.h"  // BoundedLog<StepReport> holds them whole
#include "engine/trace/recorder.h"
#include "engine/trace/stepper.h"

namespace dtlab {


// What one rank is doing, as a viewer shows it.
struct RankMonitorStatus {
  std::string compute_activity = "starting";
  std::string comm_activity = "idle";
  MemoryStats memory;
  int64_t current_seq = -1;  // the collective its comm worker is in (at its gate or running), else -1
  int64_t done_seq = -1;     // the last collective it finished
  CollDesc desc;             // current_seq's call
  int steps_done = 0, steps = 0;
  bool connected = false;    // hub side: its feed is connected (rank 0: always)
  bool finished = false;     // it ended its run (Bye)
};

// The message types on a monitor connection; every frame is a 16-byte header and a payload.
enum class MonitorMsg : uint8_t {
  FeedHello = 1,  // feed -> hub: JSON {rank, world, start_ns}
  ViewerHello,    // viewer -> hub: empty
  Hello,          // hub -> viewer: JSON {config, world, total_steps, backend, device, start_ns, address}
  Refused,        // hub -> connection: one sentence, then the hub closes it
  Labels,         // JSON {first, labels}: the sender's label table from index `first`
  Events,         // raw Event structs (same build on every side)
  Status,         // feed -> hub: JSON of one RankMonitorStatus; hub -> viewer: JSON {stepper, ranks}
  GateRequest,    // feed -> hub: raw GateWire
  GateReply,      // hub -> feed: raw GateWire (ok set)
  Bye,            // feed -> hub: this rank ended its run; every event was sent before
  Report,         // hub -> viewer: JSON of one StepReport
  End,            // hub -> viewer: JSON {error}: the run ended (error empty: it finished)
  Command,        // viewer -> hub: JSON {cmd: run|pause|step, speed, kind}
};

// One framed TCP connection. send() is thread-safe and bounded by the timeout; recv() is for one
// reader thread.
class MonitorLink {
 public:
  MonitorLink(int fd, double timeout_s);
  ~MonitorLink();
  MonitorLink(const MonitorLink&) = delete;
  MonitorLink& operator=(const MonitorLink&) = delete;
  bool send(MonitorMsg type, const void* data, size_t bytes);
  bool send(MonitorMsg type, const std::string& text) { return send(type, text.data(), text.size()); }
  // Waits up to `wait_s` for the next frame to start (Timeout if none), then reads it whole.
  WaitEnd recv(MonitorMsg& type, std::string& payload, double wait_s);
  bool closed() const { return closed_.load(); }
  void close();  // wakes nothing by itself: readers poll with short waits

 private:
  int fd_;
  double timeout_s_;
  std::mutex send_mu_;
  std::atomic<bool> closed_{false};
};

// JSON form of a step's report as it crosses the wire (the others are in monitor_internal.h).
std::string step_report_to_json(const StepReport& r);
StepReport step_report_from_json(const std::string& text);

// Copies a recorder's news to a link: the labels added since the last call, then the events.
class EventPump {
 public:
  explicit EventPump(const TraceRecorder& rec);
  // Sends what is new on `ranks` (every rank when empty); false when the link failed.
  bool pump(MonitorLink& link, const std::vector<int>& ranks = {});

 private:
  const TraceRecorder& rec_;
  size_t labels_sent_ = 0;
  std::vector<uint64_t> next_order_;
  std::vector<Event> buf_;
};

struct MonitorOptions {
  std::string addr = "127.0.0.1";  // MASTER_ADDR: the hub listens here, feeds connect here
  int port = 0;                    // --monitor
  int rank = 0, world_size = 1;
  double timeout_s = 30;           // connects, sends, the last events at the end
  double wait_s = 300;             // hub: how long the paused run waits for its first viewer
};

// Rank 0's side. Owns the listener and its threads; the recorder and stepper are the Trainer's.
class MonitorHub {
 public:
  // Listens at once (dtlab::Error naming the port when it cannot); `on_fail` is called (once, from
  // a hub thread) when no viewer attached in time, with the sentence the run fails with.
  MonitorHub(const MonitorOptions& opt, TraceRecorder& rec, Stepper& stepper, std::string config_json,
             int64_t total_steps, std::function<RankMonitorStatus()> local_status,
             std::function<void(const std::string&)> on_fail);
  ~MonitorHub();
  MonitorHub(const MonitorHub&) = delete;
  MonitorHub& operator=(const MonitorHub&) = delete;

  int port() const { return opt_.port; }
  void add_report(const StepReport& r);
  // The run ended (`error` empty: finished). Waits (bounded by the timeout) for every feed's Bye so
  // the viewer gets every rank's last events, sends End, and gives the viewer a moment to read.
  void finish(const std::string& error);
  std::string failure() const;  // the on_fail sentence once it fired, else ""
  std::vector<RankMonitorStatus> ranks() const;

 private:
  struct Feed;
  void accept_loop();
  void feed_loop(std::shared_ptr<Feed> f);
  void gate_worker(std::shared_ptr<Feed> f, int lane);
  void viewer_loop(std::shared_ptr<MonitorLink> v);
  void command(const std::string& json);
  void ingest_events(Feed& f, const std::string& payload);

  MonitorOptions opt_;
  TraceRecorder& rec_;
  Stepper& stepper_;
  std::string config_json_;
  int64_t total_steps_;
  std::function<RankMonitorStatus()> local_status_;
  std::function<void(const std::string&)> on_fail_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ever_viewed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankMonitorStatus> status_;   // per rank (0: filled from local_status_)
  std::vector<std::shared_ptr<Feed>> feeds_;
  std::shared_ptr<MonitorLink> viewer_;
  BoundedLog<std::string> reports_{kMonitorKeptReports};  // JSON, the newest steps (a new viewer gets them)
  bool ended_ = false;
  std::string end_error_, failure_;
  std::thread accept_thread_;
  std::vector<std::thread> threads_;        // feed readers, gate workers, viewers (added by accept)
};

// A rank r > 0's side: feeds the hub and relays its gates (set it on the rank's Stepper).
class MonitorFeed : public GateRelay {
 public:
  // Connects (retrying up to the timeout while rank 0 starts). dtlab::Error naming the address
  // when the hub does not answer.
  MonitorFeed(const MonitorOptions& opt, TraceRecorder& rec, std::function<RankMonitorStatus()> status);
  ~MonitorFeed() override;
  bool gate(int rank, int lane, const GateInfo& g) override;
  // The rank's program ended: Bye now, so the deciding stepper stops waiting for this rank while
  // its communicator still tears down (its shutdown waits for peers that may be held at gates).
  void rank_done(int rank) override { finish(); }
  void cancel() override;
  bool holding() const override;
  // Sends the last events and Bye (the run ended here); once.
  void finish();

 private:
  bool flush_locked();  // events, labels and a changed status; call with send_mu_ held
  void pump_loop();
  void read_loop();
  MonitorOptions opt_;
  TraceRecorder& rec_;
  std::function<RankMonitorStatus()> status_fn_;
  std::unique_ptr<MonitorLink> link_;
  std::mutex send_mu_;  // orders flushes before gate requests
  EventPump pump_;
  std::string last_status_;
  bool bye_sent_ = false;  // under send_mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_id_ = 1;
  int waiting_ = 0;  // gates of this process waiting for the hub's answer
  std::map<uint64_t, int> replies_;  // id -> 1 open, 0 refused
  bool cancelled_ = false;
  std::atomic<bool> stop_{false};
  std::thread pump_thread_, read_thread_;
};

// The viewer's side: a mirror of the run, filled by a reader thread.
class MonitorClient {
 public:
  // Connects to "HOST:PORT" and reads the Hello (bounded by timeout_s); dtlab::Error with a
  // sentence naming the address when nothing answers or the hub refuses.
  MonitorClient(const std::string& address, double timeout_s = 10);
  ~MonitorClient();
  MonitorClient(const MonitorClient&) = delete;
  MonitorClient& operator=(const MonitorClient&) = delete;

  const std::string& address() const { return address_; }
  const std::string& config_json() const { return config_json_; }
  int world_size() const { return world_; }
  int64_t total_steps() const { return total_steps_; }
  const std::string& backend() const { return backend_; }
  const std::string& device() const { return device_; }
  TraceRecorder& recorder() { return *rec_; }  // every rank's events, as rank 0's hub has them

  StepperState stepper_state() const;
  std::vector<RankMonitorStatus> ranks() const;
  std::vector<StepReport> reports() const;  // the newest kMonitorKeptReports
  size_t report_count() const;              // every report received
  // The reports numbered `next` and after (0: the first of the run); sets `next` past the last.
  std::vector<StepReport> reports_since(size_t& next) const;
  bool ended() const;          // End came, or the connection closed
  bool wait_ended(double timeout_s) const;
  std::string error() const;   // the run's error, or why the connection closed; "" when it finished
  void run(double speed = 0);
  void pause();
  void step(GateKind kind);
  void set_focus(int rank, const std::string& group);  // the stepper's focus (Stepper::set_focus)
  // Waits until `pred` holds on the latest state or the timeout; for tests and scripts. `pred` runs
  // under the client's lock: it must not call the client.
  bool wait_for(const std::function<bool(const StepperState&, const std::vector<RankMonitorStatus>&)>& pred,
                double timeout_s) const;

 private:
  void read_loop();
  void send_command(const std::string& json);
  std::string address_;
  std::unique_ptr<MonitorLink> link_;
  std::string config_json_, backend_, device_;
  int world_ = 1;
  int64_t total_steps_ = 0;
  std::unique_ptr<TraceRecorder> rec_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  StepperState stepper_;
  std::vector<RankMonitorStatus> ranks_;
  BoundedLog<StepReport> reports_{kMonitorKeptReports};
  bool ended_ = false;
  std::string error_;
  std::atomic<bool> stop_{false};
  std::thread reader_;
};

// "HOST:PORT" -> host and port; dtlab::Error with the expected form otherwise.
void parse_monitor_address(const std::string& text, std::string& host, int& port);

}  // namespace dtlab
