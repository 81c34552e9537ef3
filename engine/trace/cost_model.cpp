// Hardware profiles and the alpha-beta(-gamma) cost formulas of docs/course_sources.md §6. The built-in
// profiles are seed figures for real clusters; "this" is measured on the machine we run on so the
// modeled clock can also be compared with the wall clock.
#include "engine/core/arith.h"
#include "engine/trace/cost_model.h"

#include <cblas.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <mutex>
#include <thread>
#include <tuple>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"

extern "C" {
// OpenBLAS extensions (declared in its cblas.h, but not in every cblas.h the alternatives may pick).
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace dtlab {

namespace {

// Seed figures. Effective (achieved, one direction) rather than datasheet numbers, because the
// lessons compare schedules, and an optimistic link would hide the communication we want to show.
//  - NVLink: A100 NVLink3 is 300 GB/s per direction; ~3 us per message (kernel launch + sync).
//  - PCIe 4.0 x16: 32 GB/s raw, ~24 GB/s achieved; ~5 us per message through the host bridge.
//  - InfiniBand HDR: 200 Gb/s = 25 GB/s; ~10 us per message across nodes (NIC + proxy thread).
//  - 25 GbE: 25 Gb/s = 3.125 GB/s; ~30 us per message through the TCP stack.
constexpr Link kNvlink{3e-6, 1.0 / 300e9};
constexpr Link kPcie{5e-6, 1.0 / 24e9};
constexpr Link kInfiniband{10e-6, 1.0 / 25e9};
constexpr Link kEthernet{30e-6, 1.0 / 3.125e9};
// Reducing n bytes reads two float streams (2n) and writes one (n) from HBM at ~3 TB/s, so the
// reduction costs 3n / 3e12 s: gamma = 1e-12 s per byte of result.
constexpr double kHbmGamma = 3.0 / 3e12;
// An A100-class rank: 312 TFLOP/s bf16 peak, of which training matmuls sustain about a third.
constexpr double kGpuFlops = 100e12;
// The DGX-H100-like profiles (docs/course_sources.md §6b):
//  - NVLink 4 through NVSwitch: 18 links x 25 GB/s = 450 GB/s per direction per GPU (900 GB/s
//    bidirectional on the datasheet); NCCL's own topology model rates a Hopper NVLink at 20.6 GB/s
//    (SM90_NVLINK_BW in src/graph/topo.h), 18 x 20.6 = 370 GB/s: the effective figure. ~3 us per
//    message as on NVLink 3 (launch + sync dominate, not the wire).
//  - InfiniBand NDR: 400 Gb/s = 50 GB/s per NIC and direction (line rate, as the HDR seed), one
//    ConnectX-7 per GPU (8 rails); ~10 us per message as HDR (NIC + proxy thread).
//  - HBM3 at 3.35 TB/s: gamma = 3n / 3.35e12. 989 TFLOP/s bf16 dense peak, a third sustained.
//  - The PCIe box's NICs: 100 Gb/s Ethernet with RDMA (RoCE) = 12.5 GB/s, ~10 us per message as
//    InfiniBand (RDMA, no TCP stack).
constexpr Link kNvswitchH100{3e-6, 1.0 / 370e9};
constexpr Link kRoce100{10e-6, 1.0 / 12.5e9};
constexpr Link kInfinibandNdr{10e-6, 1.0 / 50e9};
constexpr double kH100Gamma = 3.0 / 3.35e12;
constexpr double kH100Flops = 330e12;

struct ProfileFabrics {
  Fabric intra_fabric, inter_fabric;
  int rails;
  bool switch_reduces;
};

HardwareProfile make_profile(const char* name, const char* description, int nodes, int gpus_per_node, Link intra,
                             Link inter, ProfileFabrics t) {
  return HardwareProfile{.name = name, .description = description, .gpus_per_node = gpus_per_node, .nodes = nodes,
                         .intra = intra, .inter = inter, .gamma = kHbmGamma, .flops_per_s = kGpuFlops,
                         .intra_fabric = t.intra_fabric, .inter_fabric = t.inter_fabric, .rails = t.rails,
                         .switch_reduces = t.switch_reduces, .measured = ""};
}

HardwareProfile h100_profile(const char* name, const char* description, int nodes) {
  HardwareProfile p = make_profile(name, description, nodes, 8, kNvswitchH100, kInfinibandNdr,
                                   {Fabric::NVSwitch, Fabric::InfiniBand, 8, true});
  p.gamma = kH100Gamma;
  p.flops_per_s = kH100Flops;
  return p;
}

// True if x bounds a transfer more than y: larger beta first (bytes dominate large collectives),
// then larger alpha.
bool slower(const Link& x, const Link& y) {
  if (x.beta != y.beta) return x.beta > y.beta;
  return x.alpha > y.alpha;
}

// The slowest link between any two ranks of the world (tree, all-to-all, point to point). Only
// two kinds exist: intra is used iff some node holds two ranks, inter iff the world spans nodes.
// (Deciding that directly keeps this O(1); collective_time runs for every collective charged.)
Link slowest_link(const CostModel& m) {
  const int p = m.world_size();
  const bool has_intra = std::min(m.profile().gpus_per_node, p) >= 2;
  const bool has_inter = m.node_of(p - 1) > 0;
  if (has_intra && has_inter)
    return slower(m.profile().inter, m.profile().intra) ? m.profile().inter : m.profile().intra;
  return has_inter ? m.profile().inter : m.profile().intra;
}

// The slowest link from or to rank 0 (the hub of the naive algorithms; with no root in
// collective_time's signature, rank 0 stands for the root).
Link slowest_link_at_root(const CostModel& m) {
  Link worst = m.link(0, 1 % m.world_size());
  for (int r = 1; r < m.world_size(); ++r) {
    if (slower(m.link(0, r), worst)) worst = m.link(0, r);
    if (slower(m.link(r, 0), worst)) worst = m.link(r, 0);
  }
  return worst;
}

// Both trees' parents, heights (leaves 0) and depths (roots 0) over n ranks.
struct DoubleTreeShape {
  std::vector<int> parent[2], height[2], depth[2];
  int max_height = 0;
};

DoubleTreeShape double_tree_shape(int n) {
  DoubleTreeShape t;
  for (int tree = 0; tree < 2; ++tree) {
    t.parent[tree].resize(size_t(n));
    t.height[tree].assign(size_t(n), 0);
    t.depth[tree].assign(size_t(n), 0);
    for (int r = 0; r < n; ++r) t.parent[tree][size_t(r)] = double_tree_parent(n, tree, r);
    for (int r = 0; r < n; ++r) {
      int d = 0;
      for (int up = t.parent[tree][size_t(r)]; up >= 0; up = t.parent[tree][size_t(up)]) {
        ++d;
        t.height[tree][size_t(up)] = std::max(t.height[tree][size_t(up)], d);
      }
      t.depth[tree][size_t(r)] = d;
      t.max_height = std::max(t.max_height, d);
    }
  }
  return t;
}

// ---- measuring "this" machine ----

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Guards a timing that came out zero (coarse clock) so every figure stays positive.
double positive(double seconds) { return std::max(seconds, 1e-12); }

// beta: one copy of a buffer too large for cache, single thread, best of a few (the best run is the
// one least disturbed by other processes).
double measure_copy_beta(std::vector<float>& src, std::vector<float>& dst) {
  const double bytes = double(src.size()) * sizeof(float);
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    best = std::min(best, seconds_since(t0));
  }
  return positive(best) / bytes;
}

// alpha: what one message costs with no payload, i.e. waking another thread and being woken back.
// Two threads ping-pong a token through a mutex and a condition variable; one hand-off is half a
// round trip. Bounded by a round count and a time budget, so a busy machine cannot stall startup.
double measure_handoff_alpha() {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;  // 0: main's turn, 1: partner's turn, -1: partner must exit
  std::thread partner([&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return turn != 0; });
      if (turn < 0) return;
      turn = 0;
      cv.notify_one();
    }
  });
  auto round_trip = [&] {
    std::unique_lock<std::mutex> lock(mu);
    turn = 1;
    cv.notify_one();
    cv.wait(lock, [&] { return turn == 0; });
  };
  for (int i = 0; i < 20; ++i) round_trip();  // warm up: the partner thread is scheduled in
  constexpr int kMaxRounds = 1000;
  constexpr double kBudget = 0.1;  // seconds
  int rounds = 0;
  auto t0 = Clock::now();
  while (rounds < kMaxRounds && (rounds % 64 != 0 || seconds_since(t0) < kBudget)) {
    round_trip();
    ++rounds;
  }
  const double elapsed = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    turn = -1;
  }
  cv.notify_one();
  partner.join();
  return positive(elapsed) / rounds / 2;
}

