// A pipeline schedule action (PyTorch's _Action) and its printable form, below every layer that
// names them: schedules and the pipeline runtime (engine/parallel) make them, events and traces
// (engine/trace) record and print them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace dtlab {

// PyTorch's _ComputationType, the part a pipeline runtime needs. B is the full backward; I
// (input gradient) and W (weight gradient) are its two halves, which zero-bubble schedules split.
enum class ActionType : uint8_t { Forward, Backward, BackwardInput, BackwardWeight, SendF, RecvF, SendB, RecvB };

struct Action {
  int stage = 0;
  ActionType type = ActionType::Forward;
  int mb = 0;  // micro-batch
  bool operator==(const Action&) const = default;
};

// Exactly PyTorch's _Action.__repr__: {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{mb}: "1B2", "0SEND_F1".
std::string action_str(const Action& a);
// The largest stage or micro-batch number a schedule may name (with kMaxScheduleCells in
// engine/parallel/pipeline_schedule.h, so a file cannot make the checks allocate without limit).
inline constexpr int kMaxScheduleIndex = 65535;
// The reverse; throws dtlab::Error "'XYZ' is not an action like 0F0 or 1B2" (or names a bound above).
Action parse_action(std::string_view text);
bool is_compute(ActionType t);  // F, B, I, W (not the send/recv actions)

}  // namespace dtlab
