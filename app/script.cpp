#include "app/script.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <cmath>
#include <sstream>

#include "app/figures.h"
#include "app/lesson.h"
#include "app/text.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"
#include "engine/parallel/sizing.h"
#include "engine/trace/cost_model.h"
#include "engine/train/settings.h"

namespace dtlab::app {

namespace {

const char* kUsage =
    "commands: step ring|collective|layer|bucket|iteration|action [N], focus rank R|group NAME|none, run [SECONDS]s, "
    "pause, wait SECONDSs, "
    // (The views spelled with spaces: printed sentences shorten any word of over 120 characters.)
    "view ring | buckets | timeline | memory | inspector | data | shards | pipeline | topology | sweep | mesh | sizing | roofline | "
    "experts | alltoall | context | all, sizing KEY=VALUE ...|run, context block L [forward|backward]|follow, screenshot PATH.png, speed X, "
    "presentation on|off, fullscreen on|off, start on|off|ddp|fsdp|pipeline|course, check layout, clock modeled|wall, colour kind|peak, set_epoch on|off, generate TEXT, reset, quit, "
    "pin, unpin, compare --FLAG VALUE ... (run B with those settings beside the pinned A), "
    "lesson open NAME|next|back|goto N|answer X|check|play|demo|close; with --open: wait trace|compare [SECONDS]s, "
    "select collective K, compare [PROFILE], zoom all|iteration N|collective K, view collectives|breakdown|compare";

// The trace panels' own names, which `view` also takes.
const char* kTraceViews[] = {"collectives", "breakdown", "compare"};

// Every wait a script or lesson asks for is bounded: an hour is longer than any demo step.
constexpr double kMaxScriptSeconds = 3600;

bool parse_double(std::string t, double& out, bool seconds) {
  if (seconds && !t.empty() && t.back() == 's') t.pop_back();
  const char* b = t.data();
  auto [p, ec] = std::from_chars(b, b + t.size(), out);
  return ec == std::errc() && p == b + t.size() && std::isfinite(out) && out >= 0 && (!seconds || out <= kMaxScriptSeconds);
}

}  // namespace

bool read_text_file(const std::string& path, std::string& out, size_t max_bytes) {
  out.clear();
  std::ifstream f(path, std::ios::binary);
  char buf[65536];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    out.append(buf, static_cast<size_t>(f.gcount()));
    if (out.size() > max_bytes) return false;
  }
  return true;
}

const std::vector<std::string>& view_names() {
  static const std::vector<std::string> names = {"ring", "buckets", "timeline", "memory", "inspector", "data", "shards", "pipeline", "topology", "sweep", "mesh", "sizing", "roofline", "experts", "alltoall", "context", "all",
                                                 kTraceViews[0], kTraceViews[1], kTraceViews[2]};
  return names;
}

bool live_command(const ScriptCommand& c) {
  switch (c.kind) {
    case ScriptCommand::StepRing:
    case ScriptCommand::StepCollective:
    case ScriptCommand::StepIteration:
    case ScriptCommand::StepAction:
    case ScriptCommand::StepLayer:
    case ScriptCommand::StepBucket:
    case ScriptCommand::Focus:
    case ScriptCommand::Run:
    case ScriptCommand::Pause:
    case ScriptCommand::Speed:
    case ScriptCommand::Clock:
    case ScriptCommand::SetEpoch:
    case ScriptCommand::Generate:
    case ScriptCommand::Reset:
    case ScriptCommand::Pin:
    case ScriptCommand::Unpin:
    case ScriptCommand::CompareRun:
    case ScriptCommand::Lesson: return true;
    default: return false;
  }
}

bool trace_command(const ScriptCommand& c) {
  if (c.kind == ScriptCommand::View) return std::find(std::begin(kTraceViews), std::end(kTraceViews), c.arg) != std::end(kTraceViews);
  return c.kind == ScriptCommand::WaitFor || c.kind == ScriptCommand::Select || c.kind == ScriptCommand::Compare ||
         c.kind == ScriptCommand::Zoom;
}

