// Lessons (app/lesson.h, app/lesson_runner.h, app/figures.h): every lesson in lessons/ parses;
// broken files give "file:line: one sentence"; live figures evaluate on snapshots; a lesson runs on
// a live Session exactly as the app runs it, and what it reveals equals the engine's figures;
// progress survives a restart. Playing each lesson in the lab under Xvfb is CTest's lesson_<name>.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <deque>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "app/lesson_runner.h"
#include "tests/test_util.h"
#include "test_util.h"

using namespace dtlab;
using namespace dtlab::app;

using dtlab::test::read_file;

namespace {

const std::string kSource = DTLAB_SOURCE_DIR;

// The sentence a broken lesson fails with ("" when it parses).
std::string lesson_error(const std::string& text, const std::string& path = "t.md") {
  try {
    parse_lesson(text, path);
  } catch (const LessonError& e) {
    return e.what();
  }
  return "";
}

// A lesson header of 8 lines (one more per extra line), so a step's lines are easy to count.
std::string header(const std::string& extra = "") {
  return "---\ntitle: t\nminutes: 5\nstrategy: ddp\nworld: 4\nmodel: small\nprofile: nvlink8\n" + extra + "---\n";
}

// Steps the run n gates on, as the app's step commands do, and waits until every rank is still.
void step_on(Session& s, GateKind k, int n) {
  for (int i = 0; i < n; i++) {
    REQUIRE(s.wait_settled(std::chrono::seconds(20)));
    s.step(k);
  }
  REQUIRE(s.wait_settled(std::chrono::seconds(20)));
}

// Runs commands the way the app's queue does: engine steps on the session, lesson commands through
// the runner with their follow-ups first. Returns the first failure, "" when none.
std::string drive(LessonRunner& r, Session& s, const std::vector<std::string>& lesson_cmds, int* code = nullptr) {
  std::deque<ScriptCommand> q;
  for (const std::string& a : lesson_cmds) {
    ScriptCommand c;
    c.kind = ScriptCommand::Lesson;
    c.arg = a;
    q.push_back(c);
  }
  for (int guard = 0; !q.empty(); guard++) {
    REQUIRE(guard < 100000);
    const ScriptCommand c = q.front();
    q.pop_front();
    switch (c.kind) {
      case ScriptCommand::StepRing:
      case ScriptCommand::StepCollective:
      case ScriptCommand::StepIteration: {
        step_on(s, c.kind == ScriptCommand::StepRing ? GateKind::RingStep
                   : c.kind == ScriptCommand::StepCollective ? GateKind::Collective : GateKind::Iteration, c.count);
        break;
      }
      case ScriptCommand::SetEpoch: s.set_data_set_epoch(c.arg == "on"); break;
      case ScriptCommand::Lesson: {
        LessonRunner::Result res = r.exec(c.arg, s);
        if (code) *code = res.code;
        if (!res.failure.empty()) return res.failure;
        if (res.again) {  // the app comes back next frame
          q.push_front(c);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        q.insert(q.begin(), res.then.begin(), res.then.end());
        break;
      }
      default: break;  // views, clock, presentation: the window's business
    }
  }
  return "";
}

// Bytes rank `src` sent in collective #seq, summed from the snapshot's step events here in the
// test, independently of app/figures.cpp.
int64_t bytes_sent(const Snapshot& s, uint64_t seq, int src) {
  int64_t b = 0;
  for (const auto& rank_events : s.events)
    for (const Event& e : rank_events)
      if (e.kind == EventKind::RingStep && e.step.seq == seq && e.step.src == src) b += e.step.bytes;
  return b;
}

// A question's prose as the lesson panel prints it: the spans app/views/lesson_view.cpp draws, each
// {{figure}} through LessonRunner::figure_text.
std::string shown(const LessonRunner& r, const Prose& prose, const Snapshot& s) {
  std::string t;
  for (const Block& b : prose) {
    for (const Span& sp : b.spans) t += sp.figure >= 0 ? r.figure_text(sp.figure, s) : sp.text;
    t += "\n";
  }
  return t;
}

}  // namespace

TEST_SUITE("lessons") {
  TEST_CASE("the course: every lesson parses, takes 5 to 25 minutes and asks questions") {
    const std::vector<std::string> paths = lesson_paths(kSource + "/lessons");
    CHECK(paths.size() >= 10);
    for (const std::string& p : paths) {
      INFO(p);
      Lesson l;
      REQUIRE_NOTHROW(l = load_lesson(p));
      CHECK(l.minutes >= 5);
      CHECK(l.minutes <= 25);  // the interview drill's eleven questions are the longest play
      CHECK(!l.summary.empty());
      int questions = 0;
      for (const LessonStep& st : l.steps) questions += st.question ? 1 : 0;
      CHECK(questions >= 3);
      CHECK(load_lesson(lesson_name(p)).path == p);  // found by its name too
    }
  }

  TEST_CASE("lessons/README.md: its example parses and it documents every live figure") {
    const std::string readme = read_file(kSource + "/lessons/README.md");
    const size_t b = readme.find("````markdown\n"), e = readme.find("\n````", b + 13);
    REQUIRE(b != std::string::npos);
    REQUIRE(e != std::string::npos);
    const Lesson l = parse_lesson(readme.substr(b + 13, e - b - 13), "README example");
    CHECK(l.steps.size() == 1);
    CHECK(l.steps[0].question.has_value());
    for (const FigureInfo& f : figure_vocabulary()) {
      INFO(f.name);
      CHECK(readme.find("`" + f.name + "`") != std::string::npos);
    }
  }

  TEST_CASE("broken lesson files: file:line and one sentence saying what is wrong") {
    const std::string dir = kSource + "/tests/data/lessons/";
    auto error_of = [&](const std::string& file) {
      try {
        load_lesson(dir + file);
      } catch (const LessonError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    // A file that never ends is not read at all (a device), and a long one not to its end.
    CHECK_THROWS_WITH_AS(load_lesson("/dev/zero"), "/dev/zero: the lesson is a device, not a regular file; save its contents to a file and give that path",
                         LessonError);
    {
      test::TempDir big;
      std::ofstream(big.file("big.md")) << std::string((1 << 20) + 1, '#');
      CHECK_THROWS_WITH_AS(load_lesson(big.file("big.md")), (big.file("big.md") + ": the lesson file is larger than 1 MiB; a lesson is a page of Markdown").c_str(),
                           LessonError);
    }
    CHECK(error_of("broken_action.md") == dir + "broken_action.md:13: unknown action 'stp collective'; did you mean 'step collective'?");
    CHECK(error_of("broken_figure.md") == dir + "broken_figure.md:16: unknown live figure 'collective.byte'; did you mean 'collective.bytes'?");
    CHECK(error_of("broken_header.md").rfind(dir + "broken_header.md:5: scenario: --world 17 is more ranks than the lab draws; use 1 to 16", 0) == 0);
    CHECK(error_of("broken_question.md").rfind(dir + "broken_question.md:11: unknown question key 'anwser'; did you mean 'answer'?", 0) == 0);
    // More mistakes, inline.
    const std::string h = header();
    CHECK(lesson_error("no header") == "t.md:1: a lesson starts with its header between two '---' lines (title:, minutes:, scenario:)");
    CHECK(lesson_error("---\ntitle: t\n---\n## a\n") == "t.md:1: the header has no minutes: (how long the lesson takes)");
    CHECK(lesson_error("---\ntitle: t\nminutes: 5\nwrld: 4\n---\n") == "t.md:4: unknown header key 'wrld'; did you mean 'world'?");
    CHECK(lesson_error("---\ntitle: t\nminutes: 5\nscenario: --width 300\n---\n").rfind("t.md:4: --width is about the window", 0) == 0);
    // Written --flag=value (found by fuzz/lesson.cpp: it slipped past the refusal, so a lesson could
    // run a script or read one from any file): refused the same way.
    CHECK(lesson_error("---\ntitle: t\nminutes: 5\nscenario: --run=quit\n---\n").rfind("t.md:4: --run is about the window", 0) == 0);
    CHECK(lesson_error("---\ntitle: t\nminutes: 5\nscenario: --script=/dev/null\n---\n").rfind("t.md:4: --script is about the window", 0) == 0);
    CHECK(lesson_error("---\ntitle: t\nminutes: 5\nstrategy: ddp\nsharding: full\n---\n") == "t.md:5: scenario: --sharding configures FSDP; add --strategy fsdp --world N");
    CHECK(lesson_error(h + "## a\n```action\nstep sideways\n```\n") == "t.md:11: step takes ring, collective, layer, bucket, iteration or action (in 'step sideways')");
    // A negative tolerance would be ignored silently: refused at its line.
    for (const char* tol : {"-1", "-5%"}) {
      CAPTURE(tol);
      CHECK(lesson_error(h + "## a\n```question\nask: n?\nanswer: world\ntolerance: " + tol + "\n```\n")
                .find("t.md:13: tolerance: '" + std::string(tol) + "' is not 0 or more") != std::string::npos);
    }
    CHECK(lesson_error(h + "## a\n```action\ninject skip rank 9\n```\n").rfind("t.md:11: inject takes", 0) == 0);
    CHECK(lesson_error(h + "## a\n```action\nrun until bucket[0].redy\n```\n") == "t.md:11: unknown live figure 'bucket[].redy'; did you mean 'bucket[I].ready'?");
    CHECK(lesson_error(h + "## a\n```action\nscreenshot x.png\n```\n") == "t.md:11: 'screenshot' belongs in a --run script, not in a lesson");
    CHECK(lesson_error(h + "## a\n```action\nscenario --world 99\n```\n").rfind("t.md:11: scenario: --world: 99 is out of range; use 1 to 64", 0) == 0);
    CHECK(lesson_error(h + "## a\n```question\nask: x?\n```\n") == "t.md:10: the question has no answer: (the live figure to reveal, e.g. answer: collective.steps)");
    CHECK(lesson_error(h + "## a\n```question\nask: x?\nchoice: only\nanswer: 1\n```\n") == "t.md:10: a multiple-choice question needs at least two choice: lines");
    CHECK(lesson_error(h + "## a\n```question\nask: x?\nanswer: 1\n```\n```question\nask: y?\nanswer: 2\n```\n") == "t.md:14: one question per step; start a new '## ' step for the next one");
    CHECK(lesson_error(h + "## a\n```action\nstep ring\n") == "t.md:10: the ```action block is not closed by a ``` line");
    CHECK(lesson_error(h + "## a\nThe value {{world + }} is\n") == "t.md:10: a value is missing at column 8 of 'world +'");
    // The figure markers (private use U+E000, U+E001) in a lesson's own text: refused, never looped on.
    CHECK(lesson_error(h + "## a\nmarker \xEE\x80\x80 without its close {{world}}\n") ==
          "t.md:10: the private-use character U+E000 is reserved for live figures; delete it from the text");
    CHECK(lesson_error(h + "## a\nclose \xEE\x80\x81 alone\n") ==
          "t.md:10: the private-use character U+E001 is reserved for live figures; delete it from the text");
    // A fenced code block in prose keeps its '## ' lines as code.
    const Lesson ok = parse_lesson(h + "## a\n```python\n## not a step\n```\n## b\ntext\n", "t.md");
    CHECK(ok.steps.size() == 2);
  }

  TEST_CASE("prose: md4c blocks and spans, with {{figures}} inline") {
    const Lesson l = parse_lesson(header() +
                                      "## Intro\nSome **bold**, *em* and `code`, with {{world}} ranks.\n\n- one\n- two\n\n"
                                      "| a | b |\n|---|---|\n| 1 | 2 |\n\n> a quote\n\n```python\nx = 1\n```\n",
                                  "t.md");
    REQUIRE(l.steps.size() == 1);
    const Prose& p = l.steps[0].prose;
    REQUIRE(p.size() >= 7);
    CHECK(p[0].kind == Block::Paragraph);
    bool bold = false, em = false, code = false, fig = false;
    for (const Span& s : p[0].spans) {
      bold |= s.style == Span::Strong && s.text == "bold";
      em |= s.style == Span::Em && s.text == "em";
      code |= s.style == Span::Code && s.text == "code";
      fig |= s.figure == 0;
    }
    CHECK((bold && em && code && fig));
    CHECK(l.figures.size() == 1);
    CHECK(p[1].kind == Block::Item);
    CHECK(p[1].bullet == "•");
    CHECK(p[3].kind == Block::TableRow);
    CHECK(p[3].cells.size() == 2);
    CHECK(p[5].kind == Block::Quote);
    CHECK(p[6].kind == Block::Code);
    CHECK(p[6].code == "x = 1\n");
  }

  TEST_CASE("live figures: parse errors, arithmetic, snapshots and the engine's formulas") {
    auto parse_error = [](const std::string& t) {
      try {
        Figure::parse(t);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    CHECK(parse_error("collective.byte") == "unknown live figure 'collective.byte'; did you mean 'collective.bytes'?");
    CHECK(parse_error("memory.rank[0].paramters") == "unknown live figure 'memory.rank[].paramters'; did you mean 'memory.rank[R].parameters'?");
    CHECK(parse_error("plan.total(7e9, 8)") == "'plan.total()' is written plan.total(P, N, SHARDING, DTYPE?)");
    CHECK(parse_error("plan.total(7e9, 8, full)").rfind("unknown live figure 'full'", 0) == 0);
    CHECK(parse_error("plan.total(7e9, \"8\", \"full\")") == "argument 2 of plan.total(P, N, SHARDING, DTYPE?) is a number");
    CHECK(parse_error("(world") == "expected ')' at column 7 of '(world'");
    Snapshot s;
    s.config.world = 4;
    s.config.batch = 16;
    s.config.accum = 2;
    s.config.num_params = 4547;
    const FigureScope sc{&s, nullptr};
    CHECK(Figure::parse("effective_batch").eval(sc) == 128);
    CHECK(Figure::parse("2 * (world - 1) / world").eval(sc) == doctest::Approx(1.5));
    CHECK(Figure::parse("world == 4 && !(batch > 16) || 0").eval(sc) == 1);
    CHECK(Figure::parse("0 || world == 4").eval(sc) == 1);  // a false left side: the right one decides
    CHECK(Figure::parse("0 || 0").eval(sc) == 0);
    CHECK(Figure::parse("-world + 10 / 4").eval(sc) == doctest::Approx(-1.5));
    // checkpoint.elements counts FSDP's shards of full layers: a --tp run's is a sentence, not a wrong count.
    s.config.strategy = Strategy::Fsdp;
    s.mesh.shape = MeshShape{2, 1, 2};
    CHECK_THROWS_WITH_AS(Figure::parse("checkpoint.elements(0)").eval(sc), doctest::Contains("splits them with --tp 2"), Error);
    s.config.strategy = Strategy::Single;
    s.mesh.shape = MeshShape{};
    // Hostile sizes: thousands deep or long is one sentence, not a stack overflow; the longest chain
    // allowed parses, evaluates and is destroyed.
    auto repeat = [](const std::string& x, int n) {
      std::string r;
      for (int i = 0; i < n; i++) r += x;
      return r;
    };
    for (const std::string& deep : {repeat("(", 3000) + "1" + repeat(")", 3000), repeat("-", 5000) + "1", repeat("!", 100) + "1",
                                    "plan.total(" + repeat("(", 40) + "1" + repeat(")", 40) + ", 8, \"full\")"}) {
      CAPTURE(deep.substr(0, 20));
      const std::string e = parse_error(deep);
      CHECK((e.find("nests deeper than 64 levels") != std::string::npos || e.find("characters long; keep it under 2000") != std::string::npos));
    }
    CHECK(parse_error(repeat("1 + ", 4000) + "1").find("characters long; keep it under 2000") != std::string::npos);
    CHECK(Figure::parse(repeat("1+", 999) + "1").eval(sc) == 1000);
    // Arguments a lesson may choose that break a formula's assumptions: one sentence (dtlab::Error,
    // which the panel and Check show), never another exception that would end the lab.
    for (const char* hostile : {"cost.allreduce_us(\"nvlink8\", 0, 1e6)", "schedule.peak(\"1f1b\", 4, 8, 9)",
                                "schedule.peak(\"1f1b\", 4, 8, -1)", "algo.sent(\"ring\", 4, 1e6, 7)",
                                "schedule.steps(\"gpipe\", 1e9, 1e9)", "algo.busiest(\"ring\", 1e300, 8)",
                                "plan.total(1/0, 8, \"full\")", "algo.steps(\"ring\", 0)"}) {
      CAPTURE(hostile);
      try {
        Figure::parse(hostile).eval(sc);
      } catch (const Error&) {
      } catch (const std::exception& e) {
        FAIL_CHECK("not a dtlab::Error: " << e.what());
      }
    }
    // A rank beyond an int16_t owns nothing (found by fuzz/figure.cpp: it was converted to an
    // int16_t, undefined behavior), as a fraction does.
    s.data.owner = {0, 1, 0, 1};
    CHECK(Figure::parse("data.owned(0)").eval(sc) == 2);
    CHECK(Figure::parse("data.owned(40000)").eval(sc) == 0);
    CHECK(Figure::parse("data.owned(0.5)").eval(sc) == 0);
    CHECK_THROWS_WITH_AS(Figure::parse("collective.bytes").eval(sc), "collective.bytes: no collective has run yet", Error);
    CHECK_THROWS_WITH_AS(Figure::parse("at(\"m\", world)").eval(sc), "no `mark m` has run before this", Error);
    std::map<std::string, Snapshot> marks;
    marks["m"] = s;
    marks["m"].config.world = 8;
    CHECK(Figure::parse("at(\"m\", world) / world").eval(FigureScope{&s, &marks}) == 2);
    // The engine's formulas: ZeRO's 16 bytes per parameter, the ring's 2(n-1)/n, GPipe's bubble.
    CHECK(Figure::parse("plan.total(7e9, 1, \"no-shard\") / 1e9").eval(sc) == doctest::Approx(112));
    CHECK(Figure::parse("plan.total(7e9, 8, \"full\") / 1e9").eval(sc) == doctest::Approx(14));
    CHECK(Figure::parse("algo.busiest(\"ring\", 8, 8e9) / 1e9").eval(sc) == doctest::Approx(14));
    CHECK(Figure::parse("algo.busiest(\"naive\", 8, 8e9) / 1e9").eval(sc) == doctest::Approx(56));
    CHECK(Figure::parse("schedule.bubble(\"1f1b\", 4, 8)").eval(sc) == doctest::Approx(3.0 / 11));
    CHECK(Figure::parse("schedule.measured_bubble(\"gpipe\", 4, 8)").eval(sc) == doctest::Approx(3.0 / 11));
    CHECK(Figure::parse("link.gbs(\"ib2x4\", \"inter\")").eval(sc) == doctest::Approx(25));
    CHECK(format_figure(6) == "6");
    CHECK(format_figure(0.272727) == "0.2727");
    CHECK(closest_word("stp", {"step", "run", "view"}) == "step");
    CHECK(closest_word("zzzz", {"step", "run"}).empty());
  }

  TEST_CASE("a lesson on a live Session: play reveals the engine's figures and a learner gets checked") {
    const Lesson l = parse_lesson(header() +
                                      "## Ring\n```action\nstep collective 2\n```\n"
                                      "```question\nask: Steps?\nanswer: collective.steps\nexpect: 2 * (world - 1)\n```\n"
                                      "## Bytes\n```question\nask: Bytes rank 2 sends?\nreveal: step ring 7\nanswer: sent(2, 2)\n"
                                      "expect: 2 * (world - 1) / world * bucket[0].bytes\ntolerance: 1%\n```\n"
                                      "## Which\n```question\nask: Which op?\nchoice: broadcast = collective.is(\"broadcast\")\n"
                                      "choice: all-reduce = collective.is(\"allreduce\")\nanswer: 1\n```\n",
                                  "t.md");
    SUBCASE("played headless") {
      Session s(lesson_options(l).train);
      LessonRunner r(l, false, "");
      REQUIRE(drive(r, s, {"play"}) == "");
      CHECK(r.finished());
      const Snapshot& snap = s.update();
      CHECK(r.answer(0).live == 6);
      CHECK(r.answer(0).correct);
      // Rank 2's bytes, from the step events, counted here: equal to what the lesson revealed.
      CHECK(r.answer(1).live == static_cast<double>(bytes_sent(snap, 2, 2)));
      CHECK(r.answer(1).live == doctest::Approx(1.5 * static_cast<double>(snap.buckets[0].bytes)).epsilon(0.01));
      CHECK(r.answer(2).live_choice == 1);
      CHECK(r.answer_text(2) == "all-reduce");
    }
    SUBCASE("--check-spoilers reads the screen as the learner checks: before the reveal's actions") {
      Session s(lesson_options(l).train);
      LessonRunner r(l, false, "");
      REQUIRE(drive(r, s, {"start", "answer 6", "check", "next", "answer 1"}) == "");
      const LessonRunner::Result res = r.exec("check", s);
      auto at = [&](const std::function<bool(const ScriptCommand&)>& is) {
        return std::find_if(res.then.begin(), res.then.end(), is) - res.then.begin();
      };
      const auto capture = at([](const ScriptCommand& c) { return c.arg == "_precheck 1"; });
      const auto ring = at([](const ScriptCommand& c) { return c.kind == ScriptCommand::StepRing; });  // the reveal's step ring 7
      const auto reveal = at([](const ScriptCommand& c) { return c.arg == "_reveal 1"; });
      CHECK(capture < ring);
      CHECK(ring < reveal);
      CHECK(reveal < static_cast<std::ptrdiff_t>(res.then.size()));
    }
    SUBCASE("a learner answers, checks, goes back") {
      Session s(lesson_options(l).train);
      LessonRunner r(l, false, "");
      REQUIRE(drive(r, s, {"start", "answer 5", "check"}) == "");
      CHECK(r.step() == 0);
      CHECK(r.answer(0).revealed);
      CHECK(r.answer(0).checked);
      CHECK(!r.answer(0).correct);
      CHECK(r.answer(0).live == s.update().collective.steps);
      REQUIRE(drive(r, s, {"next", "answer 27100", "check"}) == "");  // 1.5 x 18188 = 27282
      CHECK(r.step() == 1);
      CHECK(r.answer(1).correct);  // within the question's 1%
      REQUIRE(drive(r, s, {"next", "answer 2", "check"}) == "");
      CHECK(r.answer(2).correct);
      REQUIRE(drive(r, s, {"back"}) == "");  // replayed from the scenario
      CHECK(r.step() == 1);
      CHECK(!r.answer(1).revealed);
      CHECK(s.update().collective.seq == 2);
      CHECK(drive(r, s, {"answer x"}) == "t.md:19: step 2 'Bytes': lesson answer: 'x' is not a number; write it as 0.25, 1/4 or 25%");
    }
    // --play: the failure and the exit code a scripted run takes from it.
    auto play = [](const Lesson& lesson, int& code) {
      Session s(lesson_options(lesson).train);
      LessonRunner r(lesson, true, "");
      return drive(r, s, {"play"}, &code);
    };
    SUBCASE("the engine disagrees with the lesson: --play fails at the question") {
      Lesson wrong = l;
      wrong.steps[0].question->expect = Figure::parse("7");
      int code = 0;
      CHECK(play(wrong, code) == "t.md:13: step 1 'Ring': the engine revealed collective.steps = 6 but the lesson expects 7 = 7");
      CHECK(code == 1);  // the engine and the file disagree: a failed play, not bad input
    }
    SUBCASE("a question whose figure has no value: the lesson file is bad input, exit 2") {
      Lesson bad = l;
      bad.steps[0].question->answer = Figure::parse("bucket[9].bytes");
      int code = 0;
      CHECK(play(bad, code).rfind("t.md:13: step 1 'Ring': the answer has no value: ", 0) == 0);
      CHECK(code == 2);
    }
  }

  // Issue 32: the drill's ring question read "The bucket holds 1036 bytes" until Check, then "16384
  // bytes": the reveal stepped the run past that bucket and the panel read the figure again, while
  // the answer and the explanation still spoke of the 1036-byte bucket.
  TEST_CASE("a question keeps its figures: the drill's ring question reads the same after Check") {
    const Lesson l = load_lesson("interview_drill", 1);  // a drawn scenario (app/lesson.h): seed 1's
    const int world = lesson_options(l).train.world_size;
    REQUIRE(l.steps.size() > 1);
    REQUIRE(l.steps[1].question.has_value());
    const Question& q = *l.steps[1].question;
    REQUIRE(q.ask.rfind("The bucket holds {{collective.bytes}} bytes", 0) == 0);
    Session s(lesson_options(l).train);
    LessonRunner r(l, false, "");
    REQUIRE(drive(r, s, {"goto 2"}) == "");
    REQUIRE(r.step() == 1);
    CHECK(r.answer(1).asked);
    const int64_t asked_bytes = s.update().collective.bytes;
    const std::string ask = shown(r, q.ask_prose, s.update());
    CHECK(ask.rfind("The bucket holds " + std::to_string(asked_bytes) + " bytes and the " + std::to_string(world) +
                    " ranks all-reduce it", 0) == 0);
    const double sent = 2.0 * (world - 1) / world * static_cast<double>(asked_bytes);  // the ring's 2(n-1)/n
    REQUIRE(drive(r, s, {"answer " + format_figure(sent), "check"}) == "");
    // What the bug needs: the reveal moved the run on to a collective of another size.
    REQUIRE(s.update().collective.bytes != asked_bytes);
    CHECK(shown(r, q.ask_prose, s.update()) == ask);
    CHECK(r.answer(1).correct);
    CHECK(r.answer(1).live == doctest::Approx(sent).epsilon(0.02));
    const std::string answer = r.answer_text(1), explain = shown(r, q.explain, s.update());
    CHECK(answer == format_figure(r.answer(1).live) + " bytes");
    CHECK(explain.rfind(format_figure(r.answer(1).live) + " bytes, 2(n-1)/n of the buffer.", 0) == 0);
    // Later frames and a second Check, the run an iteration further: the same text, answer and
    // explanation; the new answer is graded against the answer revealed.
    step_on(s, GateKind::Iteration, 1);
    REQUIRE(drive(r, s, {"answer 1", "check"}) == "");
    CHECK(!r.answer(1).correct);
    CHECK(shown(r, q.ask_prose, s.update()) == ask);
    CHECK(r.answer_text(1) == answer);
    CHECK(shown(r, q.explain, s.update()) == explain);
  }

  TEST_CASE("draw: a seed draws the same scenario on every read, another seed another one, and ${seed} is the seed") {
    const std::string text = "---\ntitle: t\nminutes: 5\ndraw: w = 2 | 3 | 5 | 6 | 7 | 8\ndraw: cap = 0.004 | 0.016\n"
                             "strategy: ddp\nworld: ${w}\nmodel: small\nbucket_cap_mb: ${cap}\n---\n"
                             "## a\nseed ${seed}, world ${w}\n```question\nask: q ${w}?\nanswer: world\nexpect: ${w}\ntopic: t\n```\n";
    const Lesson a = parse_lesson(text, "t.md", 11), again = parse_lesson(text, "t.md", 11);
    REQUIRE(a.draws.size() == 2);
    CHECK(a.seed == 11);
    CHECK(a.draws == again.draws);
    const std::string w = a.draws[0].second;
    CHECK(lesson_options(a).train.world_size == std::stoi(w));
    CHECK(a.steps[0].question->ask == "q " + w + "?");
    CHECK(a.steps[0].question->topic == "t");
    // Over 20 seeds both draws take more than one value (mt19937_64: the same on every machine).
    std::set<std::string> worlds, caps;
    for (uint64_t seed = 1; seed <= 20; seed++) {
      const Lesson l = parse_lesson(text, "t.md", seed);
      worlds.insert(l.draws[0].second), caps.insert(l.draws[1].second);
    }
    CHECK(worlds.size() > 2);
    CHECK(caps.size() == 2);
    // Without a seed, one is drawn (1 to 999999) and kept, so the play can be replayed.
    const Lesson fresh = parse_lesson(text, "t.md");
    CHECK(fresh.seed >= 1);
    CHECK(fresh.seed <= 999999);
    CHECK(parse_lesson(text, "t.md", fresh.seed).draws == fresh.draws);
    // A lesson without draw: lines keeps ${...} as written and has seed 0.
    const Lesson plain = parse_lesson(header() + "## a\ncost ${x}\n", "t.md", 5);
    CHECK(plain.draws.empty());
    CHECK(plain.seed == 0);
  }

  TEST_CASE("draw: broken lines and unknown names are file:line and one sentence") {
    const std::string h = "---\ntitle: t\nminutes: 5\nstrategy: ddp\nmodel: small\n";
    CHECK(lesson_error(h + "draw: w = 4\n---\n## a\n") ==
          "t.md:6: draw 'w' needs two or more values between '|', none empty: 'draw: w = 3 | 5 | 7'");
    CHECK(lesson_error(h + "draw: W = 2 | 4\n---\n## a\n") ==
          "t.md:6: a draw is 'draw: NAME = A | B | C', NAME in lower case letters, digits and _ (not 'seed'), not 'draw: W = 2 | 4'");
    CHECK(lesson_error(h + "draw: w = 2 | 4\ndraw: w = 3 | 5\n---\n## a\n") == "t.md:7: 'w' is drawn twice; give each draw its own name");
    CHECK(lesson_error(h + "draw: world = 2 | 4\n---\n## a\nranks: ${wrld}\n") ==
          "t.md:9: '${wrld}' is not drawn (this lesson draws world, seed); did you mean 'world'?");
  }

  TEST_CASE("two plays of the interview drill with different seeds ask different numbers, and the same seed the same") {
    // The ring question's ask, as the learner reads it, on a live Session for three seeds.
    auto ring_ask = [](uint64_t seed) {
      const Lesson l = load_lesson("interview_drill", seed);
      Session s(lesson_options(l).train);
      LessonRunner r(l, false, "");
      REQUIRE(drive(r, s, {"goto 2"}) == "");
      return shown(r, l.steps[1].question->ask_prose, s.update());
    };
    // Seeds whose draws differ in world size and model width (checked first, so the test says why).
    const Lesson one = load_lesson("interview_drill", 1), two = load_lesson("interview_drill", 2);
    REQUIRE(one.draws != two.draws);
    const std::string a = ring_ask(1), b = ring_ask(2);
    const std::string both = a + "\n" + b;
    INFO(both);
    CHECK(a != b);
    CHECK(ring_ask(1) == a);
    // Every question names a topic, for the score at the end.
    for (const LessonStep& st : one.steps)
      if (st.question) CHECK_MESSAGE(!st.question->topic.empty(), st.title);
  }

  TEST_CASE("topic scores: per topic, the questions, those checked and those right") {
    const Lesson l = parse_lesson(header() +
                                      "## a\n```question\nask: a?\nanswer: world\ntopic: ranks\n```\n"
                                      "## b\n```question\nask: b?\nanswer: world * 2\ntopic: ranks\n```\n"
                                      "## c\n```question\nask: c?\nanswer: world + 1\ntopic: more\n```\n"
                                      "## d\nno question\n",
                                  "t.md");
    Session s(lesson_options(l).train);
    LessonRunner r(l, false, "");
    REQUIRE(drive(r, s, {"goto 1", "answer 4", "check", "next", "answer 9", "check", "next", "next"}) == "");
    const std::vector<LessonRunner::TopicScore> t = r.topic_scores();
    REQUIRE(t.size() == 2);
    CHECK(t[0].topic == "ranks");
    CHECK(t[0].questions == 2);
    CHECK(t[0].checked == 2);
    CHECK(t[0].correct == 1);
    CHECK(t[1].topic == "more");
    CHECK(t[1].questions == 1);
    CHECK(t[1].checked == 0);
    CHECK(t[1].correct == 0);
  }

  TEST_CASE("a question keeps its figures: asked after the step's actions, answered and explained at the reveal") {
    const Lesson l = parse_lesson(header() +
                                      "## Next\n```action\nstep collective 2\nmark asked\n```\n"
                                      "```question\nask: The ranks wait at collective #{{collective.seq}}. Which one will they\n"
                                      "  wait at after one more step?\nreveal: step collective 1\nanswer: collective.seq\n"
                                      "expect: at(\"asked\", collective.seq) + 1\n"
                                      "explain: #{{collective.seq}}, the one after #{{at(\"asked\", collective.seq)}}.\n```\n"
                                      "The run is at #{{collective.seq}}.\n",
                                  "t.md");
    const LessonStep& st = l.steps[0];
    const Question& q = *st.question;
    Session s(lesson_options(l).train);
    LessonRunner r(l, false, "");
    REQUIRE(drive(r, s, {"start"}) == "");
    const int64_t at_ask = static_cast<int64_t>(s.update().collective.seq);
    const std::string ask = shown(r, q.ask_prose, s.update());
    CHECK(ask == "The ranks wait at collective #" + std::to_string(at_ask) + ". Which one will they wait at after one more step?\n");
    CHECK(shown(r, q.explain, s.update()) == "#" + std::to_string(at_ask) + ", the one after #" + std::to_string(at_ask) + ".\n");  // not shown yet: read at the reveal
    REQUIRE(drive(r, s, {"answer " + std::to_string(at_ask + 1), "check"}) == "");
    CHECK(r.answer(0).correct);
    CHECK(r.answer(0).note.empty());
    CHECK(static_cast<int64_t>(s.update().collective.seq) == at_ask + 1);
    CHECK(shown(r, q.ask_prose, s.update()) == ask);
    const std::string explain = "#" + std::to_string(at_ask + 1) + ", the one after #" + std::to_string(at_ask) + ".\n";
    CHECK(shown(r, q.explain, s.update()) == explain);
    // The run goes on; a second Check reads nothing again (it used to reveal the answer anew).
    step_on(s, GateKind::Collective, 2);
    const int64_t later = static_cast<int64_t>(s.update().collective.seq);
    REQUIRE(later > at_ask + 1);
    REQUIRE(drive(r, s, {"answer " + std::to_string(at_ask + 1), "check"}) == "");
    CHECK(r.answer(0).live == static_cast<double>(at_ask + 1));
    CHECK(r.answer(0).correct);
    CHECK(shown(r, q.ask_prose, s.update()) == ask);
    CHECK(shown(r, q.explain, s.update()) == explain);
    CHECK(shown(r, st.prose, s.update()) == "The run is at #" + std::to_string(later) + ".\n");  // prose stays live
    // Going back asks the question anew, on the replayed run.
    REQUIRE(drive(r, s, {"goto 1"}) == "");
    CHECK(r.answer(0).asked);
    CHECK(!r.answer(0).revealed);
    CHECK(shown(r, q.ask_prose, s.update()) == ask);
  }

  TEST_CASE("run until, inject and expect on a live Session") {
    const Lesson l = parse_lesson(header("timeout: 1\n") +
                                      "## Hang\n```action\ninject skip rank 3 collective 3\nrun until run.failed\n"
                                      "expect watchdog.missing[0] == 3\n```\n"
                                      "## Buckets\n```action\nscenario --timeout 30\nrun until bucket[1].launched\nexpect bucket[0].launched\n"
                                      "expect run.failed\n```\n",
                                  "t.md");
    Session s(lesson_options(l).train);
    LessonRunner r(l, true, "");
    CHECK(drive(r, s, {"play"}) == "t.md:21: step 2 'Buckets': 'expect run.failed': this does not hold: run.failed = 0");
    CHECK(s.update().buckets.at(1).state >= BucketState::Launched);
  }

  TEST_CASE("progress: saved atomically per lesson, read back, a damaged file ignored") {
    test::TempDir dir;
    const std::string path = dir.file("state/dtlab/progress.json");
    CHECK(load_progress(path).empty());
    save_progress(path, "why_allreduce", LessonProgress{3, 6, 2, 1, false});
    save_progress(path, "fsdp_zero", LessonProgress{6, 6, 5, 5, true});
    auto p = load_progress(path);
    REQUIRE(p.size() == 2);
    CHECK(p["why_allreduce"].step == 3);
    CHECK(p["why_allreduce"].correct == 1);
    CHECK(p["fsdp_zero"].completed);
    { std::ofstream(path) << "{ not json"; }
    CHECK(load_progress(path).empty());
    save_progress(path, "why_allreduce", LessonProgress{4, 6, 3, 2, false});
    CHECK(load_progress(path).at("why_allreduce").step == 4);
    CHECK(dir.listing() == std::set<std::string>{"state"});
  }

  TEST_CASE("lesson commands in scripts, and --play with a broken file: exit 2 with file:line") {
    CHECK(check_lesson_command("goto 3").empty());
    CHECK(check_lesson_command("open why_allreduce").empty());
    CHECK(check_lesson_command("goto 0") == "lesson goto takes a step number from 1");
    CHECK(check_lesson_command("nxt").rfind("unknown lesson command 'nxt'; did you mean 'next'?", 0) == 0);
    CHECK(check_lesson_command("_reveal 1").rfind("unknown lesson command '_reveal'", 0) == 0);
    const std::vector<ScriptCommand> cmds = parse_script("lesson open why_allreduce; lesson goto 2; lesson answer 6; lesson check", "--run");
    REQUIRE(cmds.size() == 4);
    CHECK(cmds[1].kind == ScriptCommand::Lesson);
    CHECK(cmds[2].arg == "answer 6");
    // The app checks the file before it needs a display.
    const std::string file = kSource + "/tests/data/lessons/broken_action.md";
    test::ShellResult r = test::shell("env -u DISPLAY -u WAYLAND_DISPLAY " DTLAB_APP_PATH " --lesson " + file + " --play");
    CHECK(r.code == 2);
    CHECK(r.out == "dtlab: " + file + ":13: unknown action 'stp collective'; did you mean 'step collective'?\n");
    r = test::shell(DTLAB_APP_PATH " --lesson no_such_lesson --play");
    CHECK(r.code == 2);
    CHECK(r.out.find(": no lesson 'no_such_lesson'") != std::string::npos);
    r = test::shell(DTLAB_APP_PATH " --play");
    CHECK(r.code == 2);
    CHECK(r.out == "dtlab: --play plays a lesson; add --lesson NAME\n");
  }

  TEST_CASE("under Xvfb: a broken lesson shows its error in the panel and the lab keeps running") {
    if (test::shell("command -v xvfb-run").code != 0) {
      MESSAGE("skipped: xvfb-run is not installed (apt-get install xvfb xauth)");
      return;
    }
    test::TempDir dir;
    const std::string file = kSource + "/tests/data/lessons/broken_figure.md", png = dir.file("broken.png");
    test::ShellResult r =
        test::run_lab(dir.file("c"), "--lesson " + file + " --run 'step collective 2; screenshot " + png + "; quit'");
    INFO(r.out);
    CHECK(r.code == 2);  // the script ran on, and its exit code reports the bad lesson
    CHECK(r.out.find(file + ":16: unknown live figure 'collective.byte'; did you mean 'collective.bytes'?") != std::string::npos);
    CHECK(r.out.find("screenshot " + png) != std::string::npos);
  }
}
#endif  // DTLAB_HAVE_GUI
