// Hostile trace folders (engine/trace/trace_input.h, trace_import.h; dtlab-cli trace summarize; the
// lab's --open): each class of input that once crashed, hung or printed an absurd number as a result
// is fed here and must end in one sentence naming the file and what is wrong, or be read bounded.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/trace/trace_import.h"
#include "engine/trace/trace_input.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#ifdef DTLAB_HAVE_GUI
#include "tests/gui_util.h"
#endif

namespace fs = std::filesystem;
using namespace dtlab;
using dtlab::test::contains;
using dtlab::test::error_sentence;

namespace trace_hostile {

std::string event(const std::string& name, const std::string& cat, const std::string& ts, const std::string& dur, int tid,
                  const std::string& args = "{}") {
  return R"({"ph": "X", "cat": ")" + cat + R"(", "name": ")" + name + R"(", "pid": 0, "tid": )" + std::to_string(tid) +
         R"(, "ts": )" + ts + R"(, "dur": )" + dur + R"(, "args": )" + args + "}";
}

// One rank of a Kineto job with one all-reduce; the fields under test are parameters.
struct Rank {
  int rank = 0, world = 2;
  std::string kernel = "void gemm_kernel<float>(...)", collective = "allreduce";
  std::string kernel_ts = "10", kernel_dur = "390", nelems = "1000";
  std::string text() const {
    const std::string comms = R"({"Collective name": ")" + collective + R"(", "In msg nelems": )" + nelems +
                              R"(, "Out msg nelems": )" + nelems + R"(, "Group size": 2, "dtype": "Float"})";
    const std::vector<std::string> ev = {
        event("ProfilerStep#7", "user_annotation", "0", "1000", 1),
        event(kernel, "kernel", kernel_ts, kernel_dur, 7),
        event("record_param_comms", "cpu_op", "300", "5", 1, comms),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "310", "290", 20),
    };
    std::string s = R"({"distributedInfo": {"backend": "nccl", "rank": )" + std::to_string(rank) + R"(, "world_size": )" +
                    std::to_string(world) + R"(}, "traceEvents": [)";
    for (size_t i = 0; i < ev.size(); i++) s += (i ? ",\n" : "\n") + ev[i];
    return s + "]}";
  }
};

// A legacy trace (no rank inside: the file name says it), one op.
const std::string kLegacy = R"([{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 1, "pid": 0, "tid": 1}])";

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Two ranks' texts: r0 as rank 0 and r1 as rank 1.
std::vector<std::pair<std::string, std::string>> two_ranks(Rank r0, Rank r1) {
  r0.rank = 0, r1.rank = 1;
  return {{"rank0.json", r0.text()}, {"rank1.json", r1.text()}};
}

void write_two_ranks(const fs::path& dir, Rank r0, Rank r1) {
  for (const auto& [name, text] : two_ranks(r0, r1)) write(dir / name, text);
}

// One line on stderr, exit 2, nothing on stdout: the CLI's form of a refusal.
std::string cli_refusal(const std::vector<std::string>& args) {
  const test::CliResult r = test::run_cli(args);
  INFO(r.out);
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("dtlab-cli: ", 0) == 0);
  return r.err;
}

bool valid_utf8_cut(const std::string& s) {
  // No character split before the "...": the byte before it is not a lead byte missing its tail.
  const size_t n = s.size() - 3;
  size_t i = n;
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) i--;
  if (i == 0) return false;
  const auto lead = static_cast<unsigned char>(s[i - 1]);
  const size_t len = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  return n - (i - 1) == len;
}

}  // namespace trace_hostile

using namespace trace_hostile;

