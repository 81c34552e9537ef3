// No spoilers (app/spoilers.h): which views a pending question covers, the text read back from
// ImGui's draw data, and how an answer is looked for in it. The lessons themselves are checked by
// `dtlab --lesson X --play --check-spoilers` (CTest's lesson_<name>, tools/play_lesson.sh).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <imgui.h>

#include <string>
#include <vector>

#include "app/figures.h"
#include "app/lesson_runner.h"
#include "app/spoilers.h"
#include "tests/test_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

// A headless ImGui frame (no window, no GL): what the views would put in the draw data.
struct HeadlessImGui {
  HeadlessImGui() {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(800, 600);
    io.IniFilename = nullptr;
    unsigned char* px = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&px, &w, &h);
  }
  ~HeadlessImGui() { ImGui::DestroyContext(); }
};

bool has_line(const std::vector<ScreenLine>& lines, const std::string& window, const std::string& text) {
  for (const ScreenLine& l : lines)
    if (l.window == window && l.text == text) return true;
  return false;
}

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("spoilers: a figure's views, and the figures a live expression reads") {
    CHECK(views_drawing("collective.steps") == std::vector<std::string>{"ring", "inspector"});
    CHECK(views_drawing("bucket[I].bytes") == std::vector<std::string>{"buckets"});
    CHECK(views_drawing("memory.rank[R].total") == std::vector<std::string>{"memory"});
    CHECK(views_drawing("data.owned(R)") == std::vector<std::string>{"data"});
    CHECK(views_drawing("plan.total(P, N, SHARDING, DTYPE?)").empty());  // a formula no view draws
    for (const FigureInfo& f : figure_vocabulary()) {
      // Every figure the lessons can ask about is known to the table one way or the other.
      CAPTURE(f.name);
      CHECK_NOTHROW(views_drawing(f.name));
    }
    const Figure f = Figure::parse("sent(2, 2) / bucket[0].bytes + at(\"m\", memory.rank[1].total) * world");
    std::vector<std::string> n = f.names();
    CHECK(n.size() == 4);
    int covered = 0;
    for (const std::string& s : n) covered += views_drawing(s).empty() ? 0 : 1;
    CHECK(covered == 3);  // sent, bucket, memory; `world` is the run's own setting
  }

  TEST_CASE("spoilers: the text on screen is read back from the glyphs, ImGui::Text and AddText alike") {
    HeadlessImGui imgui;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(10, 10));
    ImGui::SetNextWindowSize(ImVec2(400, 300));
    ImGui::Begin("Buckets");
    ImGui::Text("bucket 0: 4,547 B");
    ImGui::BeginChild("##rows", ImVec2(0, 100));
    ImGui::Text("launch #2");
    ImGui::EndChild();
    ImGui::GetWindowDrawList()->AddText(ImVec2(20, 250), IM_COL32_WHITE, "17.8 KiB");
    ImGui::End();
    ImGui::Render();
    const std::vector<ScreenLine> lines = screen_text(*ImGui::GetDrawData());
    CHECK(has_line(lines, "Buckets", "bucket 0: 4,547 B"));
    CHECK(has_line(lines, "Buckets", "launch #2"));  // a child window counts as its parent
    CHECK(has_line(lines, "Buckets", "17.8 KiB"));
    CHECK(find_spoiler(lines, answer_spellings(4547)) == "Buckets: 'bucket 0: 4,547 B'");
    CHECK(find_spoiler(lines, answer_spellings(18188)) == "Buckets: '17.8 KiB'");
    CHECK(find_spoiler(lines, answer_spellings(547)) == "");  // inside 4,547: another number
  }

  TEST_CASE("spoilers: an answer's spellings, and whole tokens only") {
    CHECK(answer_spellings(4).empty());  // small whole numbers are everywhere
    CHECK(answer_spellings(0.5).empty());
    CHECK(answer_spellings(4547) == std::vector<std::string>{"4547", "4,547", "4.4 KiB"});
    CHECK(answer_spellings(4547, true) == std::vector<std::string>{"4547", "4,547"});  // "4.4 KiB" is not 4547
    const std::vector<std::string> share = answer_spellings(0.2727);
    CHECK(std::find(share.begin(), share.end(), "0.27") != share.end());
    CHECK(std::find(share.begin(), share.end(), "27%") != share.end());
    const std::vector<ScreenLine> lines = {{"Lesson", "holds 14547 floats and 0.756 of it, then 4547."},
                                           {"Memory", "total 4,547, then"}};
    CHECK(find_spoiler({lines[0]}, {"4547"}) == "Lesson: 'holds 14547 floats and 0.756 of it, then 4547.'");
    CHECK(find_spoiler({lines[0]}, {"0.75"}) == "");
    CHECK(find_spoiler({lines[1]}, {"4,547"}) == "Memory: 'total 4,547, then'");
    CHECK(find_spoiler({lines[1]}, {"4,54"}) == "");
  }

  TEST_CASE("lesson answers: fractions, percentages and plain numbers, as a learner types a share") {
    Question q;
    double v = 0;
    CHECK(q.parse_answer("0.25", v));
    CHECK(v == 0.25);
    CHECK(q.parse_answer("1/4", v));
    CHECK(v == 0.25);
    CHECK(q.parse_answer(" 3 / 11 ", v));
    CHECK(v == doctest::Approx(3.0 / 11));
    CHECK(q.parse_answer("25%", v));
    CHECK(v == 0.25);
    CHECK(q.parse_answer("1,500", v));
    CHECK(v == 1500);
    CHECK(q.parse_answer("7e9", v));
    CHECK(v == 7e9);
    q.unit = "%";
    CHECK(q.parse_answer("25%", v));
    CHECK(v == 25);  // the question asks in percent: the sign is its unit
    for (const char* bad : {"", "abc", "1/0", "1/", "/4", "25%%", "0.2.5", "nan", "inf"}) {
      CAPTURE(bad);
      CHECK_FALSE(q.parse_answer(bad, v));
    }
  }

  TEST_CASE("lesson answers: the answer box's example is written in the question's unit") {
    Question q;
    CHECK(q.answer_hint() == "0.25, 1/4 or 25%");  // no unit: a share
    q.unit = "bytes";
    CHECK(q.answer_hint() == "e.g. 4096 or 1.5e6");
    q.unit = "bytes per parameter";
    CHECK(q.answer_hint() == "e.g. 4096 or 1.5e6");
    q.unit = "steps";
    CHECK(q.answer_hint() == "e.g. 12");
    q.unit = "%";
    CHECK(q.answer_hint() == "e.g. 25");
    for (const char* u : {"ms", "µs", "s", "GB", "GiB", "KiB"}) {
      q.unit = u;
      CHECK(q.answer_hint() == "e.g. 2.5");
    }
    // Every unit the shipped lessons use gets an example that its own parser takes.
    for (const auto& e : std::filesystem::directory_iterator(std::string(DTLAB_SOURCE_DIR) + "/lessons")) {
      std::ifstream in(e.path());
      for (std::string line; std::getline(in, line);) {
        if (line.rfind("unit: ", 0) != 0) continue;
        q.unit = line.substr(6);
        const std::string hint = q.answer_hint();
        CAPTURE(q.unit);
        CHECK(hint.find('%') == std::string::npos);  // a byte count is not a share
        double v = 0;
        CHECK(q.parse_answer(hint.substr(5, hint.find(' ', 5) - 5), v));
      }
    }
  }

  TEST_CASE("spoilers: a question's figures are pending until its check, then the views uncover") {
    const Lesson l = parse_lesson("---\ntitle: T\nminutes: 5\nstrategy: ddp\nworld: 2\nmodel: tiny\n---\n"
                                  "## One\n```action\nstep collective 2\n```\n"
                                  "```question\nask: Steps?\nanswer: collective.steps\n```\n",
                                  "t.md");
    Session s(lesson_options(l).train);
    LessonRunner r(l, false, "");
    CHECK(r.pending_figures().empty());  // not started
    for (const char* cmd : {"start"}) {
      LessonRunner::Result res = r.exec(cmd, s);
      REQUIRE(res.failure.empty());
      while (!res.then.empty()) {  // the step's own commands: enter it, run its actions
        ScriptCommand c = res.then.front();
        res.then.erase(res.then.begin());
        if (c.kind != ScriptCommand::Lesson) continue;
        LessonRunner::Result more = r.exec(c.arg, s);
        REQUIRE(more.failure.empty());
        res.then.insert(res.then.begin(), more.then.begin(), more.then.end());
      }
    }
    CHECK(r.pending_figures() == std::vector<std::string>{"collective.steps"});
    r.answer(0).revealed = true;  // what Check and Reveal do first
    CHECK(r.pending_figures().empty());
  }
}
