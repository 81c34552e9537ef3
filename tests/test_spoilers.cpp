// No spoilers (app/spoilers.h): which views a pending question covers, the text read back from
// ImGui's draw data, and how an answer is looked for in it. The lessons themselves are checked by
// `dtlab --lesson X --play --check-spoilers` (CTest's lesson_<name>, tools/play_lesson.sh).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <imgui.h>

#include <string>
#include <vector>

#include "app/figures.h"
#include "app/lesson_runner.h"
#include "app/repeats.h"
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
    // Another unit after the number is another quantity: the drill's 73.12 GB against a Memory view's
    // "peak 73.1 KiB" (seed 24); the same unit, or none, still counts.
    const std::vector<ScreenLine> memory = {{"Memory", "rank 4 7.1 KiB 24.6 KiB 38.8 KiB peak 73.1 KiB"}};
    CHECK(find_spoiler(memory, {"73.1"}, "GB") == "");
    CHECK(find_spoiler(memory, {"73.1"}, "KiB") != "");
    CHECK(find_spoiler(memory, {"73.1"}) != "");
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
    // No unit: as the question words it (lesson 1's parameter count showed the share's example).
    q.ask = "How many parameters (weights and biases) does mlp:2,64,64,3 have?";
    CHECK(q.answer_hint() == "e.g. 12");
    q.ask = "For 16 ranks, how many times more does naive's busiest rank send than a ring rank?";
    CHECK(q.answer_hint() == "e.g. 2.5 or 5/2");
    q.ask = "What share of the samples stay with the rank they had in epoch 0?";
    CHECK(q.answer_hint() == "0.25, 1/4 or 25%");
    double v = 0;
    CHECK(q.parse_answer("5/2", v));
    CHECK(v == 2.5);
    q.ask.clear();
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

