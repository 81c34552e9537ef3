#include "app/lesson.h"
#include "app/script.h"
#include "app/text.h"
#include "engine/io/atomic_file.h"
#include "engine/train/settings.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace dtlab::app {

namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kHeaderKeys = {"title", "minutes", "summary", "scenario"};
// dtlab flags a header may set as `key: value` (others are accepted too, through `scenario:`): every
// training setting the lab takes (engine/train/settings.h's table, so a new setting is a header key
// at once) and the lab's own run flags. Flags about the window, scripts and lessons are refused below.
const std::vector<std::string>& scenario_flags() {
  static const std::vector<std::string> flags = [] {
    std::vector<std::string> f = {"clock", "open", "trace-model", "trace-ranks", "compare-profile"};
    for (const Setting& s : settings())
      if (s.scope == SettingScope::Both) f.push_back(std::string(s.flag).substr(2));
    return f;
  }();
  return flags;
}
const std::vector<std::string> kNotScenario = {"--script", "--run", "--screenshot", "--frames", "--bench-frames",
                                               "--presentation", "--running", "--speed", "--width", "--height",
                                               "--config-dir", "--lesson", "--play", "--help", "-h", "--version"};
const std::vector<std::string> kQuestionKeys = {"ask", "choice", "answer", "expect", "tolerance", "unit", "topic", "reveal", "explain"};
const std::vector<std::string> kActionWords = {"step", "focus", "run", "pause", "wait", "view", "clock", "set_epoch", "speed",
                                               "presentation", "reset", "set", "inject", "scenario", "mark", "expect",
                                               "select", "compare", "zoom", "sizing", "context"};  // select, compare, zoom: an opened trace's

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// "key: value" with key a bare word; false for anything else.
bool split_key(const std::string& line, std::string& key, std::string& value) {
  const size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  key = trim(line.substr(0, colon));
  if (key.empty() || !std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }))
    return false;
  value = trim(line.substr(colon + 1));
  return true;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& options) {
  const std::string near = closest_word(word, options);
  return near.empty() ? "" : "; did you mean '" + near + "'?";
}

// A scripted-run parse error says "ORIGIN command N 'line': WHAT; commands: ..."; a lesson wants WHAT.
std::string script_reason(const std::string& message) {
  size_t b = message.find("': ");
  b = b == std::string::npos ? 0 : b + 3;
  const size_t e = message.find("; commands:", b);
  return message.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// ---- the question block ----

double parse_number(const std::string& s, const std::string& what) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) throw Error(what + " '" + s + "' is not a number");
  return v;
}