// gamma: out = a + b over streams too large for cache, timed per byte of the result, the unit the
// formulas charge (the reduce in a ring step produces n/p bytes from two n/p-byte inputs).
double measure_reduce_gamma(const float* a, const float* b, float* out, size_t count) {
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
    best = std::min(best, seconds_since(t0));
  }
  // Read the result so the compiler cannot drop the loop.
  volatile float sink = out[count / 2];
  (void)sink;
  return positive(best) / (double(count) * sizeof(float));
}

// flops: a 512^3 sgemm through the same OpenBLAS the engine's matmuls use, best of a few after a
// warm-up (the first call spins up OpenBLAS's thread pool).
double measure_sgemm_flops() {
  constexpr int n = 512;
  std::vector<float> A(size_t(n) * n, 0.5f), B(size_t(n) * n, 0.25f), C(size_t(n) * n, 0.0f);
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A.data(), n, B.data(), n,
                0.0f, C.data(), n);
  };
  sgemm();
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    sgemm();
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * n * n * n / positive(best);
}

// The same sgemm on one BLAS thread: a rank's ceiling when several ranks share the cores (one BLAS
// thread each, train.cpp), and the unit the CPU roofline multiplies by a rank's threads.
double measure_sgemm_flops_one_thread() {
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(1);
  const double flops = measure_sgemm_flops();
  openblas_set_num_threads(before);
  return flops;
}