namespace {

// Passages of the lessons as the review found them (main before course-text), kept verbatim as
// fixtures: each gave its answer away in the text before the question.
const char* kOldMixedPrecision =
    "---\ntitle: \"Mixed precision: 16 bytes per parameter, and the loss scaler\"\nminutes: 12\n"
    "summary: Train in bf16 with fp32 master weights: predict each part of the 16-byte bar. Then fp16 with a loss "
    "scaler: an overflow on one rank, the step every rank skips, and the scale it halves.\n"
    "scenario: --strategy ddp --world 2 --precision bf16\n---\n"
    "## Add up the bar\n\n```question\nask: Parameters, gradients, master weights and optimizer state together: how many bytes per\n"
    "  parameter?\nanswer: (memory.rank[0].parameters + memory.rank[0].gradients + memory.rank[0].master + memory.rank[0].optimizer) / params\n"
    "expect: 16\nunit: bytes per parameter\nexplain: 2 + 2 + 4 + 8.\n```\n";

const char* kOldSequenceParallel =
    "---\ntitle: \"Tensor parallelism: split the layer, not the batch\"\nminutes: 12\n"
    "scenario: --strategy ddp --world 2 --tp 2 --model mlp:2,64,64,64,64,3 --batch 32 --profile nvlink8\n---\n"
    "## What it moves\n\n```question\nask: How many bytes does that all-reduce move (its payload S)?\n"
    "answer: collective.bytes\nexpect: batch * 64 * 4\nunit: bytes\n"
    "explain: {{collective.bytes}} bytes: the activations, batch x 64 features x 4 bytes, not the\n  weights.\n```\n"
    "## Same bytes, split differently\n\n```question\n"
    "ask: The first collective is now the all-gather before Linear 0. After it, what is the payload S of\n"
    "  the reduce-scatter after Linear 2, in bytes?\nreveal: step collective 1\nanswer: collective.bytes\n"
    "expect: batch * 64 * 4\nunit: bytes\nexplain: {{collective.bytes}} bytes, as the all-reduce's.\n```\n";

const char* kOldHybridShard =
    "---\ntitle: \"HYBRID_SHARD: shard in a node, copy across nodes\"\nminutes: 14\n"
    "scenario: --strategy fsdp --world 8 --model small --sharding full --profile ib2x4\n---\n"
    "## HYBRID_SHARD: two process groups\n\n```question\n"
    "ask: How many bytes of parameters does rank 5 hold between iterations (its shards of the three\n  units)?\n"
    "answer: memory.rank[5].parameters\nexpect: plan.parameters(params, 4, \"full\")\nreveal: view memory\nunit: bytes\n"
    "explain: {{memory.rank[5].parameters}} bytes: 48 + 1040 + 49 = 1137 elements.\n```\n"
    "## What crosses the network\n\nDuring training under HYBRID_SHARD, parameters never cross between the nodes: every all-gather\n"
    "stays inside a node.\n\n```question\nask: In one iteration, how many bytes will rank 1 send to the other node?\n"
    "answer: traffic.cross_node(1)\nexpect: memory.rank[1].parameters\ntolerance: 1%\nunit: bytes\n"
    "explain: {{traffic.cross_node(1)}} bytes, about the size of its shard.\n```\n";

// The drill before its draws (lessons/17_interview_drill.md:138 and :152 at 9bf66ae): the prose
// said "1.5 s", the question asked the same delay in milliseconds.
const char* kOldDrillStraggler =
    "---\ntitle: Interview drill\nminutes: 24\nstrategy: ddp\nworld: 4\nmodel: small\ntimeout: 2\n---\n"
    "## What happens when one GPU is slower?\n\n"
    "Rank 2 has a slow data loader: in the third iteration it reaches the gradient all-reduce 1.5 s after\n"
    "the others.\n\n```action\nscenario --bucket-cap-mb 25 --first-bucket-mb 25 --fault delay:rank=2,collective=7,ms=1500\n"
    "mark late\n```\n\n"
    "```question\nask: Rank 0 itself is not slow. How many milliseconds longer than its second iteration will its\n"
    "  third iteration last?\nreveal: step collective 2\nanswer: (iteration.modeled_us - at(\"late\", iteration.modeled_us)) / 1000\n"
    "expect: 1500\ntolerance: 2%\nunit: ms\n```\n";

// lessons/18_reading_a_trace.md:27-29 and :73 (main before course-text): the order of the ready
// gradients was spelled out, and the question asked which bucket launches last.
const char* kOldTraceLastBucket =
    "---\ntitle: Reading a real trace\nminutes: 15\nstrategy: ddp\nworld: 4\n---\n"
    "## Four ranks, four files\n\n"
    "The profiled iterations come after DDP's one rebuild of its buckets, so the buckets follow the order in\n"
    "which gradients become ready: backward starts at the last layer, so layer 4 comes first, then 2,\n"
    "then 0. The first bucket closes as soon as it reaches 1 MiB, every later one at 25 MiB.\n\n"
    "## One clock for four ranks\n\nThe trace knows no parameter names, only sizes.\n\n"
    "```question\nask: Which gradients does `b1`, the bucket that launches last, carry?\n"
    "choice: Layer 4's weight and bias, the output layer = 4 * (3 * 512 + 3)\n"
    "choice: Layer 2's weight and bias = 4 * (512 * 512 + 512)\n"
    "choice: Layer 0's weight and bias, the input layer = 4 * (2 * 512 + 512)\n"
    "choice: All three layers' gradients = 4 * (3 * 512 + 3 + 512 * 512 + 512 + 2 * 512 + 512)\n"
    "answer: trace.bytes(trace.bucket_collective(0, trace.buckets(0) - 1))\nexpect: 4 * (2 * 512 + 512)\n```\n";

// The review's "trivial from the text above" (issue 38): lesson 2's set_epoch question and lesson
// 21's first question as they stood (lessons/02_data_parallel.md:81-98 and
// lessons/21_3d_parallelism.md:8-28 at bfe2bc5). The text had just said the rule, and the answer
// was the guess "all" or "none".
const char* kOldNoSetEpoch =
    "---\ntitle: Data parallelism\nminutes: 10\nstrategy: ddp\nworld: 4\nmodel: small\n---\n"
    "## Forgetting set_epoch\n\nSwitch `set_epoch` off: the data view now shows the split that a loop which never calls\n"
    "`sampler.set_epoch(epoch)` would use in this epoch.\n\n```action\nset_epoch off\n```\n\n"
    "```question\nask: Without set_epoch, what share of the samples stay with the rank they had in epoch 0?\n"
    "answer: data.same_owner(\"epoch0\") / data.n\nexpect: 1\ntolerance: 0.01\n```\n";

const char* kOldTpSpanning =
    "---\ntitle: \"3-D parallelism: which link carries what\"\nminutes: 14\n"
    "scenario: --strategy pipeline --world 8 --stages 2 --dp 2 --tp 2 --model mlp:2,64,64,64,64,3 --split 2,3 --microbatches 4 --batch 32 --profile ib2x4\n---\n"
    "## Three ways to split one job\n\nThe course's example trains on 64 GPUs as 4-way tensor parallelism x 4-way pipeline\n"
    "parallelism x 4-way data parallelism, numbered row-major with tp fastest. So a TP group is 4 neighbouring ranks.\n\n"
    "```question\nask: On DGX H100 nodes of 8 GPUs, how many of the example's 16 TP groups span two nodes?\n"
    "answer: plan.mesh(\"spanning:tp\", \"params=7B world=64 tp=4 stages=4 layers=32 hidden=4096 seq=2048 micro_batch=1 "
    "micro_batches=8 dtype=mixed profile=dgx-h100x2\")\nexpect: 0\n```\n";

int step_titled(const Lesson& l, const std::string& title) {
  for (size_t k = 0; k < l.steps.size(); k++)
    if (l.steps[k].title == title) return static_cast<int>(k);
  return -1;
}

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("spoilers: the lesson's own text and earlier answers before a check, on the passages the review found") {
    const double none = std::numeric_limits<double>::quiet_NaN();
    {
      // The title said "16 bytes per parameter" before the question asked for it in that unit.
      const Lesson l = parse_lesson(kOldMixedPrecision, "lessons/24_mixed_precision.md");
      const int q = step_titled(l, "Add up the bar");
      REQUIRE(q == 0);
      const std::string where = find_text_spoiler(l, q, 16, {});
      CHECK(where == "title: 'Mixed precision: 16 bytes per parameter, and the loss scaler'");
      CHECK(find_text_spoiler(l, q, 12, {}).empty());  // a 12 nowhere in that unit
    }
    {
      // The payload S: the same 32 x 64 x 4 bytes the step before had just revealed.
      const Lesson l = parse_lesson(kOldSequenceParallel, "lessons/20_tensor_parallel.md");
      const int q = step_titled(l, "Same bytes, split differently");
      REQUIRE(q == 1);
      CHECK(find_text_spoiler(l, q, 8192, {8192, none}) ==
            "step 1 'What it moves''s answer (8192), which this question takes as right");
      CHECK(find_text_spoiler(l, q, 6144, {8192, none}).empty());  // the rewritten question: half of 48 x 64 x 4
    }
    {
      // Rank 1's cross-node bytes: its shard, which rank 5's question had just revealed (4548 bytes).
      const Lesson l = parse_lesson(kOldHybridShard, "lessons/13_hybrid_shard.md");
      const int q = step_titled(l, "What crosses the network");
      REQUIRE(q == 1);
      CHECK(find_text_spoiler(l, q, 4560, {4548, none}) ==
            "step 1 'HYBRID_SHARD: two process groups''s answer (4548), which this question takes as right");
      CHECK(find_text_spoiler(l, q, 17300, {4548, none}).empty());
    }
    {
      // "1.5 s" in the prose, the answer in ms: converted, it is the answer within the 2% tolerance.
      const Lesson l = parse_lesson(kOldDrillStraggler, "lessons/17_interview_drill.md");
      const std::string where = find_text_spoiler(l, 0, 1503, {});
      CHECK(where == "step 1 'What happens when one GPU is slower?': 'Rank 2 has a slow data loader: in the third iteration it "
                     "reaches the gradient all-reduce 1.5 s after the others.' ('1.5 s' is 1500 ms)");
      CHECK(find_text_spoiler(l, 0, 900, {}).empty());  // the drill's draw now: the delay said in ms, the question a choice
    }
    {
      // Which bucket launches last: the order "layer 4 comes first, then 2, then 0" ends with it.
      const Lesson l = parse_lesson(kOldTraceLastBucket, "lessons/18_reading_a_trace.md");
      const std::string where = find_text_spoiler(l, 1, 4 * (2 * 512 + 512), {none});
      CHECK(where.find("step 1 'Four ranks, four files': ") == 0);
      CHECK(where.find("names the right choice ('Layer 0's weight and bias, the input layer') last: '0'") != std::string::npos);
      // Layer 4 comes first, but the question asks for the last: no give-away for that choice.
      CHECK(find_text_spoiler(l, 1, 4 * (3 * 512 + 3), {none}).empty());
    }
  }