Question parse_question(const std::vector<std::pair<int, std::string>>& lines, int line, Lesson& lesson) {
  Question q;
  q.line = line;
  std::string key, value;
  std::vector<std::pair<int, std::string>> explain_lines;
  auto at = [&](int l, auto&& f) {
    try {
      f();
    } catch (const LessonError&) {
      throw;
    } catch (const Error& e) {
      throw LessonError(lesson.path, l, e.what());
    }
  };
  for (const auto& entry : lines) {
    const auto l = entry.first;  // a plain variable: the lambda below captures it (clang 14 cannot capture bindings)
    const auto& raw = entry.second;
    if (trim(raw).empty() || starts_with(trim(raw), "#")) continue;
    if (std::isspace(static_cast<unsigned char>(raw[0]))) {  // a continuation of `ask:` or `explain:`
      if (key == "ask") q.ask += " " + trim(raw);
      else if (key == "explain") explain_lines.push_back({l, trim(raw)});
      else throw LessonError(lesson.path, l, "only ask: and explain: continue on indented lines");
      continue;
    }
    if (!split_key(raw, key, value) || std::find(kQuestionKeys.begin(), kQuestionKeys.end(), key) == kQuestionKeys.end())
      throw LessonError(lesson.path, l, "unknown question key '" + (split_key(raw, key, value) ? key : trim(raw)) + "'" +
                                            did_you_mean(key, kQuestionKeys) + " (keys: ask, choice, answer, expect, tolerance, unit, topic, reveal, explain)");
    at(l, [&] {
      if (key == "ask") q.ask = value;
      else if (key == "choice") {
        Choice c;
        const size_t eq = value.rfind(" = ");
        c.text = trim(value.substr(0, eq));
        c.value = Figure::parse(eq == std::string::npos ? std::to_string(q.choices.size() + 1) : trim(value.substr(eq + 3)));
        q.choices.push_back(c);
      } else if (key == "answer") q.answer = Figure::parse(value);
      else if (key == "expect") q.expect = Figure::parse(value);
      else if (key == "unit") q.unit = value;
      else if (key == "topic") q.topic = value;
      else if (key == "tolerance") {
        if (!value.empty() && value.back() == '%') q.tol_rel = parse_number(value.substr(0, value.size() - 1), "tolerance") / 100;
        else q.tol_abs = parse_number(value, "tolerance");
        // A negative tolerance would be ignored (the default comparison applies): refuse it.
        if (!(std::max(q.tol_rel, q.tol_abs) >= 0 && std::isfinite(std::max(q.tol_rel, q.tol_abs))))
          throw Error("tolerance: '" + value + "' is not 0 or more; write a number such as 0.01, or a percentage such as 5%");
      } else if (key == "reveal") {
        LessonAction a = parse_lesson_action(value);
        a.line = l;
        q.reveal.push_back(a);
      } else if (key == "explain") {
        explain_lines.push_back({l, value});
      }
    });
  }
  if (q.ask.empty()) throw LessonError(lesson.path, line, "the question has no ask: line");
  q.ask_prose = parse_prose({{line, q.ask}}, lesson);
  if (q.answer.empty()) throw LessonError(lesson.path, line, "the question has no answer: (the live figure to reveal, e.g. answer: collective.steps)");
  if (q.choices.size() == 1) throw LessonError(lesson.path, line, "a multiple-choice question needs at least two choice: lines");
  q.explain = parse_prose(explain_lines, lesson);
  return q;
}

}  // namespace

LessonError::LessonError(std::string f, int l, std::string s)
    : Error(f + (l > 0 ? ":" + std::to_string(l) : "") + ": " + s), file(std::move(f)), line(l), sentence(std::move(s)) {}

std::string Question::answer_hint() const {
  if (unit.empty()) {  // a share, a ratio or a count, as the question words it
    std::string a;
    for (char c : ask) a += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto has = [&](const char* w) { return a.find(w) != std::string::npos; };
    if (has("share") || has("fraction") || has("(0 to 1)")) return "0.25, 1/4 or 25%";
    if (has("how many times") || has("factor") || has(" / ")) return "e.g. 2.5 or 5/2";
    if (has("how many")) return "e.g. 12";  // (lesson 1's parameter count showed "0.25, 1/4 or 25%")
    return "0.25, 1/4 or 25%";
  }
  if (unit == "%") return "e.g. 25";
  if (unit.rfind("bytes", 0) == 0 || unit == "B") return "e.g. 4096 or 1.5e6";
  if (unit == "steps" || unit == "samples" || unit == "ranks" || unit == "messages" || unit == "buckets") return "e.g. 12";
  return "e.g. 2.5";  // ms, µs, s, KiB, GB, GiB, ...
}

bool Question::parse_answer(const std::string& typed, double& out) const {
  std::string t;
  for (char c : typed)
    if (c != ' ' && c != '\t' && c != ',') t += c;  // "1,500" and "1 / 4" as written by hand
  if (t.empty()) return false;
  double scale = 1;
  if (t.back() == '%') {
    t.pop_back();
    if (unit != "%") scale = 0.01;  // a share typed as a percentage
  }
  auto number = [](const std::string& s, double& v) {
    if (s.empty()) return false;
    char* end = nullptr;
    v = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size() && std::isfinite(v);
  };
  const size_t slash = t.find('/');
  double v = 0;
  if (slash == std::string::npos) {
    if (!number(t, v)) return false;
  } else {
    double a = 0, b = 0;
    if (!number(t.substr(0, slash), a) || !number(t.substr(slash + 1), b) || b == 0) return false;
    v = a / b;
  }
  out = v * scale;
  return true;
}