// The "this" profile from its four measured figures and the day they were measured.
HardwareProfile this_profile_from(const Link& link, double gamma, double flops, double flops_1t, const std::string& measured) {
  // Ranks are threads sharing one memory: one "node" with room for any world the GUI offers.
  HardwareProfile p;
  p.name = "this";
  p.nodes = 1;
  p.gpus_per_node = 64;
  p.intra = link;
  p.inter = link;
  p.gamma = gamma;
  p.flops_per_s = flops;
  p.sgemm_flops_per_thread = flops_1t;
  p.intra_fabric = p.inter_fabric = Fabric::SharedMemory;
  p.rails = p.gpus_per_node;
  p.measured = measured;
  char text[200];
  std::snprintf(text, sizeof text, "this machine: %u threads, memcpy %.1f GB/s, hand-off %.1f us (measured %s)",
                std::thread::hardware_concurrency(), 1e-9 / link.beta, link.alpha * 1e6, measured.c_str());
  p.description = text;
  return p;
}

HardwareProfile measure_this_machine() {
  // 64 MiB per buffer: well past any last-level cache. Filled first so page faults (first touch)
  // are not timed as bandwidth.
  constexpr size_t kFloats = (size_t(64) << 20) / sizeof(float);
  std::vector<float> src(kFloats, 1.0f), dst(kFloats, 0.0f);

  Link link;
  link.beta = measure_copy_beta(src, dst);
  link.alpha = measure_handoff_alpha();
  // Two 32 MiB inputs (the halves of src) into a 32 MiB result (half of dst).
  const double gamma = measure_reduce_gamma(src.data(), src.data() + kFloats / 2, dst.data(),
                                            kFloats / 2);
  const double flops = measure_sgemm_flops();
  const double flops_1t = measure_sgemm_flops_one_thread();
  char day[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(day, sizeof day, "%Y-%m-%d %H:%M UTC", &utc);
  return this_profile_from(link, gamma, flops, flops_1t, day);
}

// What the cached figures belong to: the CPU's model name and the number of hardware threads. A
// cache copied to another machine (or a VM given more cores) is measured again.
std::string this_machine_key() {
  std::string model = "unknown CPU";
  if (std::FILE* f = std::fopen("/proc/cpuinfo", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f)) {
      if (std::strncmp(line, "model name", 10) != 0) continue;
      const char* colon = std::strchr(line, ':');
      if (!colon) continue;
      model = colon + 1;
      while (!model.empty() && (model.front() == ' ' || model.front() == '\t')) model.erase(model.begin());
      while (!model.empty() && (model.back() == '\n' || model.back() == ' ')) model.pop_back();
      break;
    }
    std::fclose(f);
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " threads";
}

// 2: adds the one-thread sgemm rate (the CPU roofline); a version-1 file is measured again.
constexpr const char* kThisProfileFormat = "dtlab this-profile 2";

// The cached profile in `path`, if it is whole, ours, for this machine and every figure is a
// positive finite number; nothing otherwise (then the caller measures and rewrites it).
std::optional<HardwareProfile> read_this_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("format").get<std::string>() != kThisProfileFormat) return std::nullopt;
    if (j.at("machine").get<std::string>() != this_machine_key()) return std::nullopt;
    Link link;
    link.alpha = j.at("alpha_s").get<double>();
    link.beta = j.at("beta_s_per_byte").get<double>();
    const double gamma = j.at("gamma_s_per_byte").get<double>();
    const double flops = j.at("flops_per_s").get<double>();
    const double flops_1t = j.at("sgemm_1thread_flops_per_s").get<double>();
    for (double x : {link.alpha, link.beta, gamma, flops, flops_1t})
      if (!(x > 0) || !std::isfinite(x)) return std::nullopt;
    return this_profile_from(link, gamma, flops, flops_1t, j.at("measured").get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;  // truncated, not JSON, a field missing or of another type
  }
}