  TEST_CASE("spoilers: a quantity in another unit of the same measure is converted and a rate is not a size") {
    const Lesson l = parse_lesson("---\ntitle: T\nminutes: 5\nstrategy: ddp\nworld: 2\nmodel: tiny\n---\n"
                                  "## One\nThe link moves 4 GB/s; the bucket is 4 KiB; a save takes 2 minutes.\n"
                                  "```question\nask: Bytes?\nanswer: bucket[0].bytes\nunit: bytes\n```\n"
                                  "## Two\nNothing.\n```question\nask: How long?\nanswer: iteration.modeled_us / 1000\nunit: ms\ntolerance: 1%\n```\n"
                                  "## Three\nNothing.\n```question\nask: GB?\nanswer: bucket[0].bytes\nunit: GB\ntolerance: 1%\n```\n",
                                  "t.md");
    CHECK(find_text_spoiler(l, 0, 4096, {}).find("('4 KiB' is 4096 bytes)") != std::string::npos);
    CHECK(find_text_spoiler(l, 0, 4000, {}).empty());   // 4 KiB is not 4000 bytes, exactly
    CHECK(find_text_spoiler(l, 1, 120000, {}).find("('2 minutes' is 120000 ms)") != std::string::npos);
    CHECK(find_text_spoiler(l, 2, 4, {}).empty());      // "4 GB/s" is a rate
  }

