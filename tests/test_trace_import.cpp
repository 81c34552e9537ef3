// Import of PyTorch profiler traces (engine/trace/trace_import.h): synthetic traces whose every
// number is known (alignment, arrivals, bandwidths, the breakdown), the committed fixtures (recorded
// with torch's legacy profiler over gloo; Kineto ones written from PyTorch's fields), and bad files.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "tests/cli_util.h"
#include "engine/train/trace_compare.h"
#include "tests/test_util.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace dtlab;

using dtlab::test::contains;
using dtlab::test::error_sentence;

namespace {

std::string span(const std::string& name, const std::string& cat, double ts, double dur, int pid, int tid,
                 const std::string& args = "{}") {
  char buf[512];
  std::snprintf(buf, sizeof buf, R"({"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d, "ts": %.3f, "dur": %.3f, "args": %s})",
                cat.c_str(), name.c_str(), pid, tid, ts, dur, args.c_str());
  return buf;
}

std::string comms(const char* coll, int64_t nelems, int group) {
  return std::string(R"({"Collective name": ")") + coll + R"(", "In msg nelems": )" + std::to_string(nelems) +
         R"(, "Out msg nelems": )" + std::to_string(nelems) + R"(, "Group size": )" + std::to_string(group) +
         R"(, "dtype": "Float", "Process Group Ranks": "[0, 1]"})";
}

// Two ranks, one iteration, on clocks `offset` apart; times below are on the common clock (µs).
// Rank 1 arrives 50 µs late to the first all-reduce.
std::string kineto_rank(int rank, double offset) {
  auto t = [&](double x) { return offset + x; };
  const double late = rank == 1 ? 50 : 0;
  std::vector<std::string> ev = {
      span("ProfilerStep#7", "user_annotation", t(0), 1000, 1, 1),
      span("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t(0), 10, 0, 7),
      span("void gemm_kernel<float>(...)", "kernel", t(10), 390, 0, 7),
      span("record_param_comms", "cpu_op", t(300 + late), 5, 1, 1, comms("allreduce", 1000, 2)),
      span("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", t(310 + late),
           290 - late, 0, 20),
      span("void elementwise_kernel(...)", "kernel", t(600), 100, 0, 7),
      span("record_param_comms", "cpu_op", t(720), 5, 1, 1, comms("allreduce", 256, 2)),
      span("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", t(730), 170, 0, 20),
      span("aten::add_", "cpu_op", t(740), 3, 1, 1),  // host op of a GPU run: not compute
  };
  std::string s = R"({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": )" + std::to_string(rank) +
                  R"(, "world_size": 2}, "traceEvents": [)";
  for (size_t i = 0; i < ev.size(); i++) s += (i ? ",\n" : "\n") + ev[i];
  s += R"(, {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}], "displayTimeUnit": "ms"})";
  return s;
}

// Legacy autograd profiler: a bare list, no rank, no sizes; gloo's span on its worker thread.
std::string legacy_rank(double start, double late, int iterations) {
  std::string s = "[";
  double t = start;
  for (int i = 0; i < iterations; i++) {
    const std::vector<std::string> ev = {
        span("ProfilerStep#" + std::to_string(i), "", t, 1000, 0, 1),
        span("aten::addmm", "", t + 10, 200, 0, 1),
        span("aten::mm", "", t + 20, 50, 0, 1),  // nested
        span("c10d::allreduce_", "", t + 300 + late, 10, 0, 1),
        span("gloo:all_reduce", "", t + 310 + late, 390 - late, 0, 3),
        span("aten::relu", "", t + 400 + late, 100, 0, 1),
        span("c10d::allreduce_", "", t + 720, 5, 0, 1),
        span("gloo:all_reduce", "", t + 725, 175, 0, 2),
    };
    for (const std::string& e : ev) s += (s.size() > 1 ? ",\n" : "\n") + e;
    t += 1000;
  }
  return s + "]";
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const fs::path kTraces = fs::path(DTLAB_SOURCE_DIR) / "tests" / "data" / "traces";

// Aligned, every rank's end of every collective is the same moment within the timestamp resolution.
void check_ends_aligned(const ImportedTrace& tr) {
  for (const TraceCollective& c : tr.collectives) {
    double lo = INFINITY, hi = -INFINITY;
    for (size_t r = 0; r < tr.ranks.size(); r++) {
      const double e = tr.ranks[r].collectives[static_cast<size_t>(c.rank_index[r])].end_us;
      lo = std::min(lo, e);
      hi = std::max(hi, e);
    }
    CHECK(hi - lo <= tr.resolution_us);
  }
}

}  // namespace

TEST_SUITE("trace_import") {

TEST_CASE("kineto: clocks aligned on the all-reduces' ends, arrivals, bandwidths and the breakdown") {
  const ImportedTrace tr = import_trace_texts({{"a.json", kineto_rank(0, 1000000.0)}, {"b.json", kineto_rank(1, 5000000.5)}});
  REQUIRE(tr.ranks.size() == 2);
  CHECK(tr.format == TraceFormat::Kineto);
  CHECK(tr.backend == "nccl");
  CHECK(tr.resolution_us == doctest::Approx(0.001));
  CHECK(tr.iterations == 1);
  CHECK(tr.ranks[1].alignment.offset_us == doctest::Approx(-4000000.5));
  CHECK(tr.ranks[1].alignment.anchors == 2);
  CHECK(tr.ranks[1].alignment.residual_max_us <= tr.resolution_us);

  REQUIRE(tr.collectives.size() == 2);
  const TraceCollective& c = tr.collectives[0];
  CHECK(c.name == "allreduce");
  CHECK(c.bytes == 4000);  // 1000 Float
  CHECK(c.iteration == 0);  // the first ProfilerStep span (#7)
  CHECK(c.bucket == 0);
  CHECK(tr.collectives[1].bucket == 1);
  CHECK(tr.collectives[1].bytes == 1024);
  CHECK(c.last_rank == 1);
  CHECK(c.last_arrival_us - c.first_arrival_us == doctest::Approx(50).epsilon(1e-9));
  CHECK(c.busy_us == doctest::Approx(240));            // end 600 - rank 1's start 360
  CHECK(c.algbw_gbs == doctest::Approx(4000 / 240e3));  // bytes / busy
  CHECK(c.busbw_gbs == doctest::Approx(c.algbw_gbs));   // 2(n-1)/n = 1 at n = 2
  for (const TraceCollective& k : tr.collectives) {
    const double e0 = tr.ranks[0].collectives[static_cast<size_t>(k.rank_index[0])].end_us;
    const double e1 = tr.ranks[1].collectives[static_cast<size_t>(k.rank_index[1])].end_us;
    CHECK(std::fabs(e0 - e1) <= tr.resolution_us);
  }
  CHECK(tr.buckets_per_iteration() == std::vector<int>{2});
  // Of rank 0's first all-reduce (310-600), 400-600 ran beside no kernel; its second is all exposed.
  CHECK(tr.ranks[0].collectives[0].exposed_us == doctest::Approx(200));
  CHECK(tr.ranks[0].collectives[1].exposed_us == doctest::Approx(170));
  CHECK(tr.ranks[1].collectives[0].exposed_us == doctest::Approx(200));  // 360-600 beside compute to 400

  // Rank 0 over its step [0, 1000]: copy 0-10; compute 10-400 and 600-700; comm 310-600, 730-900.
  const RankBreakdown& b = tr.breakdown[0];
  CHECK(b.wall_us == doctest::Approx(1000));
  CHECK(b.memcpy_us == doctest::Approx(10));
  CHECK(b.compute_us == doctest::Approx(300 + 100));
  CHECK(b.overlapped_us == doctest::Approx(90));
  CHECK(b.exposed_comm_us == doctest::Approx(200 + 170));
  CHECK(b.idle_us == doctest::Approx(30 + 100));
  for (const RankBreakdown& r : tr.breakdown)
    CHECK(r.compute_us + r.overlapped_us + r.exposed_comm_us + r.memcpy_us + r.idle_us == doctest::Approx(r.wall_us));
  CHECK(tr.breakdown[1].straggled == 1);
  CHECK(tr.breakdown[0].straggled == 0);  // the second all-reduce: both arrived at once, no straggler
}

TEST_CASE("legacy: ranks from file names, no sizes, nested ops counted once") {
  const ImportedTrace tr = import_trace_texts({{"dir/worker_rank1.json", legacy_rank(77, 40, 3)},
                                               {"dir/worker_rank0.json", legacy_rank(5, 0, 3)}});
  REQUIRE(tr.ranks.size() == 2);
  CHECK(tr.format == TraceFormat::Legacy);
  CHECK(tr.backend == "gloo");
  CHECK(tr.ranks[0].file == "dir/worker_rank0.json");
  CHECK(tr.ranks[1].alignment.offset_us == doctest::Approx(5 - 77));
  CHECK(tr.buckets_per_iteration() == std::vector<int>{2, 2, 2});
  REQUIRE(tr.collectives.size() == 6);
  CHECK(tr.collectives[0].bytes == -1);
  CHECK(tr.collectives[0].algbw_gbs < 0);
  CHECK(tr.collectives[0].last_rank == 1);
  CHECK(tr.collectives[0].last_arrival_us - tr.collectives[0].first_arrival_us == doctest::Approx(40));
  // Rank 0 per iteration: compute 10-210 (mm nested) and 400-500; comm 310-700 and 725-900; the
  // c10d op at 300 only issues (not compute).
  const RankBreakdown& b = tr.breakdown[0];
  CHECK(b.wall_us == doctest::Approx(3000));
  CHECK(b.compute_us == doctest::Approx(3 * 200));
  CHECK(b.overlapped_us == doctest::Approx(3 * 100));
  CHECK(b.exposed_comm_us == doctest::Approx(3 * (290 + 175)));
  CHECK(b.idle_us == doctest::Approx(3 * (10 + 100 + 25 + 100)));
}

TEST_CASE("alignment: collectives that end in a different order on two ranks cannot all anchor, the residual says so") {
  auto rank = [](double second_end) {
    return "[" + span("ProfilerStep#0", "", 0, 2000, 0, 1) + "," + span("c10d::allreduce_", "", 100, 5, 0, 1) + "," +
           span("gloo:all_reduce", "", 110, 590, 0, 2) + "," + span("c10d::allreduce_", "", 120, 5, 0, 1) + "," +
           span("gloo:all_reduce", "", 130, second_end - 130, 0, 3) + "," + span("c10d::allreduce_", "", 1000, 5, 0, 1) +
           "," + span("gloo:all_reduce", "", 1010, 490, 0, 2) + "]";
  };
  // Rank 0: the second all-reduce ends at 900, after the first (700); on rank 1 it ends at 650, before it.
  const ImportedTrace tr = import_trace_texts({{"rank0.json", rank(900)}, {"rank1.json", rank(650)}});
  CHECK(tr.ranks[1].alignment.anchors == 2);
  // Either of the first two anchors may be kept; the other misses by 235 to 250 µs.
  CHECK(tr.ranks[1].alignment.residual_max_us > 200);
  CHECK(tr.ranks[1].alignment.residual_max_us <= 250 + 1e-9);
  REQUIRE(tr.warnings.size() == 1);
  CHECK(contains(tr.warnings[0], "rank 1: 1 of 3 collectives ended in a different order than on rank 0"));
}

TEST_CASE("bad traces: one sentence naming the file and what is wrong") {
  const std::string good = kineto_rank(0, 0);
  CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", good.substr(0, good.size() / 2)}}); }),
                 "r0.json ends at byte"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", "\x89PNG\r\n"}}); }), "r0.json is not JSON"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", R"({"model": "x"})"}}); }),
                 "r0.json is JSON but not a PyTorch profiler trace: it has no \"traceEvents\" list"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", "[]"}}); }), "r0.json has no complete events"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"a.json", legacy_rank(0, 0, 1)}}); }),
                 "a.json records no rank (the legacy profiler does not, and it has no distributedInfo) and its name has none"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"rank0.json", legacy_rank(0, 0, 1)}, {"rank2.json", legacy_rank(0, 0, 1)}}); }),
                 "rank 1 is missing: the traces are of ranks 0, 2, but 2 files make ranks 0 to 1"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"a_rank1.json", legacy_rank(0, 0, 1)}, {"b_rank1.json", legacy_rank(0, 0, 1)}}); }),
                 "b_rank1.json and a_rank1.json are both rank 1"));
  CHECK(contains(error_sentence([&] { import_trace_texts({{"a.json", kineto_rank(0, 0)}}); }),
                 "a.json says the job had world_size 2, but 1 trace files were given"));
  std::string other = kineto_rank(1, 0);
  const size_t at = other.find(R"("Collective name": "allreduce", "In msg nelems": 1000)");
  other.replace(at, 30, R"("Collective name": "allgather")");
  CHECK(contains(error_sentence([&] { import_trace_texts({{"r0.json", good}, {"r1.json", other}}); }),
                 "collective 1 is allreduce of 3.9 KiB in r0.json but allgather"));
  CHECK(contains(error_sentence([&] { import_traces({"/nonexistent/dir"}); }), "/nonexistent/dir does not exist"));
  // Explicit ranks: one per file.
  TraceImportOptions two;
  two.ranks = {0, 1};
  CHECK(contains(error_sentence([&] { import_trace_texts({{"a.json", legacy_rank(0, 0, 1)}}, two); }),
                 "2 ranks were given for 1 trace files"));
}

