// The socket backend checked against the threads backend: every collective on 2, 3 and 4 ranks
// (each rank a thread with its own SocketCommunicator on loopback) must give the threads backend's
// results bit for bit, on inputs whose float sums depend on the order of addition. Then its
// diagnoses (a rank that never joins a collective, a desync, a failed peer, a rendezvous nobody
// comes to) and the multi-process path: `dtlab-cli launch` of a 2-process DDP (and FSDP) run must
// save the parameters and print the losses of the in-process run.
#include <doctest/doctest.h>

#include <fcntl.h>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <regex>
#include <sstream>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli.h"
#include "engine/comm/socket_backend.h"
#if DTLAB_HAVE_CUDA
#include "engine/cuda/runtime.h"
#endif
#include "engine/comm/socket_mesh.h"
#include "engine/comm/tcp.h"
#include "engine/comm/threads_backend.h"
#include "engine/core/half.h"
#include "engine/io/safetensors.h"
#include "tests/test_util.h"
#include "test_util.h"

using namespace dtlab;

using dtlab::test::contains;
using dtlab::test::check_mentions;
using dtlab::test::seconds_since;

namespace {

using Clock = std::chrono::steady_clock;
using Outputs = std::vector<std::vector<uint8_t>>;  // per rank: the bytes of every result, in order
using Script = std::function<void(int rank, int n, Communicator& c, std::vector<uint8_t>& out)>;

// Values of many magnitudes, so a sum in another order rounds differently.
std::vector<float> socket_inputs(int rank, int64_t len) {
  std::vector<float> v(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; i++)
    v[static_cast<size_t>(i)] = static_cast<float>(std::sin(1.7 * static_cast<double>(rank * 7919 + i)) *
                                                   std::pow(10.0, static_cast<double>((i + rank) % 7) - 3.0));
  return v;
}

template <class T>
void keep(std::vector<uint8_t>& out, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  out.insert(out.end(), p, p + v.size() * sizeof(T));
}

SocketOptions options(int rank, int n, int port, double timeout_s = 20) {
  SocketOptions o;
  o.rank = rank;
  o.world_size = n;
  o.master_port = port;
  o.timeout_s = timeout_s;
  return o;
}

// Rank 0 of a world of `world0` and rank 1 of `world1` meet on `port` (rank 1 on a thread): their
// errors, empty when the rendezvous worked.
std::pair<std::string, std::string> rendezvous(int port, int world0, int world1) {
  std::string err0, err1;
  std::thread t([&] {
    try {
      SocketCommunicator c(options(1, world1, port, 5), nullptr);
    } catch (const Error& e) {
      err1 = e.what();
    }
  });
  try {
    SocketCommunicator c(options(0, world0, port, 5), nullptr);
  } catch (const Error& e) {
    err0 = e.what();
  }
  t.join();
  return {err0, err1};
}

// Runs fn on n threads, each joining one socket world on a fresh port; returns each rank's error.
std::vector<std::string> run_socket(int n, double timeout_s,
                                    const std::function<void(int, SocketCommunicator&)>& fn) {
  const int port = pick_free_port("127.0.0.1");
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      try {
        SocketCommunicator c(options(r, n, port, timeout_s), nullptr);
        fn(r, c);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

Outputs outputs_socket(int n, const Script& script) {
  Outputs out(static_cast<size_t>(n));
  auto errors = run_socket(n, 20, [&](int r, SocketCommunicator& c) { script(r, n, c, out[static_cast<size_t>(r)]); });
  for (int r = 0; r < n; r++) REQUIRE_MESSAGE(errors[static_cast<size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<size_t>(r)]);
  return out;
}

Outputs outputs_threads(int n, const Script& script) {
  WorldOptions o;
  o.record = false;
  ThreadsWorld w(n, o);
  Outputs out(static_cast<size_t>(n));
  w.run([&](int r, Communicator& c, RankContext&) { script(r, n, c, out[static_cast<size_t>(r)]); });
  return out;
}

// Every collective, every algorithm, counts that do not divide by the world.
void every_collective(int r, int n, Communicator& c, std::vector<uint8_t>& out) {
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1001}, int64_t{65537}}) {
    for (Algorithm algo : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        std::vector<float> buf = socket_inputs(r, count);
        c.all_reduce(buf.data(), count, DType::F32, op, algo)->wait();
        keep(out, buf);
      }
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      std::vector<float> in = socket_inputs(r, count * n), rs(static_cast<size_t>(count));
      c.reduce_scatter(rs.data(), in.data(), count, DType::F32, op)->wait();
      keep(out, rs);
    }
    std::vector<float> mine = socket_inputs(r, count), all(static_cast<size_t>(count * n));
    c.all_gather(all.data(), mine.data(), count, DType::F32)->wait();
    keep(out, all);
    for (int root : {0, n - 1})
      for (Algorithm algo : {Algorithm::Tree, Algorithm::Naive}) {
        std::vector<float> b = socket_inputs(r, count), red = socket_inputs(r, count);
        c.broadcast(b.data(), count, DType::F32, root, algo)->wait();
        c.reduce(red.data(), count, DType::F32, ReduceOp::Avg, root, algo)->wait();
        keep(out, b);
        keep(out, red);  // non-root buffers must come back unchanged
      }
    std::vector<float> a2a_in = socket_inputs(r, count * n), a2a(static_cast<size_t>(count * n));
    c.all_to_all(a2a.data(), a2a_in.data(), count, DType::F32)->wait();
    keep(out, a2a);
    std::vector<float> grouped(static_cast<size_t>(count * n));  // NCCL's way: every block in one step
    c.all_to_all(grouped.data(), a2a_in.data(), count, DType::F32, Algorithm::Grouped)->wait();
    keep(out, grouped);
  }
  std::vector<int64_t> big = {int64_t{1} << 60, r + 1, -7 * r}, gathered(3 * static_cast<size_t>(n));
  c.all_reduce(big.data(), 3, DType::I64, ReduceOp::Sum)->wait();
  c.all_gather(gathered.data(), big.data(), 3, DType::I64)->wait();
  keep(out, big);
  keep(out, gathered);
  c.barrier()->wait();
  if (n == 1) return;
  // Point to point: two tags to the successor, received in the other order.
  const int succ = (r + 1) % n, pred = (r - 1 + n) % n;
  std::vector<float> s7 = socket_inputs(r, 5), s9 = socket_inputs(r + 100, 3), r7(5), r9(3);
  WorkPtr w7 = c.send(s7.data(), 5, DType::F32, succ, 7), w9 = c.send(s9.data(), 3, DType::F32, succ, 9);
  c.recv(r9.data(), 3, DType::F32, pred, 9)->wait();
  c.recv(r7.data(), 5, DType::F32, pred, 7)->wait();
  w7->wait();
  w9->wait();
  keep(out, r7);
  keep(out, r9);
}