  TEST_CASE("spoilers: the lesson's text is read up to the question, figures left to the screen check") {
    const double none = std::numeric_limits<double>::quiet_NaN();
    const Lesson l = parse_lesson("---\ntitle: T\nminutes: 5\nsummary: About 4547 things.\nstrategy: ddp\nworld: 2\nmodel: tiny\n---\n"
                                  "## One\nThe bucket holds {{bucket[0].bytes}} bytes; 16 GPUs.\n"
                                  "```question\nask: Bytes?\nanswer: bucket[0].bytes\nunit: bytes\nexplain: It is 9096.\n```\n"
                                  "## Two\nNothing here.\n```question\nask: Again?\nanswer: bucket[0].bytes\nunit: bytes\n```\n"
                                  "## Three\nLater: 7777.\n",
                                  "t.md");
    const std::vector<ScreenLine> text = lesson_text_before(l, 0);
    CHECK(has_line(text, "step 1 'One'", "The bucket holds   bytes; 16 GPUs."));
    CHECK(find_text_spoiler(l, 0, 4547, {}) == "summary: 'About 4547 things.'");
    CHECK(find_text_spoiler(l, 0, 9096, {}).empty());           // its own explanation comes after the check
    CHECK(find_text_spoiler(l, 1, 9096, {none}) == "step 1 'One', its explanation: 'It is 9096.'");  // read by then
    CHECK(find_text_spoiler(l, 1, 7777, {none}).empty());        // a later step is not read yet
    CHECK(find_text_spoiler(l, 0, 16, {}).empty());              // "16 GPUs" is not 16 bytes
    CHECK(text_spellings(16, true, "bytes") == std::vector<std::string>{"16 bytes"});
    CHECK(text_spellings(4547, true, "bytes") == std::vector<std::string>{"4547", "4,547"});
    CHECK(find_text_spoiler(l, 1, 5, {5}).empty());              // too plain to tell an earlier 5 from this one
  }
}