TEST_CASE("files: gzip and plain read alike, a truncated gzip is named") {
  const fs::path dir = fs::temp_directory_path() / ("dtlab_trace_gz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string r0 = kineto_rank(0, 1000000.0), r1 = kineto_rank(1, 5000000.5);
  std::ofstream(dir / "rank0.json") << r0;
  gzFile gz = gzopen((dir / "rank1.json.gz").c_str(), "wb");
  gzwrite(gz, r1.data(), static_cast<unsigned>(r1.size()));
  gzclose(gz);
  std::ofstream(dir / "dtlab.json") << R"({"model": "mlp:2,8,3"})";  // metadata, not a rank
  std::vector<double> progress;
  TraceImportOptions opt;
  opt.progress = [&](double f) { progress.push_back(f); };
  const ImportedTrace tr = import_traces({dir.string()}, opt);
  CHECK(tr.ranks.size() == 2);
  CHECK(tr.collectives.size() == 2);
  REQUIRE(!progress.empty());
  CHECK(progress.back() == 1.0);
  // Cut the gzip file short.
  const std::string bytes = read_text(dir / "rank1.json.gz");
  std::ofstream(dir / "rank1.json.gz", std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  const std::string err = error_sentence([&] { import_traces({dir.string()}); });
  CHECK(contains(err, "rank1.json.gz"));
  CHECK((contains(err, "truncated or corrupted") || contains(err, "ends at byte")));
  std::atomic<bool> cancel{true};
  TraceImportOptions cancelled;
  cancelled.cancel = &cancel;
  CHECK(contains(error_sentence([&] { import_traces({dir.string()}, cancelled); }), "cancelled"));
  fs::remove_all(dir);
}

TEST_CASE("dtlab-cli trace summarize: the tables, and bad input in one sentence with exit 2") {
  const fs::path dir = fs::temp_directory_path() / ("dtlab_trace_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "rank0.json") << kineto_rank(0, 1000000.0);
  std::ofstream(dir / "rank1.json") << kineto_rank(1, 5000000.5);
  const test::CliResult ok = test::run_cli({"trace", "summarize", dir.string()});
  INFO(ok.err);
  INFO(ok.out);
  REQUIRE(ok.code == 0);
  CHECK(contains(ok.out, "dtlab trace: 2 ranks, kineto format, backend nccl, 1 iteration ("));
  CHECK(contains(ok.out, "  1     -4000000.500 us"));  // rank 1's clock offset
  CHECK(contains(ok.out, "DDP buckets (all-reduces per iteration, in launch order): 2\n"));
  CHECK(contains(ok.out, "allreduce  4,000"));
  CHECK(contains(ok.out, "rank 1   50.0 us"));  // last to arrive, late by
  CHECK(contains(ok.out, "-  together"));      // the second all-reduce: every rank at once

  std::ofstream(dir / "rank1.json", std::ios::trunc) << R"({"traceEvents": [{"ph": "X", "name": "a")";
  const test::CliResult bad = test::run_cli({"trace", "summarize", dir.string()});
  CHECK(bad.code == 2);
  CHECK(bad.out.empty());
  CHECK(contains(bad.err, "rank1.json ends at byte"));
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);

  // A dtlab.json the comparison cannot use, or a model it cannot build: one sentence before any
  // table (the comparison runs first), not tables and then an error about a flag nobody gave.
  std::ofstream(dir / "rank1.json", std::ios::trunc) << kineto_rank(1, 5000000.5);
  std::ofstream(dir / "dtlab.json") << R"({"model": "mlp:2,512,512,3", "first_bucket_mb": 0})";
  const test::CliResult meta = test::run_cli({"trace", "summarize", dir.string()});
  CHECK(meta.code == 2);
  CHECK(meta.out.empty());
  CHECK(contains(meta.err, "dtlab.json: \"first_bucket_mb\" must be a positive number of MiB (it is 0)"));
  fs::remove(dir / "dtlab.json");
  const test::CliResult model = test::run_cli({"trace", "summarize", dir.string(), "--model", "mlp:x"});
  CHECK(model.code == 2);
  CHECK(model.out.empty());
  CHECK(contains(model.err, "model 'mlp:x' has 'x' where a layer width belongs"));

  const test::CliResult none = test::run_cli({"trace"});
  CHECK(none.code == 2);
  CHECK(contains(none.err, "trace needs a verb; use 'dtlab-cli trace summarize DIR|FILES'"));
  fs::remove_all(dir);
}

TEST_CASE("committed traces: all-reduces per iteration (and sizes, where recorded) are DDP's buckets, ends aligned") {
  // gloo_*: recorded with Debian's torch 1.13 (legacy profiler, gloo) by tools/record_torch_trace.py;
  // kineto_*: written from PyTorch's documented fields by tests/data/traces/make_kineto_fixture.py.
  for (const char* name : {"gloo_ddp_w2", "gloo_ddp_w4", "kineto_nccl_w2", "kineto_nccl_w4"}) {
    INFO(std::string(name));
    const ImportedTrace tr = import_traces({(kTraces / name).string()});
    const bool kineto = std::string(name).starts_with("kineto");
    CHECK(tr.format == (kineto ? TraceFormat::Kineto : TraceFormat::Legacy));
    CHECK(tr.ranks.size() == (std::string(name).ends_with("w4") ? 4u : 2u));
    TraceCompareOptions co;
    co.model = "mlp:2,512,512,3";  // the traced torch.nn.Sequential
    co.profile = "nvlink8";
    const TraceComparison cmp = compare_trace(tr, co);
    REQUIRE(cmp.dtlab_buckets.size() == 2);  // the 1 MiB first bucket closes after 2.weight
    const std::vector<int> per = tr.buckets_per_iteration();
    CHECK(per == std::vector<int>(3, 2));
    REQUIRE(cmp.rows.size() == 6);
    for (const CompareRow& r : cmp.rows) {
      CHECK(r.dtlab_bytes == (r.bucket == 0 ? (512 * 512 + 512 + 3 * 512 + 3) * 4 : (2 * 512 + 512) * 4));
      if (kineto) CHECK(r.trace_bytes == r.dtlab_bytes);
      else CHECK(r.trace_bytes == -1);  // the legacy format records no sizes
    }
    CHECK(cmp.sizes_agree);
    check_ends_aligned(tr);
    for (const RankBreakdown& b : tr.breakdown) {
      CHECK(b.wall_us > 0);
      CHECK(b.compute_us + b.overlapped_us + b.exposed_comm_us + b.memcpy_us + b.idle_us == doctest::Approx(b.wall_us));
    }
  }
}

TEST_CASE("real Kineto traces from torch 2.11 on an H200: one bucket per iteration, gloo's GPU marks not counted, a one-rank NCCL job") {
  // real_kineto_*: recorded by tools/record_torch_trace.py --format kineto with PyTorch 2.11.0+cu130 on
  // one H200 (2026-11-27): nccl (one rank: NCCL refuses two ranks on one GPU), gloo with the ranks'
  // models on the GPU (2 and 4 ranks sharing it) and gloo on the CPU. bucket_cap_mb=25 is passed, and
  // torch 2.11 then makes the first bucket the cap too (dtlab.json: "first_bucket_mb": 25), so DDP
  // all-reduces the whole model, 1,062,924 bytes, as one bucket every iteration.
  const int64_t model_bytes = (2 * 512 + 512 + 512 * 512 + 512 + 512 * 3 + 3) * 4;
  REQUIRE(model_bytes == 1062924);
  struct Case { const char* name; int world; bool sizes; };
  for (const Case& k : {Case{"real_kineto_nccl_cuda_w1", 1, true}, Case{"real_kineto_gloo_cuda_w2", 2, false},
                        Case{"real_kineto_gloo_cuda_w4", 4, false}, Case{"real_kineto_gloo_cpu_w2", 2, false}}) {
    INFO(std::string(k.name));
    const ImportedTrace tr = import_traces({(kTraces / k.name).string()});
    CHECK(tr.format == TraceFormat::Kineto);
    REQUIRE(tr.ranks.size() == size_t(k.world));
    for (size_t r = 0; r < tr.ranks.size(); r++) CHECK(tr.ranks[r].rank == int(r));  // from distributedInfo
    // gloo on CUDA tensors: Kineto repeats each gloo:all_reduce as a gpu_user_annotation on the GPU
    // stream; counted as collectives too, they made 2 per iteration and broke the pairing.
    CHECK(tr.buckets_per_iteration() == std::vector<int>(3, 1));
    REQUIRE(tr.collectives.size() == 3);
    for (const TraceCollective& c : tr.collectives) {
      CHECK(c.name == "allreduce");
      CHECK(c.bytes == (k.sizes ? model_bytes : -1));  // gloo records no record_param_comms in 2.11
      if (k.world == 1) CHECK(c.algbw_gbs == -1);      // issue-timed: no data moved, no bandwidth
    }
    for (const RankTrace& rt : tr.ranks)
      for (const RankCollective& c : rt.collectives) CHECK(c.issue_timed == (k.world == 1));
    check_ends_aligned(tr);
    for (const RankBreakdown& b : tr.breakdown)
      CHECK(b.compute_us + b.overlapped_us + b.exposed_comm_us + b.memcpy_us + b.idle_us == doctest::Approx(b.wall_us));
    TraceCompareOptions co;
    co.model = "mlp:2,512,512,3";
    co.first_bucket_mb = 25;  // torch 2.11 with bucket_cap_mb given
    const TraceComparison cmp = compare_trace(tr, co);
    REQUIRE(cmp.dtlab_buckets.size() == 1);
    REQUIRE(cmp.rows.size() == 3);
    for (const CompareRow& r : cmp.rows) CHECK(r.dtlab_bytes == model_bytes);
    CHECK(cmp.sizes_agree);
    if (k.world == 1) CHECK(cmp.summary.find("one rank: its all-reduces move no data") == 0);
  }
  // The CLI reads "first_bucket_mb" from the recording's dtlab.json.
  const test::CliResult r = test::run_cli({"trace", "summarize", (kTraces / "real_kineto_gloo_cuda_w4").string()});
  CHECK(r.code == 0);
  CHECK(r.out.find("bucket 0: 4.bias, 4.weight, 2.bias, 2.weight, 0.bias, 0.weight (1.0 MiB)") != std::string::npos);
  CHECK(r.out.find("DDP buckets (all-reduces per iteration, in launch order): 1 (iterations 0-2)") != std::string::npos);
}

}  // TEST_SUITE
