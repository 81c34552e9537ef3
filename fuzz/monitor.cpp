// Feeds the bytes, as what a monitor connection receives (engine/monitor), through MonitorLink's
// framing (a 16-byte header, then the payload) over a socket pair, and each frame's payload to the
// decoder (monitor_internal.h) the hub or the viewer runs for its type; labels and events are then
// applied as the hub applies them (its label map, shifted times, a 4-rank recorder). The loops drop
// a malformed message (they catch std::exception: a JSON error is a normal rejection here, as
// dtlab::Error is). Finding: a crash or sanitizer report, an allocation beyond what the bytes
// justify, or another throw.
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/monitor/monitor.h"
#include "engine/monitor/monitor_internal.h"
#include "engine/train/train.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;
using json = nlohmann::json;

namespace {

constexpr int kWorld = 4;
// What a socket pair buffers without a reader: larger inputs would block the write.
constexpr size_t kMaxInput = 64 << 10;

// What a hub keeps of one feed.
struct FeedState {
  int rank = 1;
  int64_t shift_ns = 0;
  std::vector<int32_t> label_map;
};

// Decodes one frame's payload as its receiver does; a malformed one throws, as there.
void decode(MonitorMsg type, const std::string& payload, TraceRecorder& rec, FeedState& feed) {
  switch (type) {
    case MonitorMsg::FeedHello: {
      const FeedHelloWire h = feed_hello_from(payload);
      feed.shift_ns = h.start_ns - rec.start_ns();
      break;
    }
    case MonitorMsg::Hello: hello_from(payload); break;
    case MonitorMsg::Labels: {
      const LabelsWire m = labels_from(payload);
      size_t at = m.first;
      for (const std::string& l : m.labels) {
        if (feed.label_map.size() <= at) feed.label_map.resize(at + 1, -1);
        feed.label_map[at++] = rec.intern(l);
      }
      break;
    }
    case MonitorMsg::Events:
      for (Event& e : events_from(payload)) {
        if (e.rank < 0 || e.rank >= kWorld) continue;
        e.wall_begin_ns += feed.shift_ns;
        e.wall_end_ns += feed.shift_ns;
        rec.record(e);
      }
      break;
    case MonitorMsg::Status:  // feed -> hub: one rank's status; hub -> viewer: {stepper, ranks}
      if (payload.find("\"stepper\"") != std::string::npos) viewer_status_from(payload);
      else status_from(json::parse(payload));
      break;
    case MonitorMsg::GateRequest:
    case MonitorMsg::GateReply: gate_from(payload); break;
    case MonitorMsg::Report: step_report_from_json(payload); break;
    case MonitorMsg::End: end_from(payload); break;
    case MonitorMsg::Command: command_from(payload); break;
    default: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return 0;
  int fds[2];
  fuzz::require(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0, "socketpair failed");
  MonitorLink link(fds[0], 1.0);  // owns fds[0]
  fuzz::require(::write(fds[1], data, size) == static_cast<ssize_t>(size), "the socket pair did not take the input");
  ::close(fds[1]);  // the end of the stream: a frame cut short closes the link
  TraceRecorder rec(kWorld, 64);
  FeedState feed;
  MonitorMsg type;
  std::string payload;
  while (link.recv(type, payload, 0) == WaitEnd::Ok) {
    try {
      decode(type, payload, rec, feed);
    } catch (const json::exception&) {
    } catch (const Error&) {
    }
  }
  return 0;
}