TEST_SUITE("app") {
  TEST_CASE("spoilers: a number that counts another unit in the text is another quantity") {
    const Lesson l = parse_lesson("---\ntitle: T\nminutes: 5\nstrategy: ddp\nworld: 2\nmodel: tiny\n---\n"
                                  "## One\nSequences of 2048 tokens, hidden 4096.\n"
                                  "```question\nask: Bytes?\nanswer: bucket[0].bytes\nunit: bytes\n```\n",
                                  "t.md");
    CHECK(find_text_spoiler(l, 0, 2048, {}).empty());  // 2048 tokens, not 2048 bytes
    CHECK(find_text_spoiler(l, 0, 4096, {}) == "step 1 'One': 'Sequences of 2048 tokens, hidden 4096.'");  // says nothing of its unit
  }
}

TEST_SUITE("app") {
  TEST_CASE("spoilers: no lesson writes a formula's answer in its text before the question, without a display") {
    // The lessons' plays (CTest's lesson_<name>) check every answer, live, under Xvfb; the answers the
    // planner computes need no run, so this checks them wherever the tests run, Xvfb or not, and the
    // choice questions whose expect: is plain arithmetic.
    int checked = 0, choices = 0;
    for (const std::string& p : lesson_paths(std::string(DTLAB_SOURCE_DIR) + "/lessons")) {
      const Lesson l = load_lesson(p);
      std::vector<double> answers(l.steps.size(), std::numeric_limits<double>::quiet_NaN());
      for (size_t k = 0; k < l.steps.size(); k++) {
        const std::optional<Question>& q = l.steps[k].question;
        if (!q) continue;
        // A choice question's right choice, where the lesson's `expect:` names it without a run: the
        // order rule reads the text for it. Its value is a place in its list, not an earlier answer.
        const double v = q->choices.empty() ? value_without_run(q->answer) : q->expect.empty() ? NAN : value_without_run(q->expect);
        if (!std::isfinite(v)) continue;
        if (q->choices.empty()) answers[k] = v;
        CAPTURE(p);
        CAPTURE(l.steps[k].title);
        CHECK(find_text_spoiler(l, static_cast<int>(k), v, answers) == "");
        (q->choices.empty() ? checked : choices)++;
      }
    }
    CHECK(checked >= 15);
    CHECK(choices >= 20);
  }
}

