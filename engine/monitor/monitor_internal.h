// What the monitor's hub, feed and client share beyond monitor.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "engine/monitor/monitor.h"
#include "engine/trace/stepper.h"

namespace dtlab {

// A gate crossing the wire: the request (feed -> hub) and, with `ok`, its answer.
struct GateWire {
  uint64_t id = 0;
  int32_t rank = 0, lane = 0;
  uint8_t kind = 0, ok = 0;
  uint8_t pad[6] = {};
  int64_t seq = 0;
  int32_t sub = 0, iter = 0, action = -1, iteration = -1;
  double model_time = 0;
  GatePos pos() const { return GatePos{seq, sub, iter, action}; }
};
static_assert(sizeof(GateWire) == 56, "GateWire is sent as raw bytes");

// JSON values of what the Status messages carry; a viewer's Status nests them, so they stay values
// (no text round trip) until the message is sent.
nlohmann::json status_json(const RankMonitorStatus& s);
RankMonitorStatus status_from(const nlohmann::json& j);
nlohmann::json stepper_json(const StepperState& s);
StepperState stepper_from(const nlohmann::json& j);

// Polling period of the monitor's loops: events reach a viewer within about this.
inline constexpr double kMonitorTickS = 0.02;

}  // namespace dtlab