std::vector<ScriptCommand> parse_script(const std::string& text, const std::string& origin) {
  std::vector<ScriptCommand> out;
  std::string norm = text;
  std::replace(norm.begin(), norm.end(), ';', '\n');
  std::istringstream is(norm);
  int line_no = 0;
  for (std::string line; std::getline(is, line);) {
    line_no++;
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::vector<std::string> w = words(line);
    if (w.empty()) continue;
    // A known command's error names what it takes; an unknown one's lists every command (kUsage).
    // (The command as written, its blanks trimmed and its bytes made printable: a NUL would end the
    // exception's text there.)
    auto fail = [&](const std::string& what) -> void {
      const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
      throw Error(tidy_sentence(origin + " command " + std::to_string(line_no) + " '" + line.substr(b, e - b + 1) + "': " + what));
    };
    // " (did you mean 'collective'?)" when `word` looks like a typo of one of `options`.
    auto near = [](const std::string& word, const std::vector<std::string>& options) -> std::string {
      const std::string n = closest_word(word, options);
      return n.empty() ? "" : " (did you mean '" + n + "'?)";
    };
    ScriptCommand c;
    c.line = line_no;
    const std::string& k = w[0];
    if (k == "step") {
      if (w.size() < 2) fail("step needs what to step: step ring|collective|layer|bucket|iteration|action [N]");
      if (w.size() > 3) fail("step takes what to step and one count, as in step collective 3");
      if (w[1] == "ring") c.kind = ScriptCommand::StepRing;
      else if (w[1] == "collective") c.kind = ScriptCommand::StepCollective;
      else if (w[1] == "iteration") c.kind = ScriptCommand::StepIteration;
      else if (w[1] == "action") c.kind = ScriptCommand::StepAction;
      else if (w[1] == "layer") c.kind = ScriptCommand::StepLayer;
      else if (w[1] == "bucket") c.kind = ScriptCommand::StepBucket;
      else fail("step takes ring, collective, layer, bucket, iteration or action" + near(w[1], {"ring", "collective", "layer", "bucket", "iteration", "action"}));
      if (w.size() == 3) {
        double n = 0;
        // Range first: converting 1e10 to int would be undefined behaviour.
        if (!parse_double(w[2], n, false) || n < 1 || n > 100000 || n != std::floor(n)) fail("the count must be a whole number from 1");
        c.count = static_cast<int>(n);
      }
    } else if (k == "focus") {
      c.kind = ScriptCommand::Focus;
      c.count = -1;
      double n = 0;
      if (w.size() == 2 && w[1] == "none") {
      } else if (w.size() == 3 && w[1] == "rank" && parse_double(w[2], n, false) && n <= 1023 && n == std::floor(n)) {
        c.count = static_cast<int>(n);
      } else if (w.size() == 3 && w[1] == "group") {
        c.arg = w[2];
      } else {
        fail("focus takes 'rank R' (a rank from 0), 'group NAME' (tp1, dp0, world...) or 'none'");
      }
    } else if (k == "wait" && w.size() >= 2 && (w[1] == "trace" || w[1] == "compare")) {
      c.kind = ScriptCommand::WaitFor;
      c.arg = w[1];
      c.seconds = w[1] == "trace" ? 300 : 120;  // a 100 MB trace on two cores; a second or two of training
      if (w.size() > 3 || (w.size() == 3 && !parse_double(w[2], c.seconds, true)))
        fail("wait " + w[1] + " takes at most one limit like 60s (0 to 3600 seconds)");
    } else if (k == "select") {
      double n = 0;
      if (w.size() != 3 || w[1] != "collective" || !parse_double(w[2], n, false) || n > 1e9 || n != std::floor(n))
        fail("select takes 'collective K', K the collective's number from 0 (the # column)");
      c.kind = ScriptCommand::Select;
      c.count = static_cast<int>(n);
    } else if (k == "compare" && w.size() >= 2 && w[1].rfind("--", 0) == 0) {
      // B's settings: the lab's flags; each must name a setting (its value is checked when B starts).
      c.kind = ScriptCommand::CompareRun;
      for (size_t i = 1; i < w.size(); i++) {
        if (w[i].rfind("--", 0) != 0) continue;
        const std::string flag = w[i].substr(0, w[i].find('='));
        bool known = find_setting(flag) != nullptr;
        for (const Setting& row : settings()) known = known || (*row.off_flag && flag == row.off_flag);
        if (!known) fail("compare: " + flag + " is not a setting of the lab; dtlab --help lists them");
      }
      for (size_t i = 1; i < w.size(); i++) c.arg += (i > 1 ? " " : "") + w[i];
    } else if (k == "pin" || k == "unpin") {
      if (w.size() != 1) fail(k + " takes no argument");
      c.kind = k == "pin" ? ScriptCommand::Pin : ScriptCommand::Unpin;
    } else if (k == "compare") {
      if (w.size() > 2) fail("compare takes at most a hardware profile (imported traces) or run B's flags (compare --bucket-cap-mb 25)");
      c.kind = ScriptCommand::Compare;
      if (w.size() == 2) {
        c.arg = w[1];
        try {
          if (c.arg != "this" && c.arg != "ideal") find_profile(c.arg);  // "this" measures the machine: not here
        } catch (const Error& e) {
          fail(e.what());
        }
      }
    } else if (k == "zoom") {
      double n = 0;
      const bool all = w.size() == 2 && w[1] == "all";
      if (!all && (w.size() != 3 || (w[1] != "iteration" && w[1] != "collective") || !parse_double(w[2], n, false) || n > 1e9 ||
                   n != std::floor(n)))
        fail("zoom takes all, iteration N (rank 0's ProfilerSteps in time order, from 0) or collective K");
      c.kind = ScriptCommand::Zoom;
      c.arg = w[1];
      c.count = static_cast<int>(n);
    } else if (k == "run" || k == "wait") {
      c.kind = k == "run" ? ScriptCommand::Run : ScriptCommand::Wait;
      if (w.size() > 2 || (k == "wait" && w.size() != 2)) fail(k + " takes one duration like 0.5s");
      if (w.size() == 2 && !parse_double(w[1], c.seconds, true))
        fail("'" + w[1] + "' is not a duration like 0.5s (0 to 3600 seconds)");
    } else if (k == "pause" || k == "quit" || k == "reset") {
      if (w.size() != 1) fail(k + " takes no argument");
      c.kind = k == "pause" ? ScriptCommand::Pause : k == "quit" ? ScriptCommand::Quit : ScriptCommand::Reset;
    } else if (k == "view") {
      if (w.size() != 2 || std::find(view_names().begin(), view_names().end(), w[1]) == view_names().end())
        fail("view takes one of ring, buckets, timeline, memory, inspector, data, shards, pipeline, topology, sweep, mesh, sizing, roofline, experts, alltoall, context, all (with --open: timeline, "
             "collectives, breakdown, compare, all)" + (w.size() == 2 ? near(w[1], view_names()) : std::string()));
      c.kind = ScriptCommand::View;
      c.arg = w[1];
    } else if (k == "sizing") {
      // The Sizing view's settings: checked here, so a bad key fails where it is written.
      if (w.size() < 2) fail("sizing takes the calculator's settings, e.g. sizing params=70B dp=128 tp=1 precision=fp16");
      std::string spec;
      for (size_t i = 1; i < w.size(); i++) spec += (i > 1 ? " " : "") + w[i];
      if (spec != "run") {  // `sizing run`: the view's "Run it scaled down"
        try {
          parse_sizing_spec(spec);
        } catch (const Error& e) {
          fail(e.what());
        }
      }
      c.kind = ScriptCommand::Sizing;
      c.arg = spec;
    } else if (k == "context") {
      // The Context view's block: `context block L [forward|backward]` holds it there, `context follow`
      // goes back to the pass running now.
      double n = 0;
      c.kind = ScriptCommand::Context;
      if (w.size() == 2 && w[1] == "follow") {
        c.count = -1;
        c.arg = "follow";
      } else if ((w.size() == 3 || w.size() == 4) && w[1] == "block" && parse_double(w[2], n, false) && n <= 1023 && n == std::floor(n) &&
                 (w.size() == 3 || w[3] == "forward" || w[3] == "backward")) {
        c.count = static_cast<int>(n);
        c.arg = w.size() == 4 ? w[3] : "forward";
      } else {
        fail("context takes 'block L' (a GPT block from 0) with forward (the default) or backward, or 'follow'");
      }
    } else if (k == "generate") {
      c.kind = ScriptCommand::Generate;
      c.arg = line.substr(line.find("generate") + 8);
      c.arg.erase(0, c.arg.find_first_not_of(" \t"));
      c.arg.erase(c.arg.find_last_not_of(" \t\r") + 1);
      if (c.arg.empty()) fail("generate takes the text to continue, e.g. generate Shall I compare thee");
    } else if (k == "screenshot") {
      if (w.size() != 2) fail("screenshot takes one PATH.png");
      c.kind = ScriptCommand::Screenshot;
      c.arg = w[1];
    } else if (k == "speed") {
      if (w.size() != 2 || !parse_double(w[1], c.value, false)) fail("speed takes modeled seconds per wall second, e.g. 0.001");
      c.kind = ScriptCommand::Speed;
    } else if (k == "presentation" || k == "set_epoch" || k == "fullscreen") {
      if (w.size() != 2 || (w[1] != "on" && w[1] != "off")) fail(k + " takes on or off");
      c.kind = k == "presentation" ? ScriptCommand::Presentation
               : k == "fullscreen" ? ScriptCommand::FullScreen : ScriptCommand::SetEpoch;
      c.arg = w[1];
    } else if (k == "check") {
      if (w.size() != 2 || w[1] != "layout") fail("check takes layout (the windows that cut off or scroll their content)");
      c.kind = ScriptCommand::CheckLayout;
    } else if (k == "start") {
      static const char* kWords[] = {"on", "off", "ddp", "fsdp", "pipeline", "course"};
      if (w.size() != 2 || std::find(std::begin(kWords), std::end(kWords), w[1]) == std::end(kWords))
        fail("start takes on, off (the start screen), or one of its choices: ddp, fsdp, pipeline, course");
      c.kind = ScriptCommand::StartScreen;
      c.arg = w[1];
    } else if (k == "clock") {
      if (w.size() != 2 || (w[1] != "modeled" && w[1] != "wall")) fail("clock takes modeled or wall");
      c.kind = ScriptCommand::Clock;
      c.arg = w[1];
    } else if (k == "colour") {
      if (w.size() != 2 || (w[1] != "kind" && w[1] != "peak"))
        fail("colour takes kind (the timeline's spans by kind) or peak (by their fraction of the device's roof)");
      c.kind = ScriptCommand::Colour;
      c.arg = w[1];
    } else if (k == "lesson") {
      c.kind = ScriptCommand::Lesson;
      c.arg = line.substr(line.find("lesson") + 6);
      c.arg.erase(0, c.arg.find_first_not_of(" \t"));
      c.arg.erase(c.arg.find_last_not_of(" \t\r") + 1);
      if (const std::string why = check_lesson_command(c.arg); !why.empty()) fail(why);
    } else {
      static const std::vector<std::string> kCommands = {"step", "focus", "run", "pause", "wait", "view", "sizing", "context", "screenshot",
                                                         "speed", "presentation", "fullscreen", "start", "check", "clock", "colour",
                                                         "set_epoch", "generate", "reset", "quit", "pin", "unpin", "compare", "lesson",
                                                         "select", "zoom"};
      fail("unknown command '" + k + "'" + near(k, kCommands) + "; " + kUsage);
    }
    out.push_back(c);
  }
  return out;
}

std::string screenshot_path_problem(const std::string& path, const std::string& what) {
  std::string ext = path.size() >= 4 ? path.substr(path.size() - 4) : "";
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (ext != ".png") return what + " " + path + ": the lab writes PNG images; give a name ending in .png";
  try {
    check_output_path(what, path);  // the directory exists, and the name is no directory
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dtlab::app