namespace {

// The review's "recall, not reasoning" pairs, as the questions stood (main before course-text;
// lesson 17 before its draws, 9bf66ae): each later question asked again what an earlier lesson had
// asked and answered. Only the lines the check reads are kept.
std::string old_lesson(const std::string& title, const std::string& header, const std::string& steps) {
  return "---\ntitle: " + title + "\nminutes: 10\n" + header + "---\n" + steps;
}

std::vector<Lesson> old_course() {
  const std::string ddp4 = "strategy: ddp\nworld: 4\nmodel: small\n";
  auto q = [](const std::string& title, const std::string& body) { return "## " + title + "\n\n```question\n" + body + "```\n\n"; };
  return {
      parse_lesson(old_lesson("Single device", ddp4,
                              q("A 7B model", "ask: A 7-billion-parameter model trained like this run (float32, AdamW): how many GB for its\n"
                                              "  parameters, gradients and optimizer state?\nanswer: plan.total(7e9, 1, \"no-shard\") / 1e9\n"
                                              "expect: 16 * 7\nunit: GB\n")),
                   "lessons/01_single_device.md"),
      parse_lesson(old_lesson("Data parallel", ddp4,
                              "## Copy\n\n```action\nmark epoch0\n```\n\n## Forgetting set_epoch\n\n```action\nset_epoch off\n```\n\n"
                              "```question\nask: Without set_epoch, what share of the samples stay with the rank they had in epoch 0?\n"
                              "answer: data.same_owner(\"epoch0\") / data.n\nexpect: 1\ntolerance: 0.01\n```\n"),
                   "lessons/02_data_parallel.md"),
      parse_lesson(old_lesson("Hangs", ddp4 + "timeout: 2\n",
                              "## Checkpoints: a save that outlasts the timeout\n\n```action\nscenario --fault delay:rank=0,collective=3,ms=4000\n```\n\n"
                              "```question\nask: Whom will the watchdog name as missing this time?\nchoice: Rank 0 = 0\n"
                              "choice: Ranks 1, 2 and 3 = 1\nreveal: run until run.failed\nanswer: watchdog.missing[0]\nexpect: 0\n```\n"),
                   "lessons/10_pitfall_hangs.md"),
      parse_lesson(old_lesson("Silent", ddp4,
                              "## The silent one: set_epoch\n\n```action\nscenario --model small --batch 256\nmark epoch0\nset_epoch off\n"
                              "run until epoch == 2 by iteration\n```\n\n"
                              "```question\nask: Of the {{data.n}} samples, how many belong to a different rank in epoch 2 than in epoch 0?\n"
                              "answer: data.n - data.same_owner(\"epoch0\")\nexpect: 0\nunit: samples\n```\n"),
                   "lessons/11_pitfall_silent.md"),
      parse_lesson(old_lesson("FSDP", "strategy: fsdp\nworld: 4\nmodel: small\n",
                              q("ZeRO", "ask: A 7B-parameter model, mixed-precision Adam, DDP on 4 GPUs: how many GB of model state does\n"
                                        "  each GPU hold (activations aside; 1 GB = 1e9 bytes)?\n"
                                        "answer: plan.total(7e9, 4, \"no-shard\", \"mixed\") / 1e9\nexpect: 16 * 7\ntolerance: 1%\nunit: GB\n") +
                                  q("Traffic", "ask: Per training step, how many times DDP's traffic does FULL_SHARD send per rank?\n"
                                               "answer: plan.comm(7e9, 8, \"full\", \"mixed\") / plan.comm(7e9, 8, \"no-shard\", \"mixed\")\n"
                                               "expect: 3 / 2\ntolerance: 2%\n")),
                   "lessons/12_fsdp_zero.md"),
      parse_lesson(old_lesson("Multi-node", ddp4,
                              q("Hierarchical", "ask: For the 14 GB of gradients on 2 nodes of 4 GPUs, how many GB does each GPU send across the\n"
                                                "  network in step 2?\nanswer: algo.busiest(\"ring\", 2, 14e9 / 4) / 1e9\nexpect: 14 / 4\n"
                                                "tolerance: 2%\nunit: GB\n") +
                                  q("Small messages", "ask: How many milliseconds will a 14 MB all-reduce take on the same Ethernet cluster (eth2x4)?\n"
                                                      "answer: cost.allreduce_us(\"eth2x4\", 8, 14e6) / 1e3\ntolerance: 10%\nunit: ms\n")),
                   "lessons/16_multinode_bandwidth.md"),
      parse_lesson(old_lesson("Interview drill", ddp4 + "timeout: 2\n",
                              "## What does set_epoch do?\n\n```action\nmark epoch0\nset_epoch off\n```\n\n"
                              "```question\nask: What share of the {{data.n}} samples will be on the same rank in epoch 1 as in epoch 0?\n"
                              "reveal: run until epoch == 1 by iteration\nanswer: data.same_owner(\"epoch0\") / data.n\nexpect: 1\ntolerance: 0.01\n```\n\n"
                              "## How do you save a checkpoint?\n\n```action\nset_epoch on\n"
                              "scenario --bucket-cap-mb 25 --first-bucket-mb 25 --fault delay:rank=0,collective=7,ms=3000\n```\n\n"
                              "```question\nask: What happens?\nchoice: nothing: the other ranks wait for rank 0 = 0\n"
                              "choice: it dies; the watchdog names rank 0 missing = 1\nchoice: it dies; the watchdog names ranks 1, 2, 3 missing = 2\n"
                              "reveal: run until run.failed by iteration\nanswer: run.failed * (1 + (watchdog.missing > 1))\nexpect: 1\n```\n\n"
                              "## FSDP or DDP: how much traffic?\n\n"
                              "```question\nask: Per optimizer step, how many times as many bytes does each GPU send under FULL_SHARD as under\n"
                              "  DDP?\nanswer: plan.comm(7e9, 8, \"full\", \"mixed\") / plan.comm(7e9, 8, \"no-shard\", \"mixed\")\n"
                              "expect: 1.5\ntolerance: 0.05\n```\n"),
                   "lessons/17_interview_drill.md"),
      parse_lesson(old_lesson("Ring or tree", "strategy: ddp\nworld: 8\nmodel: small\n",
                              q("Hierarchical", "ask: For 14 GB of gradients on ib2x4 (8 ranks), how many GB does the busiest GPU send to the other\n"
                                                "  node with the hierarchical all-reduce?\nanswer: algo.across(\"hierarchical\", \"ib2x4\", 8, 14e9) / 1e9\n"
                                                "expect: 2 * (2 - 1) / 2 * 14 / 4\ntolerance: 1%\nunit: GB\n")),
                   "lessons/19_ring_or_tree.md"),
      parse_lesson(old_lesson("LoRA", ddp4,
                              q("Over Ethernet", "ask: On eth2x4 (two nodes of 4 GPUs joined by 25 Gb Ethernet), how many milliseconds does the ring\n"
                                                 "  all-reduce of LoRA's 14 MB take on 8 ranks?\nanswer: cost.allreduce_us(\"eth2x4\", 8, 14e6) / 1e3\n"
                                                 "tolerance: 10%\nunit: ms\n")),
                   "lessons/22_lora_payload.md"),
  };
}

std::string repeat_of(const std::vector<Repeat>& found, const std::string& later) {
  for (const Repeat& r : found)
    if (r.later.rfind(later + ":", 0) == 0) return r.earlier.substr(0, r.earlier.find(':')) + ": " + r.why;
  return "";
}

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("repeats: each of the review's recall pairs is found on the old questions") {
    const std::vector<Repeat> found = find_repeats(old_course());
    for (const Repeat& r : found) MESSAGE(r.later << " repeats " << r.earlier << ": " << r.why);
    CHECK(repeat_of(found, "lessons/12_fsdp_zero.md") ==  // 12:19 = 1:84
          "lessons/01_single_device.md: the same answer (112 GB) to a prompt with the same numbers (7)");
    CHECK(repeat_of(found, "lessons/19_ring_or_tree.md") ==  // 19:82 = 16:101
          "lessons/16_multinode_bandwidth.md: the same answer (3.5 GB) to a prompt with the same numbers (14)");
    CHECK(repeat_of(found, "lessons/22_lora_payload.md").rfind("lessons/16_multinode_bandwidth.md: the same answer (", 0) == 0);  // 22 = 16:122
    CHECK(repeat_of(found, "lessons/22_lora_payload.md").find(" ms) to the same figure, cost.allreduce_us(\"eth2x4\", 8, 14e6) / 1e3") !=
          std::string::npos);
    CHECK(repeat_of(found, "lessons/11_pitfall_silent.md") ==  // set_epoch, 11 = 2
          "lessons/02_data_parallel.md: the same experiment (set_epoch off) asking the same live figures, data.n and data.same_owner");
    // The drill: set_epoch (= 2), the checkpoint that outlasts the timeout (= 10:111) and FULL_SHARD's
    // traffic (= 12:125); one line per question.
    int drill = 0;
    for (const Repeat& r : found) {
      if (r.later.rfind("lessons/17_interview_drill.md:", 0) != 0) continue;
      drill++;
      CAPTURE(r.later);
      CHECK((r.earlier.rfind("lessons/02_data_parallel.md:", 0) == 0 || r.earlier.rfind("lessons/10_pitfall_hangs.md:", 0) == 0 ||
             r.earlier.rfind("lessons/12_fsdp_zero.md:", 0) == 0));
    }
    CHECK(drill == 3);
    std::set<std::string> drill_why;
    for (const Repeat& r : found)
      if (r.later.rfind("lessons/17_interview_drill.md:", 0) == 0) drill_why.insert(r.earlier.substr(0, r.earlier.find(':')) + ": " + r.why);
    CHECK(drill_why.count("lessons/10_pitfall_hangs.md: the same experiment (the same faults outlasting the watchdog's timeout) asking "
                          "the same live figures, watchdog.missing") == 1);
    CHECK(drill_why.count("lessons/12_fsdp_zero.md: the same answer (1.5) to the same figure, plan.comm(7e9, 8, \"full\", \"mixed\") / "
                          "plan.comm(7e9, 8, \"no-shard\", \"mixed\")") == 1);
    CHECK(found.size() == 7);  // nothing else: 1, 2, 10 and 16 repeat nothing before them
  }

