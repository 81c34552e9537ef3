// The lab as an imported-trace viewer (dtlab --open, app/trace_loader.h, app/views/trace_view.cpp):
// the background loader (whole trace or nothing, errors as one sentence, cancel), the script
// commands that drive it, and the app under Xvfb as a person would use it: the committed fixtures
// open and draw, a truncated file shows its sentence while the lab keeps running, bad flags exit 2
// with one sentence. The Xvfb cases skip with a message when xvfb-run is not installed.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "app/script.h"
#include "app/trace_loader.h"
#include "app/views/views.h"
#include "engine/core/check.h"
#include "tests/gui_util.h"
#include "tests/test_util.h"
#include "test_util.h"

using namespace dtlab;
namespace fs = std::filesystem;

using dtlab::test::read_file;

namespace {

using Result = test::ShellResult;
using test::shell;

const std::string kTraceDir = std::string(DTLAB_SOURCE_DIR) + "/tests/data/traces";

// Polls until the load (or comparison) is over, for at most `seconds`.
const app::TraceSnapshot& settle(app::TraceLoader& l, bool compare = false, double seconds = 60) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    const app::TraceSnapshot& t = l.poll();
    if ((compare ? t.compare : t.load) != app::TaskState::Running) return t;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return l.poll();
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_SUITE("trace gui") {
  TEST_CASE("trace loader: a whole trace indexed on its thread, or one sentence, dtlab.json read beside it") {
    const std::string dir = kTraceDir + "/gloo_ddp_w4";
    const app::TraceFiles files = app::list_trace_files({dir});
    REQUIRE(files.files.size() == 4);  // rank0..3.json, not dtlab.json
    CHECK(files.files[0].find("rank0.json") != std::string::npos);
    CHECK(files.bytes > 100000);
    const app::TraceMeta meta = app::read_trace_meta({dir});
    CHECK(meta.model == "mlp:2,512,512,3");
    CHECK(meta.batch == 32);
    CHECK(meta.world == 4);
    CHECK(app::read_trace_meta({kTraceDir + "/kineto_nccl_w4"}).path.empty());

    app::TraceLoader loader;
    loader.open({dir}, {});
    const app::TraceSnapshot& t = settle(loader);
    REQUIRE(t.load == app::TaskState::Done);
    REQUIRE(t.trace);
    CHECK(t.files == 4);
    CHECK(t.fraction == 1.0);
    const ImportedTrace& tr = t.trace->trace;
    const app::TraceIndex& ix = t.trace->index;
    REQUIRE(ix.ranks.size() == tr.ranks.size());
    CHECK(ix.hue.size() == tr.names.size());
    for (size_t r = 0; r < tr.ranks.size(); r++) {
      const app::RankIndex& ri = ix.ranks[r];
      bool compute = false, comm = false;
      for (const app::TraceRow& row : ri.rows) {
        compute = compute || (row.lane == TraceLane::Compute && !row.spans.empty());
        comm = comm || (row.lane == TraceLane::Comm && !row.spans.empty());
        REQUIRE(row.reach.size() == row.spans.size());
        for (size_t i = 1; i < row.spans.size(); i++) {  // by begin, outermost only, reach running
          const TraceSpan& a = tr.ranks[r].spans[static_cast<size_t>(row.spans[i - 1])];
          const TraceSpan& b = tr.ranks[r].spans[static_cast<size_t>(row.spans[i])];
          CHECK(a.begin_us <= b.begin_us);
          CHECK(row.reach[i] >= row.reach[i - 1]);
          CHECK(b.cls != SpanClass::Issue);
        }
      }
      CHECK(compute);
      CHECK(comm);
      for (size_t i = 1; i < ri.overlap.size(); i++) CHECK(ri.overlap[i - 1].second <= ri.overlap[i].first);
      // Every matched collective maps back from each rank's own list.
      for (size_t k = 0; k < tr.collectives.size(); k++)
        CHECK(ri.collective_of[static_cast<size_t>(tr.collectives[k].rank_index[r])] == static_cast<int>(k));
    }

    // A truncated file: nothing is shown but the sentence naming it.
    test::TempDir bad("dtlab_trace_bad");
    const std::string text = read_file(dir + "/rank0.json");
    std::ofstream(bad.file("rank0.json"), std::ios::binary) << text.substr(0, text.size() / 3);
    std::ofstream(bad.file("rank1.json"), std::ios::binary) << read_file(dir + "/rank1.json");
    loader.open({bad.path.string()}, {});
    const app::TraceSnapshot& f = settle(loader);
    CHECK(f.load == app::TaskState::Failed);
    CHECK(!f.trace);
    CHECK(f.error.find("rank0.json") != std::string::npos);
    CHECK(f.error.find('\n') == std::string::npos);

    loader.open({bad.file("missing")}, {});
    CHECK(loader.poll().load == app::TaskState::Failed);
    CHECK(loader.poll().error.rfind("--open " + bad.file("missing") + " does not exist", 0) == 0);

    // Reopening cancels a load under way; what remains is one whole trace or a cancelled load.
    loader.open({dir}, {});
    loader.cancel();
    const app::TaskState s = settle(loader).load;
    CHECK((s == app::TaskState::Cancelled || s == app::TaskState::Done));
    if (s == app::TaskState::Done) CHECK(loader.poll().trace);
    else CHECK(!loader.poll().trace);
  }

  TEST_CASE("trace loader: the comparison runs on its own thread") {
    app::TraceLoader loader;
    loader.open({kTraceDir + "/kineto_nccl_w2"}, {});
    REQUIRE(settle(loader).load == app::TaskState::Done);
    TraceCompareOptions o;
    o.model = "mlp:2,512,512,3";
    o.profile = "nvlink8";
    loader.compare(o);
    const app::TraceSnapshot& t = settle(loader, true, 120);
    INFO(t.compare_error);
    REQUIRE(t.compare == app::TaskState::Done);
    REQUIRE(t.comparison);
    CHECK(t.comparison->profile == "nvlink8");
    CHECK(!t.comparison->rows.empty());
    CHECK(t.compare_options.model == "mlp:2,512,512,3");
    o.model = "mlp:2,x";
    loader.compare(o);
    const app::TraceSnapshot& f = settle(loader, true);
    CHECK(f.compare == app::TaskState::Failed);
    CHECK(f.compare_error.find("mlp:2,x") != std::string::npos);
    CHECK(!f.comparison);
  }

  TEST_CASE("trace script commands: parsed up front, with one sentence for a mistake") {
    auto cmds = app::parse_script("wait trace; wait compare 30s; select collective 2; compare nvlink8; compare; zoom iteration 3; "
                                  "zoom all; view breakdown; view collectives",
                                  "--run");
    REQUIRE(cmds.size() == 9);
    CHECK(cmds[0].kind == app::ScriptCommand::WaitFor);
    CHECK(cmds[0].arg == "trace");
    CHECK(cmds[0].seconds > 0);
    CHECK(cmds[1].arg == "compare");
    CHECK(cmds[1].seconds == doctest::Approx(30));
    CHECK(cmds[2].kind == app::ScriptCommand::Select);
    CHECK(cmds[2].count == 2);
    CHECK(cmds[3].arg == "nvlink8");
    CHECK(cmds[4].arg.empty());
    CHECK(cmds[5].kind == app::ScriptCommand::Zoom);
    CHECK(cmds[5].count == 3);
    CHECK(cmds[6].arg == "all");
    for (const auto& c : cmds) CHECK(app::trace_command(c));
    CHECK(app::live_command(app::parse_script("step ring", "--run")[0]));
    CHECK(test::script_error("select collective x").find("select takes 'collective K'") != std::string::npos);
    CHECK(test::script_error("select bucket 1").find("select takes 'collective K'") != std::string::npos);
    CHECK(test::script_error("compare xx").find("hardware profile 'xx' is not known") != std::string::npos);
    CHECK(test::script_error("zoom sideways").find("zoom takes all, iteration N") != std::string::npos);
    CHECK(test::script_error("wait trace forever").find("wait trace takes at most one limit") != std::string::npos);
  }

  TEST_CASE("trace flags: bad values exit 2 with one sentence, before any window opens") {
    test::TempDir dir("dtlab_trace_flags");
    const std::string w4 = kTraceDir + "/gloo_ddp_w4";
    const struct {
      std::string args, starts;
    } cases[] = {
        {"--open " + dir.file("nope"), "dtlab: --open " + dir.file("nope") + " does not exist;"},
        {"--open " + dir.path.string(), "dtlab: --open " + dir.path.string() + " holds no .json or .json.gz trace;"},
        {"--open /dev/zero", "dtlab: --open /dev/zero is a device, not a regular file"},
        {"--open " + w4 + " --trace-ranks 0,1", "dtlab: --trace-ranks names 2 ranks for 4 trace files;"},
        {"--open " + w4 + " --trace-ranks 0,1,1,2", "dtlab: --trace-ranks gives rank 1 twice;"},
        {"--open " + w4 + " --compare-profile fast", "dtlab: --compare-profile: hardware profile 'fast' is not known"},
        {"--open " + w4 + " --trace-model mlp:2,x", "dtlab: --trace-model: model 'mlp:2,x'"},
        {"--trace-model mlp:2,3", "dtlab: --trace-model goes with --open DIR;"},
        {"--open " + w4 + " --world 2", "dtlab: --open shows a recorded job, so --world cannot apply;"},
        {"--open " + w4 + " --attach localhost:1", "dtlab: --open shows recorded traces and --attach a launched run;"},
        {"--open " + w4 + " --run 'step collective 2'", "dtlab: script command 1 steps a live run, and --open shows a recorded job;"},
        {"--open " + w4 + " --run 'view ring'", "dtlab: script command 1 'view ring' shows a live run;"},
        {"--run 'select collective 1'", "dtlab: script command 1 works on imported traces; add --open DIR"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.args);
      const Result r = shell(std::string("env -u DISPLAY ") + DTLAB_APP_PATH + " " + c.args);
      CHECK(r.code == 2);
      CHECK(r.out.rfind(c.starts, 0) == 0);
      CHECK(lines(r.out) == 1);
    }
  }

  TEST_CASE("trace viewer under Xvfb: gloo_ddp_w4 opens, draws every panel, selects a collective") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir("dtlab_trace_gui");
    const std::string all = dir.file("all.png"), breakdown = dir.file("breakdown.png");
    const Result r = test::run_app("--open " + kTraceDir + "/gloo_ddp_w4 --run 'wait trace; select collective 1; screenshot " + all +
                                 "; view breakdown; screenshot " + breakdown + "; quit'",
                             dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("trace loaded in") != std::string::npos);
    CHECK(r.out.find("gloo_ddp_w4: 4 ranks, legacy autograd profiler, gloo, 3 iterations") != std::string::npos);
    CHECK(r.out.find("selected collective 1: allreduce") != std::string::npos);
    CHECK(r.out.find("(1280x720): gloo_ddp_w4: 4 ranks") != std::string::npos);
    CHECK(r.out.find("collective 1 selected") != std::string::npos);
    const test::Image a = test::load_png(all);
    CHECK(a.w == 1280);
    CHECK(a.h == 720);
    for (int rank = 0; rank < 4; rank++) CHECK(test::count_near(a, app::rank_color(rank, 4)) > 30);  // the lanes' rank labels
    CHECK(test::count_near(a, IM_COL32(64, 190, 192, 255), 12) > 2000);  // the comm lanes' all-reduces (the live timeline's teal)
    const test::Image b = test::load_png(breakdown);
    CHECK(test::count_near(b, IM_COL32(255, 236, 110, 255), 12) > 2000);  // communication under compute, in the bars
  }