TEST_SUITE("trace hostile") {
  TEST_CASE("hostile crash: a rank number too large for any job in a file name is the missing-rank sentence, not stoi") {
    const std::string err = error_sentence([] { import_trace_texts({{"rank0.json", kLegacy}, {"rank99999999999.json", kLegacy}}); });
    CHECK(err == "rank 1 is missing: the traces are of ranks 0, 99999999999, but 2 files make ranks 0 to 1; "
                 "open every rank's trace of the run (one file per rank).");
    const std::string digits(400, '9');  // past int64 too: said as written, cut
    CHECK(contains(error_sentence([&] { import_trace_texts({{"rank0.json", kLegacy}, {"rank" + digits + ".json", kLegacy}}); }),
                   "rank 1 is missing: the traces are of ranks 0, 999999999999999999999..."));
    // A step number past int is a step without a number, not undefined behaviour.
    std::string big_step = kLegacy;
    big_step.insert(1, R"({"ph": "X", "name": "ProfilerStep#99999999999999999999", "ts": 0, "dur": 5, "pid": 0, "tid": 1}, )");
    const ImportedTrace tr = import_trace_texts({{"rank0.json", big_step}});
    REQUIRE(tr.ranks[0].steps.size() == 1);
    CHECK(tr.ranks[0].steps[0].number == -1);
    // distributedInfo's rank: negative is corrupted, too large is out of range.
    Rank neg;
    neg.world = 1;
    std::string t = neg.text();
    t.replace(t.find(R"("rank": 0)"), 9, R"("rank": -7)");
    CHECK(contains(error_sentence([&] { import_trace_texts({{"a.json", t}}); }), "a.json's distributedInfo says rank -7; ranks count from 0"));
  }

  TEST_CASE("hostile crash: a symbolic link loop in or as the trace folder is one sentence naming it") {
    test::TempDir dir("dtlab_hostile_loop");
    write_two_ranks(dir.path, Rank{}, Rank{});
    fs::create_symlink("loop.json", dir.path / "loop.json");
    CHECK(error_sentence([&] { import_traces({dir.path.string()}); }) ==
          dir.file("loop.json") + " is a symbolic link loop (or a chain of links too long to resolve); point it at the trace "
                                  "file itself (or move it out of the trace directory)");
    CHECK(contains(error_sentence([&] { import_traces({dir.file("loop.json")}); }), "loop.json is a symbolic link loop"));
    CHECK(contains(cli_refusal({"trace", "summarize", dir.path.string()}), "loop.json is a symbolic link loop"));
    fs::remove(dir.path / "loop.json");
    fs::create_symlink("gone.json", dir.path / "rank2.json");
    CHECK(contains(error_sentence([&] { import_traces({dir.path.string()}); }), "rank2.json is a symbolic link to nothing"));
    fs::remove(dir.path / "rank2.json");
    fs::create_symlink("dtlab.json", dir.path / "dtlab.json");  // the sidecar, looped
    CHECK(contains(cli_refusal({"trace", "summarize", dir.path.string()}), "dtlab.json is a symbolic link loop"));
  }

  TEST_CASE("hostile crash: JSON nested 200,000 deep, in a trace or in dtlab.json, is refused at 256 levels") {
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    CHECK(error_sentence([&] { import_trace_texts({{"r0.json", deep}}); }) ==
          "r0.json nests its JSON deeper than 256 levels; a profiler's trace is never this deep (it nests five, "
          "dtlab.json two): the file is corrupted.");
    // Under an event's args, where the importer keeps reading.
    Rank r;
    r.world = 1;
    std::string t = r.text();
    t.replace(t.find(R"("dtype": "Float")"), 16, R"("x": )" + std::string(300, '[') + std::string(300, ']'));
    CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", t}}); }), "r0.json nests its JSON deeper than 256 levels"));

    test::TempDir dir("dtlab_hostile_deep");
    write_two_ranks(dir.path, Rank{}, Rank{});
    // A setting nested 200,000 deep: read_trace_meta's message would dump() it, recursing once a level.
    write(dir.path / "dtlab.json", R"({"model": )" + deep + "}");
    CHECK(contains(cli_refusal({"trace", "summarize", dir.path.string()}), "dtlab.json nests its JSON deeper than 256 levels"));
    CHECK(contains(error_sentence([&] { check_trace_sidecar({dir.path.string()}); }), "dtlab.json nests its JSON deeper than 256 levels"));
    write(dir.path / "dtlab.json", std::string(2 << 20, ' '));
    CHECK(contains(error_sentence([&] { check_trace_sidecar({dir.file("rank0.json")}); }), "dtlab.json is 2.0 MiB; dtlab.json holds a few settings"));
    write(dir.path / "dtlab.json", R"({"model": "mlp:2,8,3"})");
    CHECK(error_sentence([&] { check_trace_sidecar({dir.path.string()}); }) == "(no error)");
  }

  TEST_CASE("hostile hang: 100 KB names are kept to 256 bytes, cut on a UTF-8 boundary, and printed bounded") {
    std::string huge;
    while (huge.size() < 100000) huge += "k\xC3\xA9rnel_";  // "kérnel_": two-byte characters to cut around
    Rank r;
    r.kernel = huge;
    r.collective = huge;
    const ImportedTrace tr = import_trace_texts(two_ranks(r, r));
    bool cut = false;
    for (const std::string& n : tr.names) {
      CHECK(n.size() <= kMaxTraceNameBytes);
      if (n.size() > 100) {
        cut = true;
        CHECK(n.ends_with("..."));
        CHECK(valid_utf8_cut(n));
      }
    }
    CHECK(cut);
    for (const RankTrace& rt : tr.ranks)
      for (const RankCollective& c : rt.collectives) CHECK(c.name.size() <= kMaxTraceNameBytes);

    test::TempDir dir("dtlab_hostile_names");
    write_two_ranks(dir.path, r, r);
    const test::CliResult out = test::run_cli({"trace", "summarize", dir.path.string()});
    REQUIRE(out.code == 0);
    std::istringstream lines(out.out);
    size_t longest = 0;
    for (std::string line; std::getline(lines, line);) longest = std::max(longest, line.size());
    CHECK(longest < 1000);
  }

  TEST_CASE("hostile values: times and sizes no profiler records are refused naming the file, the event and the field") {
    auto refused = [](Rank r) { return error_sentence([&] { import_trace_texts(two_ranks(r, Rank{})); }); };
    Rank far;
    far.kernel_ts = "4e15";
    CHECK(contains(refused(far), "rank0.json: event 2 (\"void gemm_kernel<float>(...)\") has \"ts\" 4e+15 us, beyond any clock a profiler reads"));
    far.kernel_ts = "2e15";  // a clock reading, but 63 years from the file's other events
    CHECK(contains(refused(far), "rank0.json: event 2 (\"void gemm_kernel<float>(...)\") has \"ts\" 2e+15 us and \"dur\" 390 us, 2e+09 s away from the file's other events"));
    Rank huge_dur;
    huge_dur.kernel_dur = "1e300";
    CHECK(contains(refused(huge_dur), "rank0.json: event 2 (\"void gemm_kernel<float>(...)\") has \"dur\" 1e+300 us, longer than any profiled region"));
    Rank negative;
    negative.kernel_dur = "-5";
    CHECK(contains(refused(negative), "has \"dur\" -5 us, a negative duration"));
    Rank nan_ts;
    nan_ts.kernel_ts = "\"nan\"";
    CHECK(contains(refused(nan_ts), "has \"ts\" nan us"));
    Rank wraps;
    wraps.nelems = "4611686018427387904";  // 2^62 floats: 2^64 bytes, 0 in int64 arithmetic
    CHECK(contains(refused(wraps), "rank0.json: event 3 (\"record_param_comms\") has \"In msg nelems\" 4611686018427387904, more than 256 TiB of Float"));
    wraps.nelems = "-3";
    CHECK(contains(refused(wraps), "has \"In msg nelems\" -3, a negative element count"));
    Rank fits;
    fits.nelems = "17179869184";  // 64 GiB of floats: large, but a job's
    const ImportedTrace tr = import_trace_texts(two_ranks(fits, fits));
    CHECK(tr.collectives.at(0).bytes == int64_t{68719476736});
  }

  TEST_CASE("hostile messages: a bad byte mid-file is not called truncated, a cut one is") {
    const std::string good = Rank{}.text();
    std::string bad = good;
    const size_t at = good.find("record_param_comms") - 5;
    bad[at] = '\x01';
    const std::string err = error_sentence([&] { import_trace_texts({{"r0.json", bad}}); });
    CHECK(err == "r0.json breaks its JSON at byte " + std::to_string(at) + " of " + std::to_string(good.size()) +
                     " (counted from 0): the bytes there are not JSON, so the file is corrupted, not cut short; export the trace again.");
    CHECK(!contains(err, "truncated"));
    CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", good.substr(0, 300)}}); }),
                   "r0.json ends at byte 300 before its JSON is complete: the file is truncated"));
    // The same through a gzip file, where the size is known only at its end.
    test::TempDir dir("dtlab_hostile_byte");
    gzFile gz = gzopen(dir.file("rank0.json.gz").c_str(), "wb");
    gzwrite(gz, bad.data(), static_cast<unsigned>(bad.size()));
    gzclose(gz);
    CHECK(contains(error_sentence([&] { import_traces({dir.file("rank0.json.gz")}); }), "rank0.json.gz breaks its JSON at byte " + std::to_string(at)));
  }

  TEST_CASE("hostile messages: a FIFO or a device is not a regular file, not 'does not exist'") {
    test::TempDir dir("dtlab_hostile_fifo");
    REQUIRE(::mkfifo(dir.file("rank0.json").c_str(), 0600) == 0);
    CHECK(contains(error_sentence([&] { import_traces({dir.file("rank0.json")}); }), "rank0.json is a FIFO (a named pipe), not a regular file"));
    CHECK(contains(error_sentence([&] { import_traces({dir.path.string()}); }), "rank0.json is a FIFO (a named pipe), not a regular file"));
    CHECK(error_sentence([] { import_traces({"/dev/zero"}); }) ==
          "/dev/zero is a device, not a regular file; save its contents to a file and give that path");
    CHECK(contains(cli_refusal({"trace", "summarize", dir.file("rank0.json")}), "is a FIFO (a named pipe), not a regular file"));
    CHECK(contains(error_sentence([&] { import_traces({dir.file("none.json")}); }), "none.json does not exist;"));
  }

  TEST_CASE("hostile messages: among 3,000 files, the missing rank is named first") {
    std::vector<std::pair<std::string, std::string>> files;
    for (int r = 0; r <= 3000; r++)
      if (r != 1234) files.emplace_back("rank" + std::to_string(r) + ".json", kLegacy);
    const std::string err = error_sentence([&] { import_trace_texts(files); });
    CHECK(err == "rank 1234 is missing: the traces are of ranks 0-1233, 1235-3000, but 3,000 files make ranks 0 to 2999; "
                 "open every rank's trace of the run (one file per rank).");
    // Many missing: a few named, then a count.
    files.clear();
    for (int r = 0; r < 100; r++) files.emplace_back("rank" + std::to_string(r * 2) + ".json", kLegacy);
    CHECK(contains(error_sentence([&] { import_trace_texts(files); }),
                   "ranks 1, 3, 5, 7 and 46 more are missing: the traces are of ranks 0, 2, 4, 6, 8, 10, 12, 14 and 92 more, but 100 files"));
  }

  TEST_CASE("hostile messages: a gzip bomb is refused as too large once decompressed, not out of memory") {
    test::TempDir dir("dtlab_hostile_bomb");
    gzFile gz = gzopen(dir.file("rank0.json.gz").c_str(), "wb9");
    gzwrite(gz, "[", 1);
    const std::string spaces(1 << 20, ' ');
    for (int i = 0; i < 24; i++) gzwrite(gz, spaces.data(), static_cast<unsigned>(spaces.size()));
    gzclose(gz);
    const std::string err = error_sentence([&] { import_traces({dir.file("rank0.json.gz")}); });
    CHECK(contains(err, "rank0.json.gz inflates to over 250 times its gzip size (16.1 MiB from its first "));
    CHECK(contains(err, "it is a gzip bomb, not a trace."));
  }

