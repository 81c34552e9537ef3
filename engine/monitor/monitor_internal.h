// What the monitor's hub, feed and client share beyond monitor.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/monitor/monitor.h"
#include "engine/trace/stepper.h"

namespace dtlab {

// A gate crossing the wire (JSON): the request (feed -> hub) and, with `ok`, its answer.
struct GateWire {
  uint64_t id = 0;
  int32_t rank = 0, lane = 0;
  bool ok = false;
  GateInfo gate;
};
std::string gate_json(const GateWire& g);

// JSON values of what the Status messages carry; a viewer's Status nests them, so they stay values
// (no text round trip) until the message is sent.
nlohmann::json status_json(const RankMonitorStatus& s);
RankMonitorStatus status_from(const nlohmann::json& j);
nlohmann::json stepper_json(const StepperState& s);
StepperState stepper_from(const nlohmann::json& j);

// Polling period of the monitor's loops: events reach a viewer within about this.
inline constexpr double kMonitorTickS = 0.02;

// ---- decoders of what arrives on a connection ----
// Each takes a frame's payload and throws (a JSON error, or dtlab::Error for a number that is not a
// whole one in range or a value no dtlab run sends) when it is malformed: the hub's and the viewer's
// loops drop that message. None reads past the payload or allocates beyond what it holds.
inline constexpr int64_t kMaxMonitorNs = int64_t{1} << 62;         // wall times: shifts and differences stay in range
inline constexpr int64_t kMaxMonitorStepBytes = int64_t{1} << 40;  // one ring step's chunk: sums stay in range
inline constexpr int kMaxMonitorWorld = 1024;                // dtlab-cli launch's largest world
inline constexpr size_t kMaxMonitorLabels = size_t{1} << 20;  // interned labels of one recorder

struct FeedHelloWire {  // feed -> hub
  int rank = 0, world = 0;
  int64_t start_ns = 0;  // the feed's recorder start on the steady clock
};
FeedHelloWire feed_hello_from(const std::string& payload);

struct HelloWire {  // hub -> viewer
  std::string config, backend, device;
  int world = 1;
  int64_t total_steps = 0, start_ns = 0;
};
HelloWire hello_from(const std::string& payload);

struct LabelsWire {  // the sender's label table from index `first`
  size_t first = 0;
  std::vector<std::string> labels;
};
LabelsWire labels_from(const std::string& payload);

// The raw events of an Events payload (a trailing partial one is ignored); any rank, which each
// receiver checks against its own.
std::vector<Event> events_from(const std::string& payload);

GateWire gate_from(const std::string& payload);  // throws when malformed (a rank or lane out of range)

struct ViewerStatusWire {  // hub -> viewer: the stepper and every rank's status
  StepperState stepper;
  std::vector<RankMonitorStatus> ranks;
};
ViewerStatusWire viewer_status_from(const std::string& payload);

struct CommandWire {  // viewer -> hub: run (at speed), pause, step to the next gate of kind, or focus
  std::string cmd;
  double speed = 0;
  GateKind kind = GateKind::Collective;
  int focus_rank = -1;      // focus: a rank (-1 none)
  std::string focus_group;  // focus: a group by name ("" none)
};
CommandWire command_from(const std::string& payload);

std::string end_from(const std::string& payload);  // hub -> viewer: the run's error ("" when it finished)

}  // namespace dtlab