// The 16-bit collectives (mixed precision's buckets, all-gathers and reduce-scatters): every sum is
// the float sum rounded once per step, so the order of the additions shows in the bits.
void every_collective16(int r, int n, Communicator& c, std::vector<uint8_t>& out) {
  for (const DType dt : {DType::BF16, DType::F16}) {
    const HalfFormat f = dt == DType::BF16 ? HalfFormat::BF16 : HalfFormat::FP16;
    auto half_inputs = [&](int seed, int64_t len) {
      const std::vector<float> x = socket_inputs(seed, len);
      std::vector<uint16_t> h(x.size());
      for (size_t i = 0; i < x.size(); i++) h[i] = half_from_float(x[i], f);
      return h;
    };
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      for (Algorithm algo : {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
          std::vector<uint16_t> buf = half_inputs(r, count);
          c.all_reduce(buf.data(), count, dt, op, algo)->wait();
          keep(out, buf);
        }
      std::vector<uint16_t> in = half_inputs(r, count * n), rs(static_cast<size_t>(count));
      c.reduce_scatter(rs.data(), in.data(), count, dt, ReduceOp::Sum)->wait();
      keep(out, rs);
      std::vector<uint16_t> mine = half_inputs(r, count), all(static_cast<size_t>(count * n));
      c.all_gather(all.data(), mine.data(), count, dt)->wait();
      keep(out, all);
      for (Algorithm algo : {Algorithm::Tree, Algorithm::Naive}) {
        std::vector<uint16_t> b = half_inputs(r, count), red = half_inputs(r, count);
        c.broadcast(b.data(), count, dt, n - 1, algo)->wait();
        c.reduce(red.data(), count, dt, ReduceOp::Sum, 0, algo)->wait();
        keep(out, b);
        keep(out, red);
      }
    }
  }
}

void check_equal(const Outputs& a, const Outputs& b) {
  REQUIRE(a.size() == b.size());
  for (size_t r = 0; r < a.size(); r++) {
    INFO("rank ", r);
    REQUIRE(a[r].size() == b[r].size());
    CHECK(std::memcmp(a[r].data(), b[r].data(), a[r].size()) == 0);
  }
}

using test::ShellResult;

// dtlab-cli with stdout and stderr together; `timeout` keeps a hang from stalling the suite.
ShellResult cli_shell(const std::string& args) { return test::shell("timeout 60 " DTLAB_CLI_PATH " " + args); }

// `dtlab-cli launch ...`, tried again on a new port (at most twice more) when rank 0 lost the
// MASTER_PORT the launcher picked: the launcher frees its pick before rank 0 binds it (as torchrun
// does), and under a parallel CTest another test's connection can take the port in between. That
// race is the machine's, not the run's; rank 0 says it in one sentence, which is what is matched.
ShellResult launch_shell(const std::string& args) {
  ShellResult r;
  for (int attempt = 0; attempt < 3; attempt++) {
    r = cli_shell(args);
    if (r.out.find("(Address already in use); choose another MASTER_PORT") == std::string::npos) break;
  }
  return r;
}

std::vector<std::string> losses(const std::string& text) {
  std::vector<std::string> v;
  static const std::regex step(R"(^step +\d+/\d+ .* loss ([0-9.]+))");
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step)) v.push_back(m[1]);
  }
  return v;
}

// Largest |a - b| over every parameter of two checkpoints of the same model.
double max_param_diff(const std::string& a_path, const std::string& b_path) {
  SafetensorsFile a = load_safetensors(a_path), b = load_safetensors(b_path);
  REQUIRE(a.entries.size() == b.entries.size());
  double worst = 0;
  for (const SafetensorsEntry& ea : a.entries) {
    const SafetensorsEntry* eb = b.find(ea.name);
    REQUIRE(eb != nullptr);
    REQUIRE(ea.end - ea.begin == eb->end - eb->begin);
    for (int64_t off = 0; off < ea.end - ea.begin; off += 4) {
      float x, y;
      std::memcpy(&x, static_cast<const uint8_t*>(a.bytes(ea)) + off, 4);
      std::memcpy(&y, static_cast<const uint8_t*>(b.bytes(*eb)) + off, 4);
      worst = std::max(worst, static_cast<double>(std::abs(x - y)));
    }
  }
  return worst;
}

// launch -N 2 -- train FLAGS against the in-process train --world 2 FLAGS; returns both outputs
// (launched, threads).
std::pair<std::string, std::string> check_launch_equals_threads(const std::string& flags) {
  test::TempDir dir("dtlab_launch");
  // The launcher picks a free MASTER_PORT before rank 0 binds it (as torchrun does); under a parallel
  // CTest another test can take it in between, which rank 0 reports in one sentence. Then the launch
  // is tried again on a new port (at most twice more): the race is the machine's, not the run's.
  ShellResult launched = launch_shell("launch --nproc-per-node 2 -- train " + flags + " --log-every 1 --save " + dir.file("A.safetensors"));
  INFO("launch output:\n", launched.out);
  ShellResult threads = cli_shell("train --world 2 " + flags + " --log-every 1 --save " + dir.file("B.safetensors"));
  INFO("threads output:\n", threads.out);
  REQUIRE(launched.code == 0);
  REQUIRE(threads.code == 0);
  CHECK(!contains(launched.out, "[rank 1]"));  // rank 1 stays quiet
  CHECK(contains(launched.out, "backend socket: 2 processes"));
  const std::vector<std::string> la = losses(launched.out), lb = losses(threads.out);
  CHECK(la.size() == 20);
  CHECK(la == lb);
  CHECK(max_param_diff(dir.file("A.safetensors"), dir.file("B.safetensors")) == 0.0);  // bit for bit
  return {launched.out, threads.out};
}