  TEST_CASE("repeats: no lesson asks again what an earlier lesson asked under every draw of the drill") {
    // A drawn lesson repeats an earlier one only when it does under every draw: parse the course
    // with a few seeds and keep the repeats every one of them finds.
    std::map<std::string, int> seen;  // "later <- earlier: why" -> how many seeds found it
    // Under the sanitizers (DTLAB_TEST_QUICK) two seeds, for the memory of the parser and the repeat
    // finder: what the course says is the same there, and the Release run checks it under all eight.
    const std::vector<uint64_t> seeds = test::quick() ? std::vector<uint64_t>{1, 2} : std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8};
    for (uint64_t seed : seeds) {
      std::vector<Lesson> course;
      for (const std::string& p : lesson_paths(std::string(DTLAB_SOURCE_DIR) + "/lessons")) course.push_back(load_lesson(p, seed));
      REQUIRE(course.size() >= 28);
      std::set<std::string> once;
      for (const Repeat& r : find_repeats(course)) once.insert(r.later + " repeats " + r.earlier);
      for (const std::string& k : once) seen[k]++;
    }
    for (const auto& entry : seen) {  // no structured binding: clang 14 cannot capture one (CAPTURE is a lambda)
      const std::string& repeat = entry.first;
      CAPTURE(repeat);
      if (!test::quick()) CHECK(entry.second < static_cast<int>(seeds.size()));
    }
  }
}