void write_this_profile(const std::string& dir, const HardwareProfile& p) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  nlohmann::json j = {{"format", kThisProfileFormat}, {"machine", this_machine_key()}, {"measured", p.measured},
                      {"alpha_s", p.intra.alpha}, {"beta_s_per_byte", p.intra.beta},
                      {"gamma_s_per_byte", p.gamma}, {"flops_per_s", p.flops_per_s},
                      {"sgemm_1thread_flops_per_s", p.sgemm_flops_per_thread}};
  const std::string text = j.dump(2) + "\n";
  try {
    AtomicFile f(dir + "/this-profile.json");
    f.write(text.data(), text.size());
    f.commit();
  } catch (const std::exception&) {
    // A cache that cannot be written (a read-only home) costs a measurement per launch, nothing more.
  }
}

}  // namespace

const std::vector<HardwareProfile>& builtin_profiles() {
  // Single-node profiles set inter = intra, so a world larger than the node still gets sensible
  // (if optimistic) links instead of zeros. The four first profiles have one rail per GPU, so no
  // ring, tree or naive step shares a NIC and their figures are those of the flat model before
  // contention; pcie-box's two NICs for eight GPUs are where trees queue at the NIC.
  static const std::vector<HardwareProfile> profiles = {
      make_profile("nvlink8", "8 GPUs, NVLink 300 GB/s", 1, 8, kNvlink, kNvlink,
                   {Fabric::NVSwitch, Fabric::NVSwitch, 8, false}),
      make_profile("pcie8", "8 GPUs, PCIe 24 GB/s", 1, 8, kPcie, kPcie, {Fabric::PCIe, Fabric::PCIe, 8, false}),
      make_profile("ib2x4", "2 nodes x 4 GPUs, NVLink inside, InfiniBand 25 GB/s between", 2, 4,
                   kNvlink, kInfiniband, {Fabric::NVLink, Fabric::InfiniBand, 4, false}),
      make_profile("eth2x4", "2 nodes x 4 GPUs, NVLink inside, 25 GbE (3.1 GB/s) between", 2, 4,
                   kNvlink, kEthernet, {Fabric::NVLink, Fabric::Ethernet, 4, false}),
      h100_profile("dgx-h100", "DGX H100: 8 GPUs on NVSwitch 370 GB/s with NVLS, 8 x NDR 400 Gb/s rails", 1),
      h100_profile("dgx-h100x2", "2 DGX H100 nodes: NVSwitch 370 GB/s inside, 8 x NDR 50 GB/s rails, SHARP", 2),
      h100_profile("dgx-h100x4", "4 DGX H100 nodes: NVSwitch 370 GB/s inside, 8 x NDR 50 GB/s rails, SHARP", 4),
      make_profile("pcie-box", "8 GPUs on PCIe 24 GB/s (no NVLink), 2 x 100 GbE RoCE NICs (12.5 GB/s)", 1, 8, kPcie,
                   kRoce100, {Fabric::PCIe, Fabric::Ethernet, 2, false}),
  };
  return profiles;
}