struct EnvGuard {  // sets or clears variables for one test, then restores them
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset_after;
  void set(const std::string& k, const char* v) {
    if (const char* old = std::getenv(k.c_str())) saved.push_back({k, old});
    else unset_after.push_back(k);
    if (v) ::setenv(k.c_str(), v, 1);
    else ::unsetenv(k.c_str());
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
    for (auto& k : unset_after) ::unsetenv(k.c_str());
  }
};

int run_cli_quiet(const std::vector<std::string>& args, std::string& err) {
  std::ostringstream out, e;
  int code = cli::run_cli(args, {out, e, false});
  err = e.str();
  CHECK(out.str().empty());
  return code;
}

}  // namespace

TEST_SUITE("socket") {

TEST_CASE("every collective on 2, 3 and 4 processes' worth of ranks equals the threads backend bit for bit") {
  for (int n : {2, 3, 4}) {
    INFO("world ", n);
    check_equal(outputs_socket(n, every_collective), outputs_threads(n, every_collective));
  }
}

TEST_CASE("bf16 and fp16 collectives on 2, 3 and 4 processes' worth of ranks equal the threads backend bit for bit") {
  for (int n : {1, 2, 3, 4}) {
    INFO("world ", n);
    check_equal(outputs_socket(n, every_collective16), outputs_threads(n, every_collective16));
  }
}

TEST_CASE("a world of one rank needs no peers and still copies and averages") {
  check_equal(outputs_socket(1, every_collective), outputs_threads(1, every_collective));
}

TEST_CASE("ring all-reduce records 2(n-1) ring steps in NCCL's chunk order, then the collective") {
  const int n = 3, port = pick_free_port("127.0.0.1");
  TraceRecorder rec(n);
  CostModel cost(find_profile("nvlink8"), n);
  Stepper stepper(n);
  std::vector<std::unique_ptr<MemoryTracker>> mem;
  std::vector<std::unique_ptr<RankContext>> ctx;
  for (int r = 0; r < n; r++) {
    mem.push_back(std::make_unique<MemoryTracker>(r));
    ctx.push_back(std::make_unique<RankContext>(r, &rec, &cost, &stepper, mem.back().get()));
  }
  std::vector<std::thread> ts;
  for (int r = 0; r < n; r++)
    ts.emplace_back([&, r] {
      SocketCommunicator c(options(r, n, port), ctx[static_cast<size_t>(r)].get());
      std::vector<float> buf = socket_inputs(r, 300);
      c.all_reduce(buf.data(), 300, ReduceOp::Sum)->wait();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; r++) {
    std::vector<int> chunks;
    int collectives = 0;
    double model_end = 0;
    for (const Event& e : rec.events(r)) {
      if (e.kind == EventKind::RingStep) chunks.push_back(e.step.chunk), model_end = e.model_end;
      if (e.kind == EventKind::Collective) {
        collectives++;
        CHECK(e.model_end == model_end);  // the collective ends with its last step
        CHECK(e.coll.bytes == 1200);
      }
    }
    CHECK(collectives == 1);
    // rank r receives chunk (r-2-s) mod n while reducing, then (r-1-s') mod n while gathering
    std::vector<int> expect;
    for (int s = 0; s < n - 1; s++) expect.push_back(((r - 2 - s) % n + 2 * n) % n);
    for (int s = 0; s < n - 1; s++) expect.push_back(((r - 1 - s) % n + 2 * n) % n);
    CHECK(chunks == expect);
  }
}

TEST_CASE("a rank that never joins a collective: the others time out naming the collective and the peer") {
  std::atomic<int> done{0};
  auto t0 = Clock::now();
  auto errors = run_socket(3, 0.5, [&](int r, SocketCommunicator& c) {
    if (r == 2) {  // stays connected, never calls; leaves when the others have given up
      while (done.load() < 2 && seconds_since(t0) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::vector<float> buf(1000, 1.0f);
    try {
      c.all_reduce(buf.data(), 1000, ReduceOp::Sum)->wait();
    } catch (...) {
      done++;
      throw;
    }
  });
  CHECK(seconds_since(t0) < 5);
  for (int r : {0, 1}) {
    INFO("rank ", r);
    check_mentions(errors[static_cast<size_t>(r)],
                   {"collective #0 allreduce of 1000 float32 (sum, ring) timed out after 0.5 s at step ", "waiting for data from rank"});
  }
  // Rank 0 waits on rank 2, which sent nothing: the root cause, which rank 1 hears from rank 0.
  check_mentions(errors[0], {"rank 0: ", "from rank 2", "nothing has arrived from rank 2"});
}

TEST_CASE("recv with no matching send times out naming the peer and the tag") {
  auto errors = run_socket(2, 0.5, [&](int r, SocketCommunicator& c) {
    if (r == 1) return std::this_thread::sleep_for(std::chrono::milliseconds(800));
    float x[4];
    c.recv(x, 4, DType::F32, 1, 3)->wait();
  });
  check_mentions(errors[0], {"rank 0: recv #0 of 4 float32 from rank 1 (tag 3) timed out after 0.5 s"});
}

TEST_CASE("desync: different calls fail at once on both ranks, naming both calls") {
  auto t0 = Clock::now();
  auto errors = run_socket(2, 10, [&](int r, SocketCommunicator& c) {
    std::vector<float> buf(12, 1.0f);
    c.all_reduce(buf.data(), r == 0 ? 10 : 12, ReduceOp::Sum)->wait();
  });
  CHECK(seconds_since(t0) < 5);  // not the 10 s timeout
  for (const std::string& e : errors)
    check_mentions(e, {"desync: collective #0 differs across ranks", "allreduce of 10 float32", "allreduce of 12 float32",
                       "every rank must issue the same collectives in the same order"});
}

TEST_CASE("a rank that fails tells the others, which stop with its reason instead of timing out") {
  auto t0 = Clock::now();
  auto errors = run_socket(3, 10, [&](int r, SocketCommunicator& c) {
    if (r == 1) {
      c.abort("rank 1 failed: the data loader ran dry");
      return;
    }
    std::vector<float> buf(100, 1.0f);
    c.all_reduce(buf.data(), 100, ReduceOp::Sum)->wait();
  });
  CHECK(seconds_since(t0) < 5);
  for (int r : {0, 2}) check_mentions(errors[static_cast<size_t>(r)], {"rank 1 failed: the data loader ran dry"});
}

TEST_CASE("rendezvous: nobody comes, or the ranks disagree on the world size") {
  const int port = pick_free_port("127.0.0.1");
  auto t0 = Clock::now();
  try {
    SocketCommunicator c(options(0, 3, port, 0.5), nullptr);
    FAIL("the rendezvous should have timed out");
  } catch (const CommError& e) {
    check_mentions(e.what(), {"rank 0: the rendezvous on 127.0.0.1:" + std::to_string(port) + " timed out after 0.5 s",
                              "ranks 1, 2 never connected"});
  }
  CHECK(seconds_since(t0) < 3);

  const auto [err0, err1] = rendezvous(pick_free_port("127.0.0.1"), 2, 3);
  for (const std::string& e : {err0, err1})
    check_mentions(e, {"rank 1 joined with WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2; give every rank the same WORLD_SIZE"});
}

TEST_CASE("rendezvous on the launcher's socket: rank 0 accepts on the inherited fd, so the port is never free to take") {
  // dtlab-cli launch binds the port it picks and hands the listening socket to rank 0 (kMasterFdEnv).
  // Binding that port again fails (EADDRINUSE): the rendezvous below works only through the fd.
  int port = 0;
  const int fd = listen_on_free_port("127.0.0.1", 2, port);
  ::setenv(kMasterFdEnv, std::to_string(fd).c_str(), 1);
  const auto [err0, err1] = rendezvous(port, 2, 2);
  ::unsetenv(kMasterFdEnv);
  CHECK(err0.empty());
  CHECK(err1.empty());
  CHECK(::fcntl(fd, F_GETFD) < 0);  // rank 0 closed it after the rendezvous
  // A variable naming no listening socket on MASTER_PORT is ignored: rank 0 binds the port itself.
  ::setenv(kMasterFdEnv, "0", 1);
  const auto [e0, e1] = rendezvous(pick_free_port("127.0.0.1"), 2, 2);
  ::unsetenv(kMasterFdEnv);
  CHECK(e0.empty());
  CHECK(e1.empty());
}

TEST_CASE("socket_options_from_env reads torchrun's variables and names what is missing or malformed") {
  EnvGuard env;
  env.set("RANK", nullptr);
  env.set("WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", nullptr);
  env.set("LOCAL_RANK", nullptr);
  try {
    socket_options_from_env();
    FAIL("expected an error");
  } catch (const Error& e) {
    check_mentions(e.what(), {"(missing: RANK, MASTER_PORT)", "dtlab-cli launch --nproc-per-node N -- train"});
  }
  env.set("RANK", "4");
  env.set("MASTER_PORT", "29511");
  CHECK_THROWS_WITH_AS(socket_options_from_env(), doctest::Contains("RANK='4' is not a whole number in 0..3"), Error);
  env.set("RANK", "2");
  env.set("LOCAL_RANK", "0");
  SocketOptions o = socket_options_from_env();
  CHECK(o.rank == 2);
  CHECK(o.world_size == 4);
  CHECK(o.master_port == 29511);
  CHECK(o.master_addr == "127.0.0.1");

  // train --backend socket without them: one sentence, exit 2.
  env.set("RANK", nullptr);
  std::string err;
  CHECK(run_cli_quiet({"train", "--strategy", "ddp", "--backend", "socket", "--steps", "1"}, err) == 2);
  check_mentions(err, {"dtlab-cli: --backend socket runs one rank per process and needs RANK"});
  CHECK(err.find('\n') == err.size() - 1);
}

TEST_CASE("train --device and --backend: cuda where a GPU is, one sentence otherwise") {
  std::string err;
  const int code = run_cli_quiet({"train", "--device", "cuda", "--steps", "1"}, err);
#if DTLAB_HAVE_CUDA
  if (cuda::cuda_available()) {
    CHECK(code == 0);
  } else {
    CHECK(code == 2);
    check_mentions(err, {"dtlab-cli: --device cuda: no CUDA device", "; use --device cpu"});
  }
#else
  CHECK(code == 2);
  check_mentions(err, {"--device cuda needs the CUDA engine, which this build does not have"});
#endif
  CHECK(run_cli_quiet({"train", "--strategy", "fsdp", "--world", "2", "--device", "cuda", "--steps", "1"}, err) == 2);
  CHECK(run_cli_quiet({"train", "--backend", "nccl", "--device", "cpu", "--steps", "1"}, err) == 2);
  check_mentions(err, {"--backend nccl moves device memory; add --device cuda"});
  CHECK(run_cli_quiet({"train", "--device", "tpu", "--steps", "1"}, err) == 2);
  check_mentions(err, {"--device tpu is not a device; use cpu or cuda"});
  CHECK(run_cli_quiet({"train", "--backend", "mpi", "--steps", "1"}, err) == 2);
  check_mentions(err, {"--backend mpi is not a backend"});
}

TEST_CASE("launch: bad flags are one sentence and exit 2, before any process starts") {
  std::string err;
  CHECK(run_cli_quiet({"launch", "--nproc-per-node", "0", "--", "train"}, err) == 2);
  check_mentions(err, {"--nproc-per-node", "out of range"});
  CHECK(run_cli_quiet({"launch", "--nproc-per-node", "2", "--", "eval"}, err) == 2);
  check_mentions(err, {"launch runs 'train' in every process"});
  CHECK(run_cli_quiet({"launch", "--nproc-per-node", "2", "--nnodes", "2", "--", "train"}, err) == 2);
  check_mentions(err, {"--nnodes 2 needs --master-port P"});
  CHECK(run_cli_quiet({"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "--master-port", "29500", "--", "train"}, err) == 2);
  check_mentions(err, {"--node-rank 2 is out of range for --nnodes 2"});
  CHECK(run_cli_quiet({"launch", "--nproc-per-node", "2", "--", "train", "--backend", "threads"}, err) == 2);
  check_mentions(err, {"launch sets --backend socket itself"});
  for (const std::string& e : {err}) CHECK(e.find('\n') == e.size() - 1);
}

TEST_CASE("launch: a 2-process DDP run on loopback equals the in-process run, losses and parameters") {
  check_launch_equals_threads("--strategy ddp --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
}

TEST_CASE("launch: a 2-process DDP run with --tp 2 equals the in-process run (the TP group's collectives over sockets)") {
  check_launch_equals_threads("--strategy ddp --tp 2 --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
}

TEST_CASE("launch: a 2-process FSDP run equals the in-process run") {
  check_launch_equals_threads("--strategy fsdp --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
}

// Mixed precision under launch: the 16-bit buckets, all-gathers and reduce-scatters cross the sockets
// and sum as the threads backend sums them, so the saved parameters are the in-process run's bits.
TEST_CASE("launch: 2-process bf16 DDP, fp16 FSDP and bf16 HYBRID_SHARD runs equal the in-process runs") {
  check_launch_equals_threads("--strategy ddp --precision bf16 --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
  check_launch_equals_threads("--strategy fsdp --precision fp16 --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
  // HYBRID_SHARD's replica group sums its 16-bit shards over the socket mesh's sends and receives.
  check_launch_equals_threads("--strategy fsdp --sharding hybrid --node-size 1 --precision bf16 --model mlp:2,32,32,3 "
                              "--data spiral --steps 20 --batch 16");
}

// Issue 34: the pipeline was refused under launch on the CPU; its sends and receives go over the
// socket mesh like any other message. Rank 0's summary has a row per rank: the other process's
// memory comes over in the last all-gather, so the rows equal the in-process run's.
TEST_CASE("launch: a 2-process pipeline equals the in-process run, and its summary has every rank's memory") {
  const auto [launched, threads] =
      check_launch_equals_threads("--strategy pipeline --microbatches 4 --model mlp:2,32,32,3 --data spiral --steps 20 --batch 16");
  auto rank_rows = [](const std::string& out) {
    std::vector<std::string> rows;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("     0        0", 0) == 0 || line.rfind("     1        0", 0) == 0) rows.push_back(line);
    return rows;
  };
  const std::vector<std::string> a = rank_rows(launched), b = rank_rows(threads);
  REQUIRE(a.size() == 2);
  CHECK(a == b);
  CHECK(!contains(a[1], " 0 B "));  // stage 1's parameters, from rank 1's process
}

// A failure only a running rank meets: tests/data/nan_x.npz's row 41 is in rank 1's second batch.
TEST_CASE("launch: a rank that fails stops the run with its sentence and its exit code") {
  auto t0 = Clock::now();
  ShellResult r = launch_shell("launch --nproc-per-node 2 -- train --strategy ddp --model mlp:2,16,16,3 --data " +
                               std::string(DTLAB_SOURCE_DIR) + "/tests/data/nan_x.npz --batch 16 --steps 4 --no-shuffle");
  INFO(r.out);
  // Both ranks learn of the bad batch from the loss's all-reduce and stop with the sentence naming rank
  // 1 (exit 2). Whichever ends first, the other may hear of it from the socket mesh instead and print
  // "rank N failed: <the same sentence>" (or, still in a collective, exit 3 with a comm failure). The
  // launcher exits with the code of the rank it saw end first.
  CHECK((r.code == 2 || r.code == 3));
  CHECK(seconds_since(t0) < 20);
  check_mentions(r.out, {"training stopped at step 2 on rank 1: its input batch holds non-finite values",
                         "dtlab-cli: launch: rank ", " exited with code " + std::to_string(r.code)});
}

// Bad train flags are the launcher's to refuse, once, before any rank starts: every rank used to print
// the same sentence ("[rank 1] dtlab-cli: ...", "[rank 2] ...") and the launcher its exit code.
TEST_CASE("launch: bad train flags are one sentence and exit 2, before any rank starts") {
  for (const char* flags : {"--strategy ddp --model mlp:2,x,3",
                            "--strategy pipeline --stages 2 --model mlp:2,8,8,3",  // 4 processes, 2 stages and no --dp
                            "--strategy ddp --world 3"}) {
    CAPTURE(flags);
    ShellResult r = launch_shell(std::string("launch --nproc-per-node 4 -- train ") + flags);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(!contains(r.out, "[rank "));
    CHECK(!contains(r.out, "launch: rank"));
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
    CHECK(r.out.rfind("dtlab-cli: ", 0) == 0);
  }
}

TEST_CASE("launch: a rank that skips a collective (fault injection) is named by every rank and the launcher") {
  // Rank 0 waits in #2 (bucket 0's all-reduce) for rank 1, which went on to #3 and waits there for
  // rank 0. Whichever watchdog fires first, the collective numbers say rank 1 skipped: every line
  // blames rank 1, never rank 0. Twice at once, to run it under load as well.
  auto t0 = Clock::now();
  const std::string cmd = "launch --nproc-per-node 2 -- train --strategy ddp --model mlp:2,8,3 --steps 3 --timeout 2 "
                          "--fault skip:rank=1,collective=2";
  auto other = std::async(std::launch::async, [&] { return launch_shell(cmd); });
  for (ShellResult r : {launch_shell(cmd), other.get()}) {
    INFO(r.out);
    CHECK(r.code == 3);
    const size_t last = r.out.rfind("dtlab-cli: launch: ");
    REQUIRE(last != std::string::npos);
    CHECK(r.out.find(": rank 1 skipped collective #2", last) != std::string::npos);
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (line.find("dtlab-cli: ") != std::string::npos) CHECK(line.find("rank 1 skipped collective #2") != std::string::npos);
  }
  CHECK(seconds_since(t0) < 30);
  // A delayed rank only arrives late: the run finishes.
  ShellResult r = launch_shell("launch --nproc-per-node 2 -- train --strategy ddp --model mlp:2,8,3 --steps 2 --fault delay:rank=1,collective=2,ms=300");
  CHECK(r.code == 0);
}

TEST_CASE("launch: a rank stopped by SIGSTOP is named by the launcher, and the run ends") {
  // Rank 1 of three is stopped mid-run: its peers' watchdogs fire, and the launcher, which sees the
  // stop (waitpid WUNTRACED), names it, then ends it.
  const std::string tag = "--steps 80000000 --seed " + std::to_string(::getpid());  // this test's ranks
  auto launched = std::async(std::launch::async, [&] {
    return launch_shell("launch --nproc-per-node 3 -- train --strategy ddp --model mlp:2,8,3 --timeout 2 " + tag);
  });
  pid_t rank1 = -1;
  for (int tries = 0; tries < 200 && rank1 < 0; tries++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream cmdline(e.path() / "cmdline"), environ(e.path() / "environ");
      std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
      std::replace(args.begin(), args.end(), '\0', ' ');
      if (args.find(" train ") == std::string::npos || args.find(tag) == std::string::npos) continue;
      for (std::string var; std::getline(environ, var, '\0');)
        if (var == "RANK=1") rank1 = static_cast<pid_t>(std::stol(name));
    }
  }
  REQUIRE(rank1 > 0);
  // Let every rank get past the rendezvous and train a little. A fixed wait was not enough under
  // load (2 busy cores: rank 1 had not connected after 1.5 s, and the run failed at the rendezvous
  // instead): wait until rank 1 holds a socket to each of its two peers (the world's mesh is up).
  auto sockets_of = [](pid_t pid) {
    int n = 0;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      const std::string link = std::filesystem::read_symlink(fd.path(), ec).string();
      n += link.rfind("socket:", 0) == 0;
    }
    return n;
  };
  for (int tries = 0; tries < 600 && sockets_of(rank1) < 2; tries++) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(sockets_of(rank1) >= 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::kill(rank1, SIGSTOP);
  const ShellResult r = launched.get();
  INFO(r.out);
  CHECK(r.code == 3);
  // Which peer's watchdog fires first is a race: rank 2 waits on rank 1, but rank 0 waits on rank 2
  // (its ring neighbour), so a rank may truthfully name rank 2. The launcher, which sees the stop,
  // is the one that must name rank 1.
  check_mentions(r.out, {"dtlab-cli: launch: rank 1 was stopped by signal 19 (SIGSTOP) and stopped answering",
                         "timed out after 2 s", "waiting for data from rank"});
}

}  // TEST_SUITE

// ---------------------------------------------------------------------------------------------
// Issue 40, class 2: whatever a rank meets on the network may not be a dtlab rank. Fake peers (a
// thread on 127.0.0.1, an ephemeral port) send what no dtlab rank sends; the rank under test must
// end with one sentence naming the process and what was wrong, never an internal error, a crash,
// a read past a field or a hang.

namespace {

constexpr uint32_t kWireMagic = 0x424c5444;  // "DTLB": socket_mesh.cpp's mark on every Hello and message

// socket_mesh.cpp's Hello as raw bytes: magic, rank, world size, port, then a 48-byte address.
std::string hello_bytes(int32_t rank, int32_t world, int32_t port, const std::string& ip, bool terminated = true) {
  std::string b(64, '\0');
  std::memcpy(&b[0], &kWireMagic, 4);
  std::memcpy(&b[4], &rank, 4);
  std::memcpy(&b[8], &world, 4);
  std::memcpy(&b[12], &port, 4);
  if (terminated) b.replace(16, std::min<size_t>(ip.size(), 47), ip.substr(0, 47));
  else std::fill(b.begin() + 16, b.end(), 'A');
  return b;
}

// Rank 0's rendezvous answer: status, byte count, body (the address table or a sentence).
std::string reply_bytes(int32_t status, uint32_t bytes, const std::string& body) {
  std::string b(8, '\0');
  std::memcpy(&b[0], &status, 4);
  std::memcpy(&b[4], &bytes, 4);
  return b + body;
}

// An address table of `entries` well-formed entries for a world of `world`; `edit` spoils one.
std::string table_bytes(int entries, int world, const std::function<std::string(int, std::string)>& edit = nullptr) {
  std::string t;
  for (int q = 0; q < entries; q++) {
    std::string e = hello_bytes(q, world, 30000 + q, "127.0.0.1");
    t += edit ? edit(q, e) : e;
  }
  return t;
}

// Reads (and drops) what arrives on fd until the other end closes it or `seconds` pass.
void drain(int fd, double seconds) {
  const double deadline = tcp::now_s() + seconds;
  char buf[4096];
  while (tcp::wait_fd(fd, POLLIN, deadline)) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
  }
}

// What listens on MASTER_PORT: takes one connection, reads its Hello, answers with `reply`, then
// holds the connection until the rank closes it (so only the reply's bytes are judged).
struct FakeMaster {
  int port = 0, listen_fd = -1;
  std::thread t;
  explicit FakeMaster(const std::string& reply) {
    std::string why;
    listen_fd = tcp::listen_on("127.0.0.1", port, 4, why);
    REQUIRE_MESSAGE(listen_fd >= 0, why);
    t = std::thread([this, reply] {
      const int fd = tcp::accept_one(listen_fd, tcp::now_s() + 3);
      if (fd < 0) return;
      char hello[64];
      std::string why;
      if (tcp::read_all(fd, hello, sizeof hello, tcp::now_s() + 3, why))
        tcp::write_all(fd, reply.data(), reply.size(), tcp::now_s() + 3, 0, why);
      drain(fd, 3);
      ::close(fd);
    });
  }
  ~FakeMaster() {
    t.join();
    ::close(listen_fd);
  }
};

// Rank 1 of a world of 4 joins the fake; returns its error sentence ("" if it joined). An internal
// error or any other exception fails the test.
std::string join_fake_master(const std::string& reply, bool& bad_input) {
  FakeMaster fake(reply);
  MeshOptions o;
  o.rank = 1;
  o.world_size = 4;
  o.master_port = fake.port;
  o.timeout_s = 2;
  const auto t0 = Clock::now();
  std::string err;
  try {
    SocketMesh mesh(o);
  } catch (const CommError& e) {
    err = e.what();
    bad_input = false;
  } catch (const Error& e) {
    err = e.what();
    bad_input = true;
  } catch (const std::exception& e) {
    FAIL("not one sentence: ", e.what());
  }
  CHECK(seconds_since(t0) < 3);
  return err;
}

}  // namespace

TEST_SUITE("socket_hostile") {

TEST_CASE("a fake rank 0 on MASTER_PORT: short, huge or unterminated address tables are one sentence naming it") {
  const std::string stranger = "; is another program listening on MASTER_PORT?";
  struct Row {
    std::string what, reply, says;
  };
  auto entry = [](int bad, std::function<std::string(std::string)> f) {
    return [=](int q, std::string e) { return q == bad ? f(e) : e; };
  };
  const std::vector<Row> rows = {
      {"a short table", reply_bytes(0, 3 * 64, table_bytes(3, 4)), "sent an address table of 3 entries for a world of 4" + stranger},
      {"a table of 100 bytes", reply_bytes(0, 100, std::string(100, 'x')),
       "sent an address table of 100 bytes (not a whole number of 64-byte entries) for a world of 4" + stranger},
      {"a 4 GiB table", reply_bytes(0, 0xffffffffu, ""), "sent an address table of 4294967295 bytes"},
      {"a 2 GiB refusal", reply_bytes(1, 0x7fffffffu, ""), "sent a refusal of 2147483647 bytes, longer than any dtlab sentence"},
      {"an unknown status", reply_bytes(9, 0, ""), "sent a rendezvous answer of status 9, which no dtlab rank 0 sends" + stranger},
      {"an unterminated address", reply_bytes(0, 4 * 64, table_bytes(4, 4, entry(1, [](std::string) { return hello_bytes(1, 4, 30001, "", false); }))),
       "sent an address table whose entry for rank 1 has an address field of 48 bytes with no terminating NUL" + stranger},
      {"a port out of range", reply_bytes(0, 4 * 64, table_bytes(4, 4, entry(2, [](std::string) { return hello_bytes(2, 4, 70000, "127.0.0.1"); }))),
       "entry for rank 2 has port 70000, outside 1..65535"},
      {"an address that is not one", reply_bytes(0, 4 * 64, table_bytes(4, 4, entry(2, [](std::string) { return hello_bytes(2, 4, 5000, "not\x01" "an ip"); }))),
       "entry for rank 2 has the address 'not an ip', which is not a dotted IPv4 address"},
      {"a wrong rank", reply_bytes(0, 4 * 64, table_bytes(4, 4, entry(3, [](std::string) { return hello_bytes(7, 4, 5000, "127.0.0.1"); }))),
       "entry for rank 3 has rank 7"},
      {"another world size", reply_bytes(0, 4 * 64, table_bytes(4, 3)), "entry for rank 0 has WORLD_SIZE=3"},
      {"not a table", reply_bytes(0, 4 * 64, std::string(256, '\xff')), "entry for rank 0 has no dtlab mark"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.what);
    bool bad_input = false;
    const std::string err = join_fake_master(row.reply, bad_input);
    CHECK(!bad_input);  // a failed rendezvous: exit 3, as the launcher's failure path
    check_mentions(err, {"rank 1: the process at 127.0.0.1:", row.says});
    CHECK(err.find("AAAA") == std::string::npos);  // nothing of the unterminated field (or past it) is quoted
  }
  // A refusal is rank 0's sentence: quoted as one line, whatever bytes it holds.
  const char raw[] = "rank 0: bad\nthing\x1b[31m\0tail";
  const std::string text(raw, sizeof raw - 1);
  bool bad_input = false;
  const std::string err = join_fake_master(reply_bytes(1, static_cast<uint32_t>(text.size()), text), bad_input);
  CHECK(bad_input);
  CHECK(err == "rank 0: bad thing [31m");
}

TEST_CASE("rank 0 refuses a joining process whose Hello has an unterminated address or port 0, naming it") {
  for (const auto& [hello, says] : std::vector<std::pair<std::string, std::string>>{
           {hello_bytes(1, 2, 0, "127.0.0.1"), "joined as rank 1 with port 0, outside 1..65535"},
           {hello_bytes(1, 2, 5000, "", false), "joined as rank 1 with an address field of 48 bytes with no terminating NUL"}}) {
    const int port = pick_free_port("127.0.0.1");
    int32_t status = -1;
    std::thread fake([&, hello = hello] {
      std::string why;
      const int fd = tcp::connect_retry("127.0.0.1", port, tcp::now_s() + 3, why);
      if (fd < 0) return;
      int32_t head[2] = {};
      if (tcp::write_all(fd, hello.data(), hello.size(), tcp::now_s() + 3, 0, why) &&
          tcp::read_all(fd, head, sizeof head, tcp::now_s() + 3, why))
        status = head[0];
      ::close(fd);
    });
    MeshOptions o;
    o.world_size = 2;
    o.master_port = port;
    o.timeout_s = 3;
    const auto t0 = Clock::now();
    try {
      SocketMesh mesh(o);
      FAIL("rank 0 accepted the Hello");
    } catch (const CommError& e) {
      FAIL("a bad Hello is bad input (exit 2), not a failed collective: ", e.what());
    } catch (const Error& e) {
      check_mentions(e.what(), {"rank 0: the process at 127.0.0.1:", says, "is another program connecting to MASTER_PORT?"});
      CHECK(std::string(e.what()).find("AAAA") == std::string::npos);
    }
    fake.join();
    CHECK(status == 1);  // the process was told too
    CHECK(seconds_since(t0) < 3);
  }
}

TEST_CASE("a peer that sends a malformed message mid-run: the world stops with one sentence naming it") {
  auto header = [](WireKind kind, int64_t count, uint64_t bytes) {
    WireHeader h;
    h.magic = kWireMagic;
    h.kind = kind;
    h.src = 1;
    h.count = count;
    h.bytes = bytes;
    return std::string(reinterpret_cast<const char*>(&h), sizeof h);
  };
  const std::string reason = "rank 1: it\nbroke\x1b[2J";
  struct Row {
    std::string what, bytes, says;
  };
  const std::vector<Row> rows = {
      {"an unknown kind", header(static_cast<WireKind>(9), 0, 0), "sent a message of kind 9, which no dtlab rank sends"},
      {"a 512 GiB chunk of one float", header(WireKind::Collective, 1, uint64_t{1} << 39), "sent 549755813888 bytes for a call of 1 float32"},
      {"a 1 GiB abort reason", header(WireKind::Abort, 0, uint64_t{1} << 30), "sent an abort reason of 1073741824 bytes"},
      {"a message signed by another rank", header(WireKind::P2P, 0, 0).replace(offsetof(WireHeader, src), 4, std::string("\x05\0\0\0", 4)),
       "sent a message signed by rank 5"},
      {"an abort with control bytes", header(WireKind::Abort, 0, reason.size()) + reason, ""},
  };
  for (const Row& row : rows) {
    CAPTURE(row.what);
    const int port = pick_free_port("127.0.0.1");
    std::thread fake([&] {  // rank 1: joins properly, then sends the row's bytes
      std::string why;
      int my_port = 0;
      const int lfd = tcp::listen_on("127.0.0.1", my_port, 1, why);
      const int fd = tcp::connect_retry("127.0.0.1", port, tcp::now_s() + 3, why);
      if (fd >= 0) {
        const std::string hello = hello_bytes(1, 2, my_port, "127.0.0.1");
        std::string table(8 + 2 * 64, '\0');
        if (tcp::write_all(fd, hello.data(), hello.size(), tcp::now_s() + 3, 0, why) &&
            tcp::read_all(fd, table.data(), table.size(), tcp::now_s() + 3, why))
          tcp::write_all(fd, row.bytes.data(), row.bytes.size(), tcp::now_s() + 3, 0, why);
        drain(fd, 3);
        ::close(fd);
      }
      if (lfd >= 0) ::close(lfd);
    });
    const auto t0 = Clock::now();
    std::string err;
    try {
      SocketCommunicator c(options(0, 2, port, 2), nullptr);
      std::vector<float> buf(4, 1.0f);
      c.all_reduce(buf.data(), 4, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
    } catch (const CommError& e) {
      err = e.what();
    } catch (const std::exception& e) {
      FAIL("not one sentence: ", e.what());
    }
    fake.join();
    CHECK(seconds_since(t0) < 3);
    if (row.says.empty()) {
      CHECK(err == "rank 1: it broke [2J");  // the peer's reason, on one line
    } else {
      check_mentions(err, {"rank 0: rank 1 (the process at 127.0.0.1:", row.says, "every rank must run the same dtlab build"});
    }
  }
}

TEST_CASE("train --backend socket against a fake MASTER_PORT: one sentence, exit 3, no internal error") {
  FakeMaster fake(reply_bytes(0, 3 * 64, table_bytes(3, 4)));
  EnvGuard env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "127.0.0.1");
  env.set("MASTER_PORT", std::to_string(fake.port).c_str());
  std::ostringstream out, err;
  const int code = cli::run_cli({"train", "--strategy", "ddp", "--backend", "socket", "--steps", "1", "--timeout", "2"}, {out, err, false});
  CHECK(code == 3);
  CHECK(err.str() == "dtlab-cli: rank 1: the process at 127.0.0.1:" + std::to_string(fake.port) +
                         " sent an address table of 3 entries for a world of 4; is another program listening on MASTER_PORT?\n");
}

TEST_CASE("launch --timeout: under 1 s is refused with its reason, and a run that finishes is never failed by it") {
  // Through the real binary: in process, a launch that was not refused would start this test program.
  ShellResult refused = launch_shell("launch --nproc-per-node 2 --timeout 0.001 -- train --steps 1");
  CHECK(refused.code == 2);
  CHECK(refused.out == "dtlab-cli: launch --timeout 0.001 s is shorter than the ranks of a finished run take to exit one after another "
               "(closing their connections, writing their outputs); use at least 1 s (train's own --timeout, after --, bounds "
               "each collective)\n");
  const auto t0 = Clock::now();
  ShellResult r = launch_shell("launch --nproc-per-node 2 --timeout 1 -- train --strategy ddp --model mlp:2,8,3 --steps 2 --batch 8");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(!contains(r.out, "did not exit"));
  CHECK(seconds_since(t0) < 10);
}

}  // TEST_SUITE

// Under --ep a process holds only its experts, and their all-to-alls end with the run: rank 1 crashed
// (its model still pointed at the freed EP group) when it evaluated its part after training. Only rank
// 0, holding the whole model gathered over the EP group, evaluates and reports.
TEST_CASE("launch: a 2-process GPT with its experts split over the processes (--ep 2) equals the in-process run") {
  check_launch_equals_threads("--strategy ddp --model gpt:layers=2,heads=2,embd=16,ctx=8 --moe experts=4,top_k=2 --ep 2 --steps 20 --batch 4");
}
