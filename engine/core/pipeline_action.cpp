#include "engine/core/pipeline_action.h"

#include <charconv>

#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

constexpr const char* kTypeText[] = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};

}  // namespace

std::string action_str(const Action& a) {
  return std::to_string(a.stage) + kTypeText[static_cast<int>(a.type)] + std::to_string(a.mb);
}

bool is_compute(ActionType t) { return static_cast<int>(t) <= static_cast<int>(ActionType::BackwardWeight); }

Action parse_action(std::string_view text) {
  const std::string t = trim_blanks(text);
  const auto bad = [&] { return Error("'" + t + "' is not an action like 0F0 or 1B2"); };
  const char* p = t.data();
  const char* end = t.data() + t.size();
  const auto digit_at = [&](const char* q) { return q < end && *q >= '0' && *q <= '9'; };
  Action a;
  if (!digit_at(p)) throw bad();
  auto r = std::from_chars(p, end, a.stage);
  if (r.ec != std::errc()) throw bad();
  p = r.ptr;
  int type = -1;
  for (int i = 7; i >= 0; i--) {  // the long names first: SEND_F before F
    const std::string_view name = kTypeText[i];
    if (std::string_view(p, end - p).starts_with(name)) {
      type = i;
      p += name.size();
      break;
    }
  }
  if (type < 0) throw bad();
  a.type = static_cast<ActionType>(type);
  if (!digit_at(p)) throw bad();
  r = std::from_chars(p, end, a.mb);
  if (r.ec != std::errc() || r.ptr != end) throw bad();
  if (a.stage > kMaxScheduleIndex || a.mb > kMaxScheduleIndex)
    throw Error("'" + t + "' names " + (a.stage > kMaxScheduleIndex ? "stage " + std::to_string(a.stage) : "micro-batch " + std::to_string(a.mb)) +
                "; stages and micro-batches are numbered 0 to " + std::to_string(kMaxScheduleIndex));
  return a;
}

}  // namespace dtlab