  TEST_CASE("trace viewer under Xvfb: a truncated file shows its sentence, and the lab keeps running") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir("dtlab_trace_trunc");
    const std::string text = read_file(kTraceDir + "/gloo_ddp_w2/rank0.json");
    fs::create_directories(dir.file("job"));
    std::ofstream(dir.file("job/rank0.json"), std::ios::binary) << text.substr(0, text.size() / 2);
    std::ofstream(dir.file("job/rank1.json"), std::ios::binary) << read_file(kTraceDir + "/gloo_ddp_w2/rank1.json");
    const std::string png = dir.file("error.png");
    const Result r = test::run_app("--open " + dir.file("job") + " --run 'wait trace; screenshot " + png + "; wait 0.2s; quit'", dir);
    INFO(r.out);
    CHECK(r.code == 2);  // the script went on to its screenshot and quit; the failed load makes the exit code
    CHECK(r.out.find("dtlab: " + dir.file("job/rank0.json")) != std::string::npos);
    CHECK(r.out.find("(1280x720): job: failed to open") != std::string::npos);
    const test::Image im = test::load_png(png);
    CHECK(test::count_near(im, IM_COL32(255, 107, 92, 255), 30) > 200);  // the sentence, in red
  }

  TEST_CASE("trace viewer under Xvfb: the frame benchmark counts the frames drawn while the traces load") {
    DTLAB_REQUIRE_XVFB();
    test::TempDir dir("dtlab_trace_bench");
    const Result r = test::run_app("--open " + kTraceDir + "/kineto_nccl_w4 --bench-frames 20", dir);
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("frame benchmark: 20 frames, world 4") != std::string::npos);
    CHECK(r.out.find("trace load: 4 files") != std::string::npos);
    CHECK(r.out.find("frames drawn while loading: wall ms per frame median") != std::string::npos);
  }
}

#endif  // DTLAB_HAVE_GUI
