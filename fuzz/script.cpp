// Feeds the bytes, as a --script file's text, to parse_script (app/script.h); the `lesson ...`
// commands go through check_lesson_command. Finding: anything but dtlab::Error, or an accepted
// command outside what the script language allows (a count below 1, a duration over an hour).
#include <cmath>

#include "app/script.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;
using namespace dtlab::app;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<ScriptCommand> cmds;
  if (!fuzz::accepts([&] { cmds = parse_script(text, "fuzz.txt"); })) return 0;
  for (const ScriptCommand& c : cmds) {
    fuzz::require(c.count >= 1 && c.line >= 1, "an accepted command with a count or line below 1");
    fuzz::require(std::isfinite(c.seconds) && c.seconds >= 0 && c.seconds <= 3600, "an accepted duration outside 0..3600 s");
    fuzz::require(std::isfinite(c.value) && c.value >= 0, "an accepted speed that is not a finite number >= 0");
  }
  return 0;
}
