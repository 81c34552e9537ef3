#include "app/repeats.h"

#include <cctype>
#include <cmath>
#include <set>
#include <utility>

#include "app/figures.h"
#include "app/spoilers.h"
#include "app/text.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/format.h"
#include "engine/train/train.h"

namespace dtlab::app {

namespace {

// One question as the course check sees it.
struct Asked {
  size_t lesson = 0;
  std::string where;             // "lessons/16_multinode_bandwidth.md:122"
  const Question* q = nullptr;
  double value = NAN;            // without a run; NaN when only the engine can tell
  std::string answer;            // the `answer:` text without blanks
  std::set<double> numbers;      // in the prompt, other than 0, 1 and 2
  std::set<std::string> figures; // the live figures the answer reads, by name without indices
  std::set<std::pair<int, int>> faults;  // (kind, rank) of the faults the run has when it is asked
  bool fault_ends_run = false;   // one of them outlasts the watchdog's timeout
  bool set_epoch_off = false;    // the loop never calls sampler.set_epoch (`set_epoch off`)
};

std::string without_blanks(const std::string& t) {
  std::string out;
  for (char c : t)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

// Numbers in the prompt's own words: not in {{figures}} or `code`, not inside a name ("ib2x4").
std::set<double> prompt_numbers(const std::string& ask) {
  std::set<double> out;
  bool figure = false, code = false;
  for (size_t i = 0; i < ask.size(); i++) {
    if (ask.compare(i, 2, "{{") == 0) figure = true;
    if (ask.compare(i, 2, "}}") == 0) figure = false;
    if (ask[i] == '`') code = !code;
    if (figure || code || !std::isdigit(static_cast<unsigned char>(ask[i]))) continue;
    if (i > 0 && (std::isalnum(static_cast<unsigned char>(ask[i - 1])) || ask[i - 1] == '.' || ask[i - 1] == ',')) continue;
    size_t e = i;
    const double v = std::stod(number_at(ask, i, e));
    if (v != 0 && v != 1 && v != 2) out.insert(v);
    i = e - 1;
  }
  return out;
}

// The faults and the timeout a list of dtlab flags sets.
void read_flags(const std::vector<std::string>& flags, std::vector<Fault>& faults, double& timeout_s) {
  for (size_t i = 0; i < flags.size(); i++) {
    std::string f = flags[i], value;
    if (const size_t eq = f.find('='); f.rfind("--", 0) == 0 && eq != std::string::npos) value = f.substr(eq + 1), f = f.substr(0, eq);
    else if (i + 1 < flags.size()) value = flags[i + 1];
    try {
      if (f == "--fault") faults.push_back(parse_fault(value));
      if (f == "--timeout") timeout_s = std::stod(value);
    } catch (const std::exception&) {  // the lesson's own check reports a bad flag
    }
  }
}

std::vector<Asked> questions_of(const Lesson& l, size_t index) {
  std::vector<Asked> out;
  std::vector<Fault> header_faults;
  double header_timeout = TrainConfig{}.timeout_s;
  read_flags(l.flags, header_faults, header_timeout);
  std::vector<Fault> faults = header_faults;
  double timeout = header_timeout;
  bool set_epoch_off = false;
  // As the lesson runner does: `scenario` restarts from the header's flags plus its own, `inject`
  // adds a fault to the run's.
  auto apply = [&](const LessonAction& a) {
    if (a.kind == LessonAction::Scenario) {
      faults = header_faults, timeout = header_timeout;
      read_flags(a.flags, faults, timeout);
    } else if (a.kind == LessonAction::Inject) {
      faults.push_back(a.fault);
    } else if (a.kind == LessonAction::Script) {  // "set_epoch off", "set set_epoch on"
      const std::vector<std::string> w = words(a.text);
      for (size_t i = 0; i + 1 < w.size(); i++)
        if (w[i] == "set_epoch") set_epoch_off = w[i + 1] == "off";
    }
  };
  for (const LessonStep& st : l.steps) {
    for (const LessonAction& a : st.actions) apply(a);
    if (!st.question) continue;
    const Question& q = *st.question;
    for (const LessonAction& a : q.reveal) apply(a);
    Asked a;
    a.lesson = index;
    a.where = l.path + ":" + std::to_string(q.line);
    a.q = &q;
    if (q.choices.empty()) {
      a.value = value_without_run(q.answer);
      if (!std::isfinite(a.value) && !q.expect.empty() && q.expect.names().empty()) a.value = value_without_run(q.expect);
    }
    a.answer = without_blanks(q.answer.text());
    a.numbers = prompt_numbers(q.ask);
    // The figures the run reveals (a view draws them); world, params and the like are the scenario's.
    for (const std::string& n : q.answer.names())
      if (!views_drawing(n).empty()) a.figures.insert(n.substr(0, n.find_first_of("[(")));
    for (const Fault& f : faults) {
      a.faults.insert({static_cast<int>(f.kind), f.rank});
      a.fault_ends_run |= f.kind == FaultKind::Skip || f.delay_s > timeout;
    }
    a.set_epoch_off = set_epoch_off;
    out.push_back(std::move(a));
  }
  return out;
}

// Why `later` repeats `earlier`, or "".
std::string repeats(const Asked& later, const Asked& earlier) {
  const Question& lq = *later.q;
  if (lq.unit == earlier.q->unit && std::isfinite(later.value) && std::isfinite(earlier.value) && lq.close(earlier.value, later.value)) {
    const std::string answer = format_figure(later.value) + (lq.unit.empty() ? "" : " " + lq.unit);
    if (later.answer == earlier.answer) return "the same answer (" + answer + ") to the same figure, " + lq.answer.text();
    for (double n : later.numbers)
      if (earlier.numbers.count(n))
        return "the same answer (" + answer + ") to a prompt with the same numbers (" + format_figure(n) + ")";
  }
  // The same experiment: a count or a share of the same figure is the same fact.
  const bool experiment = !later.faults.empty() || later.set_epoch_off;
  if (experiment && later.faults == earlier.faults && later.fault_ends_run == earlier.fault_ends_run &&
      later.set_epoch_off == earlier.set_epoch_off) {
    std::string same;
    for (const std::string& f : later.figures)
      if (earlier.figures.count(f)) same += (same.empty() ? "" : " and ") + f;
    if (!same.empty()) {
      std::string what = later.set_epoch_off ? "set_epoch off" : "";
      if (!later.faults.empty())
        what += std::string(what.empty() ? "" : ", ") + "the same faults " + (later.fault_ends_run ? "outlasting" : "within") +
                " the watchdog's timeout";
      return "the same experiment (" + what + ") asking the same live figures, " + same;
    }
  }
  return "";
}

}  // namespace

std::vector<Repeat> find_repeats(const std::vector<Lesson>& course) {
  std::vector<Asked> asked;
  for (size_t i = 0; i < course.size(); i++)
    for (Asked& a : questions_of(course[i], i)) asked.push_back(std::move(a));
  std::vector<Repeat> out;
  for (const Asked& later : asked)
    for (const Asked& earlier : asked) {
      if (earlier.lesson >= later.lesson) continue;  // a lesson's own earlier answers: find_text_spoiler
      if (std::string why = repeats(later, earlier); !why.empty()) {
        out.push_back({later.where, earlier.where, why});
        break;
      }
    }
  return out;
}

}  // namespace dtlab::app