std::string this_profile_cache_dir() {
  if (const char* d = std::getenv("DTLAB_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/dtlab";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/dtlab";
  return "";
}

HardwareProfile load_or_measure_this_profile(const std::string& cache_dir, bool remeasure) {
  if (cache_dir.empty()) return measure_this_machine();
  if (!remeasure)
    if (auto cached = read_this_profile(cache_dir + "/this-profile.json")) return *cached;
  HardwareProfile p = measure_this_machine();
  write_this_profile(cache_dir, p);
  return p;
}

const HardwareProfile& this_machine_profile() {
  // A function-local static: read (or measured) on first use, once, even with several threads asking.
  static const HardwareProfile profile = [] {
    const char* again = std::getenv("DTLAB_REMEASURE");
    return load_or_measure_this_profile(this_profile_cache_dir(), again && *again && std::string(again) != "0");
  }();
  return profile;
}

HardwareProfile find_profile(std::string_view name) {
  if (name == "this") return this_machine_profile();
  if (name == "ideal") {
    // Not hardware: communication is free, so only compute (and who waits for whom) takes time.
    // A pipeline with equal stage costs then shows exactly its schedule's bubble. Its switch
    // reduces, so every algorithm runs on it.
    HardwareProfile p = make_profile("ideal", "free communication (alpha = beta = gamma = 0), 100 TFLOP/s per rank",
                                     1, 64, Link{}, Link{}, {Fabric::SharedMemory, Fabric::SharedMemory, 64, true});
    p.gamma = 0;
    return p;
  }
  for (const auto& p : builtin_profiles())
    if (p.name == name) return p;
  throw Error("hardware profile '" + std::string(name) + "' is not known; use one of " + join(profile_names(), ", "));
}

std::vector<std::string> profile_names() {
  std::vector<std::string> names;
  for (const auto& p : builtin_profiles()) names.push_back(p.name);
  names.push_back("this");
  names.push_back("ideal");
  return names;
}

// ---- closed forms (docs/course_sources.md §6); one rank has nobody to talk to, so p <= 1 costs nothing ----

double ring_allgather_time(int p, double n, double a, double b) {
  if (p <= 1) return 0;
  return (p - 1) * a + double(p - 1) / p * n * b;
}

double ring_reduce_scatter_time(int p, double n, double a, double b, double g) {
  if (p <= 1) return 0;
  return (p - 1) * a + double(p - 1) / p * n * (b + g);
}

double ring_allreduce_time(int p, double n, double a, double b, double g) {
  if (p <= 1) return 0;
  const double f = double(p - 1) / p;
  return 2 * (p - 1) * a + 2 * f * n * b + f * n * g;
}

double binomial_broadcast_time(int p, double n, double a, double b) {
  if (p <= 1) return 0;
  return ceil_log2(p) * (a + n * b);
}

double binomial_reduce_time(int p, double n, double a, double b, double g) {
  if (p <= 1) return 0;
  return ceil_log2(p) * (a + n * b + n * g);
}

double tree_allreduce_time(int p, double n, double a, double b, double g) {
  return binomial_reduce_time(p, n, a, b, g) + binomial_broadcast_time(p, n, a, b);
}

double naive_allreduce_time(int p, double n, double a, double b, double g) {
  if (p <= 1) return 0;
  // Rank 0 receives and reduces the p-1 buffers one after another, then sends the sum back to each.
  return (p - 1) * (a + n * b + n * g) + (p - 1) * (a + n * b);
}

double hierarchical_allreduce_time(int local, int nodes, double n, Link intra, Link inter, int rail_load, double g) {
  const double shard = n / local, piece = n / (double(local) * nodes);
  return (local - 1) * (2 * intra.alpha + 2 * shard * intra.beta + shard * g) +
         (nodes - 1) * (2 * inter.alpha + 2 * rail_load * piece * inter.beta + piece * g);
}

double in_network_allreduce_time(int p, double n, double a, double b) {
  if (p <= 1) return 0;
  const int K = kPipelineChunks;
  return (K + 1) * (a + n / K * b);
}

const char* link_kind_name(LinkKind k) {
  switch (k) {
    case LinkKind::PortOut: return "GPU port out";
    case LinkKind::PortIn: return "GPU port in";
    case LinkKind::RailOut: return "NIC out";
    case LinkKind::RailIn: return "NIC in";
    case LinkKind::Switch: return "switch";
  }
  return "?";
}

const char* fabric_name(Fabric f) {
  switch (f) {
    case Fabric::SharedMemory: return "shared memory";
    case Fabric::NVLink: return "NVLink";
    case Fabric::NVSwitch: return "NVSwitch";
    case Fabric::PCIe: return "PCIe";
    case Fabric::InfiniBand: return "InfiniBand";
    case Fabric::Ethernet: return "Ethernet";
  }
  return "?";
}

// ---- CostModel ----

CostModel::CostModel(HardwareProfile profile, int world_size)
    : profile_(std::move(profile)), world_size_(world_size) {
  DTLAB_CHECK(world_size_ >= 1, "a cost model needs at least one rank; pass the world size");
  DTLAB_CHECK(profile_.gpus_per_node >= 1, "profile '" + profile_.name + "' has no GPUs per node");
}

int CostModel::node_of(int rank) const { return rank / profile_.gpus_per_node; }

const Link& CostModel::link(int src, int dst) const {
  return node_of(src) == node_of(dst) ? profile_.intra : profile_.inter;
}

Link CostModel::ring_link() const {
  Link worst = link(0, 1 % world_size_);  // p = 1: link(0, 0), the node's own link
  for (int r = 1; r < world_size_; ++r) {
    const Link& l = link(r, (r + 1) % world_size_);
    if (slower(l, worst)) worst = l;
  }
  return worst;
}

std::vector<LinkLoad> CostModel::link_loads(const std::vector<std::pair<int, int>>& transfers, double bytes) const {
  std::vector<LinkLoad> links;
  auto use = [&](LinkKind kind, int node, int index) {
    for (LinkLoad& l : links)
      if (l.kind == kind && l.node == node && l.index == index) return void(++l.load);
    links.push_back({kind, node, index, 1, 0.0});
  };
  const int G = profile_.gpus_per_node, rails = std::max(1, profile_.rails);
  const bool spans_nodes = node_of(world_size_ - 1) > 0;
  auto rail = [&](int rank) { return rank % G % rails; };
  auto valid = [&](int r) { return (r >= 0 && r < world_size_) || r == kNetworkSwitch; };
  for (const auto& [src, dst] : transfers) {
    DTLAB_CHECK(valid(src) && valid(dst) && (src >= 0 || dst >= 0),
                "step_time got a rank outside the world; check the algorithm's peer arithmetic");
    if (src == kNetworkSwitch || dst == kNetworkSwitch) {
      const bool up = dst == kNetworkSwitch;
      const int r = up ? src : dst;
      use(up ? LinkKind::PortOut : LinkKind::PortIn, node_of(r), r);
      if (spans_nodes) use(up ? LinkKind::RailOut : LinkKind::RailIn, node_of(r), rail(r));
      use(LinkKind::Switch, spans_nodes ? -1 : node_of(r), 0);
    } else if (node_of(src) == node_of(dst)) {
      use(LinkKind::PortOut, node_of(src), src);
      use(LinkKind::PortIn, node_of(dst), dst);
    } else {
      use(LinkKind::RailOut, node_of(src), rail(src));
      use(LinkKind::RailIn, node_of(dst), rail(dst));
    }
  }
  // The switch is non-blocking (its bandwidth is the sum of its ports): only its latency counts.
  const Link switch_link{spans_nodes ? profile_.inter.alpha : profile_.intra.alpha, 0.0};
  for (LinkLoad& l : links) {
    const bool port = l.kind == LinkKind::PortOut || l.kind == LinkKind::PortIn;
    const Link& f = l.kind == LinkKind::Switch ? switch_link : port ? profile_.intra : profile_.inter;
    l.seconds = f.alpha + l.load * bytes * f.beta;
  }
  std::sort(links.begin(), links.end(), [](const LinkLoad& x, const LinkLoad& y) {
    return std::tuple(x.kind, x.node, x.index) < std::tuple(y.kind, y.node, y.index);
  });
  return links;
}

double CostModel::step_time(const std::vector<std::pair<int, int>>& transfers, double bytes,
                            bool reduce) const {
  double worst = 0;
  for (const LinkLoad& l : link_loads(transfers, bytes)) worst = std::max(worst, l.seconds);
  // Ranks reduce what they receive from ranks; what the switch sends back is already reduced.
  const bool ranks_reduce =
      reduce && std::any_of(transfers.begin(), transfers.end(), [](const auto& t) { return t.first >= 0 && t.second >= 0; });
  return worst + (ranks_reduce ? bytes * profile_.gamma : 0.0);
}

double CostModel::collective_time(CollectiveOp op, Algorithm algo, double bytes) const {
  const int p = world_size_;
  if (p <= 1) return 0;
  const double S = bytes;
  const double g = profile_.gamma;
  if (algo == Algorithm::Default) algo = collective_traits(op).default_algorithm;
  const bool reduce = collective_traits(op).reduces;
  switch (op) {
    case CollectiveOp::AllReduce: {
      if (algo == Algorithm::Ring) {
        const Link l = ring_link();
        return ring_allreduce_time(p, S, l.alpha, l.beta, g);
      }
      if (algo == Algorithm::Tree) {
        const Link l = slowest_link(*this);
        return tree_allreduce_time(p, S, l.alpha, l.beta, g);
      }
      if (algo == Algorithm::DoubleTree) return double_tree_time(S);
      if (algo == Algorithm::Hierarchical) return hierarchical_time(S);
      if (algo == Algorithm::InNetwork) return in_network_time(S);
      const Link l = slowest_link_at_root(*this);
      return naive_allreduce_time(p, S, l.alpha, l.beta, g);
    }
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllGather: {
      if (algo != Algorithm::Naive) {
        // There is no tree form of these (NCCL only rings them), so Tree is charged as Ring.
        const Link l = ring_link();
        return reduce ? ring_reduce_scatter_time(p, S, l.alpha, l.beta, g)
                      : ring_allgather_time(p, S, l.alpha, l.beta);
      }
      // Naive goes through rank 0, one message at a time. Reduce-scatter: every full buffer in
      // (and reduced), then each rank's block out. All-gather: each block in, then the whole out.
      const Link l = slowest_link_at_root(*this);
      const double block = S / p;
      if (reduce) return (p - 1) * (l.alpha + S * l.beta + S * g) + (p - 1) * (l.alpha + block * l.beta);
      return (p - 1) * (l.alpha + block * l.beta) + (p - 1) * (l.alpha + S * l.beta);
    }
    case CollectiveOp::Broadcast:
    case CollectiveOp::Reduce: {
      if (algo == Algorithm::Tree) {
        const Link l = slowest_link(*this);
        return reduce ? binomial_reduce_time(p, S, l.alpha, l.beta, g)
                      : binomial_broadcast_time(p, S, l.alpha, l.beta);
      }
      // Naive: the root sends (receives and reduces) p-1 whole messages one after another. Ring:
      // a chain r -> r+1 without pipelining, p-1 hops of the whole message: the same count of
      // messages, but bounded by the ring's slowest hop.
      const Link l = algo == Algorithm::Ring ? ring_link() : slowest_link_at_root(*this);
      return (p - 1) * (l.alpha + S * l.beta + (reduce ? S * g : 0.0));
    }
    case CollectiveOp::Barrier:
      // An all-reduce of nothing: only the 2(p-1) message latencies remain.
      return 2 * (p - 1) * ring_link().alpha;
    case CollectiveOp::Send:
    case CollectiveOp::Recv: {
      // No peer in this signature, so charge the worst link the message could take.
      const Link l = slowest_link(*this);
      return l.alpha + S * l.beta;
    }
    case CollectiveOp::AllToAll: {
      if (algo == Algorithm::Grouped) {  // every block at once: one latency, each rank's p-1 blocks share its links
        std::vector<std::pair<int, int>> all;
        for (int src = 0; src < p; src++)
          for (int dst = 0; dst < p; dst++)
            if (src != dst) all.push_back({src, dst});
        return step_time(all, S / p, false);
      }
      // Pairwise: each rank sends a block of S/p to each of the p-1 others, one after another.
      const Link l = slowest_link(*this);
      return (p - 1) * (l.alpha + S / p * l.beta);
    }
  }
  DTLAB_CHECK(false, "collective_time does not know this CollectiveOp; add a case for it");
  return 0;
}

double CostModel::double_tree_time(double bytes) const {
  // Both trees in the same steps (docs/course_sources.md §6b): in reduce step t a node of height h
  // sends chunk t - h to its parent; in broadcast step t a node of depth d gets chunk t - d + 1.
  const int K = kPipelineChunks, n = world_size_;
  const DoubleTreeShape t = double_tree_shape(n);
  const double chunk = bytes / (2.0 * K);
  double total = 0;
  std::vector<std::pair<int, int>> pairs;
  for (int phase = 0; phase < 2; ++phase) {
    const bool reduce = phase == 0;
    for (int step = 0; step < K + t.max_height - 1; ++step) {
      pairs.clear();
      for (int tree = 0; tree < 2; ++tree)
        for (int r = 0; r < n; ++r) {
          const int up = t.parent[tree][size_t(r)];
          const int c = reduce ? step - t.height[tree][size_t(r)] : step - t.depth[tree][size_t(r)] + 1;
          if (up < 0 || c < 0 || c >= K) continue;
          pairs.push_back(reduce ? std::pair{r, up} : std::pair{up, r});
        }
      total += step_time(pairs, chunk, reduce);
    }
  }
  return total;
}

double CostModel::hierarchical_time(double bytes) const {
  const int p = world_size_, G = profile_.gpus_per_node;
  // One node, one rank per node, or no whole nodes: the stepped algorithm runs the ring (or refuses).
  if (G <= 1 || G >= p || p % G != 0) {
    const Link l = ring_link();
    return ring_allreduce_time(p, bytes, l.alpha, l.beta, profile_.gamma);
  }
  const int N = p / G;
  std::vector<std::pair<int, int>> intra, inter;  // one step of the rings inside the nodes, across them
  for (int node = 0; node < N; ++node)
    for (int l = 0; l < G; ++l) {
      intra.emplace_back(node * G + l, node * G + (l + 1) % G);
      inter.emplace_back(node * G + l, (node + 1) % N * G + l);
    }
  const double shard = bytes / G, piece = bytes / (double(G) * N);
  return (G - 1) * (step_time(intra, shard, true) + step_time(intra, shard, false)) +
         (N - 1) * (step_time(inter, piece, true) + step_time(inter, piece, false));
}

double CostModel::in_network_time(double bytes) const {
  const int K = kPipelineChunks;
  std::vector<std::pair<int, int>> up, down, both;
  for (int r = 0; r < world_size_; ++r) {
    up.emplace_back(r, kNetworkSwitch);
    down.emplace_back(kNetworkSwitch, r);
  }
  both = up;
  both.insert(both.end(), down.begin(), down.end());
  const double chunk = bytes / K;
  return step_time(up, chunk, true) + (K - 1) * step_time(both, chunk, true) + step_time(down, chunk, false);
}

double CostModel::compute_time(double flops) const {
  DTLAB_CHECK(profile_.flops_per_s > 0, "profile '" + profile_.name + "' has no compute rate");
  return flops / profile_.flops_per_s;
}

}  // namespace dtlab