#ifdef DTLAB_HAVE_GUI
  TEST_CASE("hostile hang: the lab opens a trace of 100 KB names and draws its frames, and refuses hostile folders before a window") {
    test::TempDir dir("dtlab_hostile_lab");
    std::string huge;
    while (huge.size() < 100000) huge += "k\xC3\xA9rnel_";
    fs::create_directories(dir.path / "job");
    Rank r;
    r.kernel = r.collective = huge;
    write_two_ranks(dir.path / "job", r, r);
    // Refusals come before any window: no display needed.
    fs::create_directories(dir.path / "deep");
    write_two_ranks(dir.path / "deep", Rank{}, Rank{});
    write(dir.path / "deep" / "dtlab.json", R"({"model": )" + std::string(200000, '[') + std::string(200000, ']') + "}");
    const test::ShellResult deep = test::shell(std::string("env -u DISPLAY ") + DTLAB_APP_PATH + " --open " + dir.file("deep"));
    CHECK(deep.code == 2);
    CHECK(deep.out.rfind("dtlab: " + dir.file("deep/dtlab.json") + " nests its JSON deeper than 256 levels", 0) == 0);
    REQUIRE(::mkfifo(dir.file("fifo.json").c_str(), 0600) == 0);
    const test::ShellResult fifo = test::shell(std::string("env -u DISPLAY ") + DTLAB_APP_PATH + " --open " + dir.file("fifo.json"));
    CHECK(fifo.code == 2);
    CHECK(fifo.out.rfind("dtlab: --open " + dir.file("fifo.json") + " is a FIFO (a named pipe), not a regular file", 0) == 0);

    DTLAB_REQUIRE_XVFB();
    const test::ShellResult lab = test::run_app("--open " + dir.file("job") + " --bench-frames 10", dir);
    INFO(lab.out);
    REQUIRE(lab.code == 0);
    // No timing assert (docs/testing.md): the hang was a label measured one byte shorter at a time,
    // every frame; the lab now finishes its frames (CTest's timeout bounds the run) and the load and
    // frame times are printed for a person to read ("trace load: ... done in 0.12 s").
    CHECK(!test::line_starting(lab.out, "trace load: ").empty());
    CHECK(!test::line_starting(lab.out, "frame benchmark: ").empty());
    MESSAGE(test::line_starting(lab.out, "trace load: ") << " / " << test::line_starting(lab.out, "frame benchmark: "));
  }
#endif
}