bool Question::close(double given, double live) const {
  if (tol_abs >= 0 || tol_rel >= 0)
    return std::fabs(given - live) <= std::max(tol_abs, 0.0) + std::max(tol_rel, 0.0) * std::fabs(live);
  if (live == std::floor(live) && std::fabs(live) < 1e15) return given == live;
  return std::fabs(given - live) <= 0.01 * std::fabs(live);
}

LessonAction parse_lesson_action(const std::string& text) {
  LessonAction a;
  a.text = trim(text);
  std::vector<std::string> w = words(a.text);
  if (w.empty()) throw Error("empty action");
  const std::string rest = trim(a.text.substr(w[0].size()));
  if (w[0] == "run" && w.size() >= 2 && w[1] == "until") {
    a.kind = LessonAction::RunUntil;
    std::string cond = trim(rest.substr(5));
    const size_t by = cond.rfind(" by ");
    if (by != std::string::npos) {
      const std::string gate = trim(cond.substr(by + 4));
      if (gate == "ring") a.by = GateKind::RingStep;
      else if (gate == "iteration") a.by = GateKind::Iteration;
      else if (gate == "layer") a.by = GateKind::Layer;
      else if (gate == "bucket") a.by = GateKind::Grad;
      else if (gate != "collective")
        throw Error("run until ... by takes ring, collective, layer, bucket or iteration, not '" + gate + "'");
      cond = trim(cond.substr(0, by));
    }
    if (cond.empty()) throw Error("run until needs a condition, e.g. run until bucket[1].ready");
    a.expr = Figure::parse(cond);
  } else if (w[0] == "inject") {
    // inject skip rank R collective K | inject delay rank R collective K ms M
    const bool skip = w.size() == 6 && w[1] == "skip", delay = w.size() == 8 && w[1] == "delay" && w[6] == "ms";
    if ((!skip && !delay) || w[2] != "rank" || w[4] != "collective")
      throw Error("inject takes 'skip rank R collective K' or 'delay rank R collective K ms M'");
    a.kind = LessonAction::Inject;
    a.fault = parse_fault(w[1] + ":rank=" + w[3] + ",collective=" + w[5] + (delay ? ",ms=" + w[7] : ""));
  } else if (w[0] == "scenario") {
    a.kind = LessonAction::Scenario;
    a.flags.assign(w.begin() + 1, w.end());
  } else if (w[0] == "mark") {
    if (w.size() != 2 || !std::all_of(w[1].begin(), w[1].end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
      throw Error("mark takes one name of letters, digits and _");
    a.kind = LessonAction::Mark;
    a.name = w[1];
  } else if (w[0] == "expect") {
    if (rest.empty()) throw Error("expect needs a condition, e.g. expect run.failed");
    a.kind = LessonAction::Expect;
    a.expr = Figure::parse(rest);
  } else if (w[0] == "screenshot" || w[0] == "quit" || w[0] == "lesson") {
    throw Error("'" + w[0] + "' belongs in a --run script, not in a lesson");
  } else if (std::find(kActionWords.begin(), kActionWords.end(), w[0]) != kActionWords.end()) {
    // `set clock modeled` is the script's `clock modeled`.
    std::string line = a.text;
    if (w[0] == "set") {
      const std::vector<std::string> settable = {"clock", "speed", "set_epoch", "presentation"};
      if (w.size() < 2 || std::find(settable.begin(), settable.end(), w[1]) == settable.end())
        throw Error("set takes clock, speed, set_epoch or presentation");
      line = rest;
    }
    try {
      std::vector<ScriptCommand> cmds = parse_script(line, "lesson");
      DTLAB_CHECK(cmds.size() == 1, "one action per line");
      a.script = cmds[0];
    } catch (const Error& e) {
      throw Error(script_reason(e.what()) + " (in '" + a.text + "')");
    }
  } else {
    const std::string near = closest_word(w[0], kActionWords);
    throw Error("unknown action '" + a.text + "'" + (near.empty() ? "; actions: step, run, run until, pause, wait, view, set, inject, scenario, mark, expect" : "; did you mean '" + near + (rest.empty() ? "" : " " + rest) + "'?"));
  }
  return a;
}

AppOptions lesson_options(const Lesson& lesson, const std::vector<std::string>& extra, int extra_line) {
  std::vector<std::string> args = {"dtlab"};
  std::vector<int> lines = {0};
  // A flag in `extra` replaces the header's (with the values after it); --fault adds another fault.
  std::vector<std::string> replaced;
  for (const std::string& f : extra)
    if (starts_with(f, "--") && f != "--fault") replaced.push_back(f);
  bool skipping = false;
  for (size_t i = 0; i < lesson.flags.size(); i++) {
    const std::string& f = lesson.flags[i];
    if (starts_with(f, "--")) skipping = std::find(replaced.begin(), replaced.end(), f) != replaced.end();
    if (!skipping) args.push_back(f), lines.push_back(lesson.flag_lines[i]);
  }
  for (const std::string& f : extra) args.push_back(f), lines.push_back(extra_line);
  const int header = lesson.flag_lines.empty() ? (extra_line ? extra_line : 1) : lesson.flag_lines.front();
  for (size_t i = 1; i < args.size(); i++) {
    const std::string flag = args[i].substr(0, args[i].find('='));  // the option parser reads --run=quit as --run quit
    if (std::find(kNotScenario.begin(), kNotScenario.end(), flag) != kNotScenario.end())
      throw LessonError(lesson.path, lines[i], flag + " is about the window, not the run; a scenario takes training flags such as --strategy, --world, --model, --fault");
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  AppOptions o;
  std::string error;
  if (parse_app_options(static_cast<int>(argv.size()), argv.data(), o, &error) != 0) {
    // Blame the flag the sentence names first.
    size_t best = std::string::npos;
    int line = header;
    for (size_t i = 1; i < args.size(); i++) {
      if (!starts_with(args[i], "--")) continue;
      for (size_t at = error.find(args[i]); at != std::string::npos; at = error.find(args[i], at + 1)) {
        const size_t end = at + args[i].size();
        if ((end == error.size() || (!std::isalnum(static_cast<unsigned char>(error[end])) && error[end] != '-')) && at < best)
          best = at, line = lines[i];
      }
    }
    throw LessonError(lesson.path, line, "scenario: " + error);
  }
  o.train.start_paused = true;
  return o;
}

namespace {

// One 'key: value' line of the header.
void parse_header_line(Lesson& l, const std::string& key, std::string value, int ln) {
  const std::string& path = l.path;
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
  std::string flag = key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  if (key == "title") l.title = value;
  else if (key == "summary") l.summary = value;
  else if (key == "minutes") {
    try {
      const double m = parse_number(value, "minutes");
      if (m < 1 || m > 60 || m != std::floor(m)) throw Error("minutes must be a whole number from 1 to 60");
      l.minutes = static_cast<int>(m);
    } catch (const Error& e) {
      throw LessonError(path, ln, e.what());
    }
  } else if (key == "scenario") {
    for (const std::string& w : words(value)) l.flags.push_back(w), l.flag_lines.push_back(ln);
  } else if (key == "open") {
    // A trace the lesson reads (dtlab --open): relative to the lesson file, so a lesson and the
    // traces it ships with move together.
    fs::path p(value);
    if (p.is_relative()) p = (fs::path(path).parent_path() / p).lexically_normal();
    l.flags.push_back("--open"), l.flag_lines.push_back(ln);
    l.flags.push_back(p.string()), l.flag_lines.push_back(ln);
  } else if (std::find(scenario_flags().begin(), scenario_flags().end(), flag) != scenario_flags().end()) {
    const bool on = value == "true" || value == "yes" || value == "on", off = value == "false" || value == "no" || value == "off";
    if (!off) l.flags.push_back("--" + flag), l.flag_lines.push_back(ln);
    if (!on && !off) l.flags.push_back(value), l.flag_lines.push_back(ln);
  } else {
    std::vector<std::string> known = kHeaderKeys;
    known.insert(known.end(), scenario_flags().begin(), scenario_flags().end());
    throw LessonError(path, ln, "unknown header key '" + key + "'" + did_you_mean(flag, known));
  }
}

// Header: between the first two '---' lines. Returns the index of the closing one; `header_start`
// gets the opening one's line number.
size_t parse_header(const std::vector<std::string>& lines, Lesson& l, int& header_start) {
  const std::string& path = l.path;
  size_t i = 0;
  while (i < lines.size() && trim(lines[i]).empty()) i++;
  if (i == lines.size() || trim(lines[i]) != "---")
    throw LessonError(path, static_cast<int>(i + 1), "a lesson starts with its header between two '---' lines (title:, minutes:, scenario:)");
  header_start = static_cast<int>(i + 1);
  for (i++; i < lines.size() && trim(lines[i]) != "---"; i++) {
    const int ln = static_cast<int>(i + 1);
    const std::string t = trim(lines[i]);
    if (t.empty() || t[0] == '#') continue;
    std::string key, value;
    if (!split_key(t, key, value)) throw LessonError(path, ln, "a header line is 'key: value', not '" + t + "'");
    parse_header_line(l, key, value, ln);
  }
  if (i == lines.size()) throw LessonError(path, header_start, "the header is not closed by a '---' line");
  if (l.title.empty()) throw LessonError(path, header_start, "the header has no title:");
  if (l.minutes == 0) throw LessonError(path, header_start, "the header has no minutes: (how long the lesson takes)");
  lesson_options(l);  // the scenario must parse as dtlab's flags
  return i;
}

// An ```action block's lines: one lesson command each.
void parse_action_block(const std::vector<std::pair<int, std::string>>& body, LessonStep& s, Lesson& l) {
  for (const auto& [bl, text] : body) {
    const std::string a = trim(text);
    if (a.empty() || a[0] == '#') continue;
    try {
      LessonAction act = parse_lesson_action(a);
      act.line = bl;
      if (act.kind == LessonAction::Scenario) lesson_options(l, act.flags, bl);
      s.actions.push_back(act);
    } catch (const LessonError&) {
      throw;
    } catch (const Error& e) {
      throw LessonError(l.path, bl, e.what());
    }
  }
}

// Body: '## ' starts a step; ```action and ```question blocks belong to the step they are in.
// Starts after the header's closing line `i`.
void parse_body(const std::vector<std::string>& lines, size_t i, int header_start, Lesson& l) {
  const std::string& path = l.path;
  std::vector<std::vector<std::pair<int, std::string>>> prose;
  auto step = [&]() -> LessonStep& {
    if (l.steps.empty()) {  // text before the first '## ' is a step named after the lesson
      l.steps.push_back(LessonStep{l.title, header_start, {}, {}, std::nullopt});
      prose.emplace_back();
    }
    return l.steps.back();
  };
  std::string fence;  // the open fence of a prose code block ("```" or "~~~"), so its '## ' stays code
  for (i++; i < lines.size(); i++) {
    const int ln = static_cast<int>(i + 1);
    const std::string& raw = lines[i];
    const std::string t = trim(raw);
    if (!fence.empty()) {
      if (starts_with(t, fence) && trim(t.substr(fence.size())).empty()) fence.clear();
      prose.back().push_back({ln, raw});
      continue;
    }
    if (starts_with(raw, "## ")) {
      l.steps.push_back(LessonStep{trim(raw.substr(3)), ln, {}, {}, std::nullopt});
      prose.emplace_back();
      continue;
    }
    if (starts_with(t, "```") || starts_with(t, "~~~")) {
      const std::string mark = t.substr(0, 3), info = trim(t.substr(3));
      if (info != "action" && info != "question") {
        step();
        fence = mark;
        prose.back().push_back({ln, raw});
        continue;
      }
      std::vector<std::pair<int, std::string>> body;
      size_t j = i + 1;
      for (; j < lines.size() && !(starts_with(trim(lines[j]), mark) && trim(lines[j]).size() == 3); j++)
        body.push_back({static_cast<int>(j + 1), lines[j]});
      if (j == lines.size()) throw LessonError(path, ln, "the ```" + info + " block is not closed by a ``` line");
      LessonStep& s = step();
      if (info == "action") {
        parse_action_block(body, s, l);
      } else {
        if (s.question) throw LessonError(path, ln, "one question per step; start a new '## ' step for the next one");
        s.question = parse_question(body, ln, l);
        for (const LessonAction& a : s.question->reveal)
          if (a.kind == LessonAction::Scenario) lesson_options(l, a.flags, a.line);
      }
      i = j;
      continue;
    }
    if (!t.empty() || !l.steps.empty()) step();
    if (!prose.empty()) prose.back().push_back({ln, raw});
  }
  if (!fence.empty()) throw LessonError(path, static_cast<int>(lines.size()), "a ``` code block is not closed");
  if (l.steps.empty()) throw LessonError(path, header_start, "the lesson has no steps; start one with a '## ' heading");
  for (size_t k = 0; k < l.steps.size(); k++) l.steps[k].prose = parse_prose(prose[k], l);
}

bool draw_name_ok(const std::string& n) {
  if (n.empty() || n.size() > 32 || !(std::islower(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_'; });
}

// The header's `draw: NAME = A | B | C` lines: each becomes a comment line (line numbers stay), one
// value per name is drawn from the seed (std::mt19937_64, so a seed draws the same values on every
// machine), and ${NAME} is replaced everywhere below the header's first line. Runs before the
// header is parsed, so the header's own flags may use the draws too.
void apply_draws(std::vector<std::string>& lines, Lesson& l, std::optional<uint64_t> seed) {
  size_t i = 0;
  while (i < lines.size() && trim(lines[i]).empty()) i++;
  if (i == lines.size() || trim(lines[i]) != "---") return;  // parse_header says what is wrong
  const size_t first = i + 1;
  std::vector<std::pair<std::string, std::vector<std::string>>> decls;
  for (i = first; i < lines.size() && trim(lines[i]) != "---"; i++) {
    const std::string t = trim(lines[i]);
    if (!starts_with(t, "draw:")) continue;
    const int ln = static_cast<int>(i + 1);
    const std::string rest = trim(t.substr(5));
    const size_t eq = rest.find('=');
    const std::string name = trim(rest.substr(0, eq));
    if (eq == std::string::npos || !draw_name_ok(name) || name == "seed")
      throw LessonError(l.path, ln, "a draw is 'draw: NAME = A | B | C', NAME in lower case letters, digits and _ (not 'seed'), not '" + t + "'");
    for (const auto& d : decls)
      if (d.first == name) throw LessonError(l.path, ln, "'" + name + "' is drawn twice; give each draw its own name");
    std::vector<std::string> values;
    std::string v;
    std::istringstream is(rest.substr(eq + 1));
    while (std::getline(is, v, '|')) values.push_back(trim(v));
    if (values.size() < 2 || std::any_of(values.begin(), values.end(), [](const std::string& x) { return x.empty(); }))
      throw LessonError(l.path, ln, "draw '" + name + "' needs two or more values between '|', none empty: 'draw: " + name + " = 3 | 5 | 7'");
    decls.push_back({name, values});
    lines[i] = "#";
  }
  if (decls.empty()) return;
  if (seed) {
    l.seed = *seed;
  } else {
    std::random_device rd;
    l.seed = 1 + rd() % 999999;
  }
  std::mt19937_64 rng(l.seed);
  for (const auto& [name, values] : decls) l.draws.push_back({name, values[rng() % values.size()]});
  std::vector<std::pair<std::string, std::string>> subs = l.draws;
  subs.push_back({"seed", std::to_string(l.seed)});
  for (size_t k = first; k < lines.size(); k++) {
    std::string& line = lines[k];
    for (size_t at = line.find("${"); at != std::string::npos; at = line.find("${", at)) {
      const size_t close = line.find('}', at);
      const std::string name = close == std::string::npos ? "" : line.substr(at + 2, close - at - 2);
      const auto it = std::find_if(subs.begin(), subs.end(), [&](const auto& d) { return d.first == name; });
      if (it == subs.end()) {
        std::vector<std::string> names;
        for (const auto& d : subs) names.push_back(d.first);
        std::string list;
        for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
        throw LessonError(l.path, static_cast<int>(k + 1),
                          "'${" + name + "}' is not drawn (this lesson draws " + list + ")" + did_you_mean(name, names));
      }
      line.replace(at, close + 1 - at, it->second);
      at += it->second.size();
    }
  }
}

}  // namespace

Lesson parse_lesson(const std::string& text, const std::string& path, std::optional<uint64_t> seed) {
  Lesson l;
  l.path = path;
  l.name = lesson_name(path);
  std::vector<std::string> lines;
  {
    std::istringstream is(text);
    for (std::string s; std::getline(is, s);) lines.push_back(s);
  }
  apply_draws(lines, l, seed);
  int header_start = 0;
  const size_t header_end = parse_header(lines, l, header_start);
  parse_body(lines, header_end, header_start, l);
  return l;
}

std::string lessons_dir() {
  if (const char* d = std::getenv("DTLAB_LESSONS"); d && *d) return d;
#ifdef DTLAB_LESSON_DIR
  return DTLAB_LESSON_DIR;
#else
  return "lessons";
#endif
}

std::vector<std::string> lesson_paths(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".md" && e.path().filename() != "README.md") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string lesson_name(const std::string& path) {
  std::string stem = fs::path(path).stem().string();
  size_t k = 0;
  while (k < stem.size() && std::isdigit(static_cast<unsigned char>(stem[k]))) k++;
  if (k > 0 && k < stem.size() && (stem[k] == '_' || stem[k] == '-')) stem.erase(0, k + 1);
  return stem;
}

Lesson load_lesson(const std::string& name_or_path, std::optional<uint64_t> seed) {
  std::string path = name_or_path;
  if (name_or_path.find('/') == std::string::npos && fs::path(name_or_path).extension() != ".md") {
    std::vector<std::string> names;
    path.clear();
    for (const std::string& p : lesson_paths(lessons_dir())) {
      names.push_back(lesson_name(p));
      if (lesson_name(p) == name_or_path || fs::path(p).stem() == name_or_path) path = p;
    }
    if (path.empty()) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      const std::string hint = did_you_mean(name_or_path, names);
      throw LessonError(lessons_dir(), 0, "no lesson '" + name_or_path + "'" +
                                              (hint.empty() ? "; the lessons are " + list + ", or give a PATH.md" : hint));
    }
  }
  if (const std::string why = not_a_regular_file(path); !why.empty()) throw LessonError(path, 0, "the lesson " + why);
  std::ifstream f(path);
  if (!f) throw LessonError(path, 0, "cannot read the lesson file");
  std::string text;
  if (!read_text_file(path, text)) throw LessonError(path, 0, "the lesson file is larger than 1 MiB; a lesson is a page of Markdown");
  return parse_lesson(text, path, seed);
}

std::string check_lesson_command(const std::string& arg) {
  const std::vector<std::string> w = words(arg);
  const std::string usage = "lesson takes open NAME, next, back, goto N, answer X, check, play, demo or close";
  if (w.empty()) return usage;
  const std::string& k = w[0];
  if ((k == "open" || k == "answer") && w.size() != 2) return "lesson " + k + " takes one argument";
  if (k == "goto" && (w.size() != 2 || std::atoi(w[1].c_str()) < 1)) return "lesson goto takes a step number from 1";
  if (k == "open" || k == "answer" || k == "goto") return "";
  for (const char* bare : {"next", "back", "check", "play", "demo", "close"})
    if (k == bare) return w.size() == 1 ? "" : "lesson " + k + " takes no argument";
  return "unknown lesson command '" + k + "'" + did_you_mean(k, {"open", "next", "back", "goto", "answer", "check", "play", "demo", "close"}) + "; " + usage;
}

}  // namespace dtlab::app