TEST_SUITE("app") {
  TEST_CASE("spoilers: an answer that is the guess 'none' or 'all' needs no reasoning, on the passages the review found") {
    {
      const Lesson l = parse_lesson(kOldNoSetEpoch, "lessons/02_data_parallel.md");
      REQUIRE(l.steps[0].question);
      CHECK(bare_guess(*l.steps[0].question, 1.0) == "'all' or 'the same' (1)");  // every sample stays
      CHECK(bare_guess(*l.steps[0].question, 0.995) != "");                      // within its tolerance
      CHECK(bare_guess(*l.steps[0].question, 0.25).empty());                      // with set_epoch: one in 4
    }
    {
      const Lesson l = parse_lesson(kOldTpSpanning, "lessons/21_3d_parallelism.md");
      REQUIRE(l.steps[0].question);
      const double v = value_without_run(l.steps[0].question->answer);  // the planner's count, no run
      CHECK(v == 0);
      CHECK(bare_guess(*l.steps[0].question, v) == "'none' (0)");
    }
    // A count of 1 is not a guess (one bucket in DDP's first iteration is the point); 1 in a unit is
    // an amount; a choice question shows its alternatives.
    Question q;
    q.ask = "How many bucket all-reduces does it launch?";
    CHECK(bare_guess(q, 1).empty());
    CHECK(bare_guess(q, 0) == "'none' (0)");
    q.ask = "How many all-reduces in iteration 0?";  // "iteration" is not "ratio"
    CHECK(bare_guess(q, 1).empty());
    q.ask = "What share of it hides?";
    q.unit = "%";
    CHECK(bare_guess(q, 100) == "'all' (100%)");
    CHECK(bare_guess(q, 1).empty());
    q.unit = "GB";
    CHECK(bare_guess(q, 1).empty());
    q.choices.push_back({"none", Figure::parse("0")});
    CHECK(bare_guess(q, 0).empty());
  }

  TEST_CASE("spoilers: no question of the course is answered by guessing 'none' or 'all'") {
    // The plays (CTest's lesson_<name>) check every live answer; this checks, wherever the tests run,
    // the answers the lessons' own `expect:` states as plain arithmetic or the planner computes.
    int checked = 0;
    for (const std::string& p : lesson_paths(std::string(DTLAB_SOURCE_DIR) + "/lessons")) {
      const Lesson l = load_lesson(p);
      for (const LessonStep& st : l.steps) {
        if (!st.question || !st.question->choices.empty()) continue;
        double v = value_without_run(st.question->answer);
        if (!std::isfinite(v) && !st.question->expect.empty()) v = value_without_run(st.question->expect);
        if (!std::isfinite(v)) continue;
        CAPTURE(p);
        CAPTURE(st.title);
        CHECK(bare_guess(*st.question, v) == "");
        checked++;
      }
    }
    CHECK(checked >= 60);
  }
}
