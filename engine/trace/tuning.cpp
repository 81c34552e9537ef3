// The tuning model (tuning.h), after NCCL's ncclTopoTuneModel and ncclTopoGetAlgoTime
// (src/graph/tuning.cc; docs/course_sources.md §6b). What is NCCL's: the per-algorithm and
// per-protocol base latencies, the per-hop latency of each link kind (NVLink, PCI, network) and how
// many hops each algorithm counts (ring 2(n-1) steps of which 2 x nodes cross the network; tree 2 x
// (intra-node depth + log2(nodes)) hops), the ring's bus-to-algorithm bandwidth ratio n / nsteps, the
// tree's 0.92 x 1/2, and LL128 enabled by default only on NVLink. What is dtlab's: the per-hop
// latencies are scaled so that a ring/simple hop costs exactly the profile's alpha (NCCL's tables are
// for its hardware, the profiles are ours), the bandwidths come from the profile's betas, and the
// protocols keep their wire efficiency (LL: 4 data bytes per 8-byte line; LL128: 120 per 128).
#include "engine/core/arith.h"
#include "engine/trace/tuning.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/core/check.h"
#include "engine/core/format.h"

namespace dtlab {

namespace {

// NCCL's link kinds and algorithm families for latency, and its protocol order in the tables.
enum Hw { kNvlinkHw, kPciHw, kNetHw };
enum Family { kTreeFamily, kRingFamily, kNvlsFamily };
enum ProtoIndex { kLLIndex, kLL128Index, kSimpleIndex };

// Per-hop latency in us, [link kind][family][LL, LL128, Simple] (NCCL 2.19 hwLat; NVLS has simple
// only; on PCI it does not exist, so it borrows NVLink's figure).
constexpr double kHopLatencyUs[3][3][3] = {
    {{0.6, 1.25, 28}, {0.6, 1.9, 3.4}, {0, 0, 23}},   // NVLink
    {{1.0, 1.9, 28}, {1.0, 2.5, 5.7}, {0, 0, 23}},    // PCI
    {{5.0, 8.5, 28}, {2.7, 4.0, 14.0}, {0, 0, 18}},   // network
};
// Base latency in us per call, [family][LL, LL128, Simple] (NCCL 2.19 baseLat).
constexpr double kBaseLatencyUs[3][3] = {{6.8, 14.0, 0}, {6.6, 14.0, 8.4}, {0, 0, 0}};
// NCCL's tree refinement: busBw x 0.92, and algbw = busBw / 2 (each of the two trees carries half).
constexpr double kTreeBusBwFactor = 0.92;

int proto_index(Protocol p) { return p == Protocol::LL ? kLLIndex : p == Protocol::LL128 ? kLL128Index : kSimpleIndex; }

// Bytes of payload per byte on the wire: an LL line is 8 bytes of which 4 are data (a 4-byte flag
// with each 4 data bytes); an LL128 line is 128 bytes of which 120 are data (one 8-byte flag).
double wire_efficiency(Protocol p) { return p == Protocol::LL ? 4.0 / 8.0 : p == Protocol::LL128 ? 120.0 / 128.0 : 1.0; }

Hw hw_of(Fabric f) {
  if (f == Fabric::NVLink || f == Fabric::NVSwitch) return kNvlinkHw;
  if (f == Fabric::InfiniBand || f == Fabric::Ethernet) return kNetHw;
  return kPciHw;  // PCIe, and threads sharing memory
}

int floor_log2(int p) {
  int k = 0;
  while ((2 << k) <= p) ++k;
  return p >= 1 ? k : 0;
}

// What the formulas need of a profile and world.
struct Topology {
  int n = 1, nodes = 1, ppn = 1;  // ranks, nodes spanned, ranks per (full) node
  int rails = 1;                  // NICs a node's ranks use: min(profile rails, ranks per node)
  const HardwareProfile* p = nullptr;
  bool free = false;              // alpha = 0 everywhere (the ideal profile): no latency at all

  Topology(const HardwareProfile& prof, int world) : n(std::max(world, 1)), p(&prof) {
    const int gpn = std::max(prof.gpus_per_node, 1);
    nodes = (n + gpn - 1) / gpn;
    ppn = std::min(n, gpn);
    rails = std::clamp(std::min(prof.rails, ppn), 1, 1 << 20);
    free = prof.intra.alpha == 0 && prof.inter.alpha == 0;
  }
  bool uses_intra() const { return ppn >= 2; }
  bool uses_inter() const { return nodes >= 2; }
  // Seconds per byte through one node's NICs together (rails share a node's outgoing traffic).
  double node_nic_beta() const { return p->inter.beta / rails; }
  // The bottleneck of a ring or tree whose channels spread over the rails: the slower of one GPU's
  // intra-node port and the node's NICs.
  double spread_beta() const {
    double b = uses_intra() || !uses_inter() ? p->intra.beta : 0;
    return uses_inter() ? std::max(b, node_nic_beta()) : b;
  }
  // The slowest single link a point-to-point send may cross (one NIC, no spreading).
  const Link& slowest_link() const { return uses_inter() && p->inter.beta >= p->intra.beta ? p->inter : p->intra; }
  Hw slowest_hw() const { return &slowest_link() == &p->inter ? hw_of(p->inter_fabric) : hw_of(p->intra_fabric); }

  // One hop's latency: NCCL's figure for the family and protocol, scaled so that a ring/simple hop
  // on that link kind costs the profile's alpha.
  double hop(const Link& l, Hw hw, Family f, Protocol proto) const {
    const double ring_simple = kHopLatencyUs[hw][kRingFamily][kSimpleIndex];
    double lat = l.alpha * kHopLatencyUs[hw][f][proto_index(proto)] / ring_simple;
    // NCCL: LL's intra-node hops slow down when the run spans nodes (its flags go through the proxy).
    if (proto == Protocol::LL && nodes > 1 && &l == &p->intra) lat *= 1.8;
    return lat;
  }
  double intra_hop(Family f, Protocol proto) const {
    const Hw hw = f == kNvlsFamily ? kNvlinkHw : hw_of(p->intra_fabric);
    return hop(p->intra, hw, f, proto);
  }
  double inter_hop(Family f, Protocol proto) const { return hop(p->inter, kNetHw, f, proto); }
  double base(Family f, Protocol proto) const { return free ? 0 : kBaseLatencyUs[f][proto_index(proto)] * 1e-6; }
};

// Latency (s) and seconds per payload byte of one pair, before the protocol's wire efficiency.
struct Cost {
  double latency = 0, beta = 0;
};

Cost ring_cost(const Topology& t, CollectiveOp op, Protocol proto) {
  const bool all_reduce = op == CollectiveOp::AllReduce;
  const int nsteps = all_reduce ? 2 * (t.n - 1) : t.n - 1;
  const int inter = std::min(nsteps, !t.uses_inter() ? 0 : all_reduce ? 2 * t.nodes : t.nodes - 1);
  Cost c;
  c.latency = t.base(kRingFamily, proto) + (nsteps - inter) * t.intra_hop(kRingFamily, proto) +
              inter * t.inter_hop(kRingFamily, proto);
  // NCCL: algbw = busbw x n / nsteps, busbw being the bottleneck link's bandwidth.
  c.beta = t.spread_beta() * nsteps / t.n;
  return c;
}

// All-to-all: each rank sends (n-1)/n of its buffer either way. Pairwise takes n-1 rounds, a hop's
// latency each; across nodes every round has a rank whose partner is on another node (round k: the
// node's last rank sends to the next node's k-th), so each pays the inter-node hop. Grouped posts
// every send and receive at once, so one hop's latency (the slowest link's) covers them all.
Cost all_to_all_cost(const Topology& t, Algorithm algo, Protocol proto) {
  const int nsteps = t.n - 1;
  const int inter = t.uses_inter() ? nsteps : 0;
  Cost c;
  if (algo == Algorithm::Grouped)
    c.latency = t.base(kRingFamily, proto) + (inter > 0 ? t.inter_hop(kRingFamily, proto) : t.intra_hop(kRingFamily, proto));
  else
    c.latency = t.base(kRingFamily, proto) + (nsteps - inter) * t.intra_hop(kRingFamily, proto) + inter * t.inter_hop(kRingFamily, proto);
  c.beta = t.spread_beta() * nsteps / t.n;
  return c;
}

Cost double_tree_cost(const Topology& t, Protocol proto) {
  Cost c;
  c.latency = t.base(kTreeFamily, proto) + 2 * ((t.ppn - 1) * t.intra_hop(kTreeFamily, proto) +
                                                floor_log2(t.nodes) * t.inter_hop(kTreeFamily, proto));
  c.beta = t.spread_beta() / (kTreeBusBwFactor * 0.5);
  return c;
}

// Reduce-scatter inside the node, all-reduce between the nodes (the node's ranks at once, sharing
// its NICs), all-gather inside the node: three collectives in a row, each with its base latency.
Cost hierarchical_cost(const Topology& t, Protocol proto) {
  Cost c;
  c.latency = 3 * t.base(kRingFamily, proto) + 2 * (t.ppn - 1) * t.intra_hop(kRingFamily, proto) +
              2 * (t.nodes - 1) * t.inter_hop(kRingFamily, proto);
  c.beta = 2.0 * (t.ppn - 1) / t.ppn * t.p->intra.beta + 2.0 * (t.nodes - 1) / t.nodes * t.node_nic_beta();
  return c;
}

// Every rank sends its S to the switch and receives the reduced S back (at once, full duplex); across
// nodes the node's reduced S goes through its NICs to the network's reducing switch.
Cost in_network_cost(const Topology& t, Protocol proto) {
  Cost c;
  c.latency = t.intra_hop(kNvlsFamily, proto) + (t.uses_inter() ? t.inter_hop(kNvlsFamily, proto) : 0);
  c.beta = t.spread_beta();
  return c;
}

// dtlab's teaching algorithms, not pipelined: every hop moves the whole buffer over the slowest link.
Cost whole_buffer_cost(const Topology& t, CollectiveOp op, Algorithm algo, Protocol proto) {
  const int once = algo == Algorithm::Tree ? ceil_log2(t.n) : t.n - 1;
  const int hops = op == CollectiveOp::AllReduce ? 2 * once : once;
  Cost c;
  c.latency = t.base(kRingFamily, proto) + hops * t.hop(t.slowest_link(), t.slowest_hw(), kRingFamily, proto);
  c.beta = hops * t.slowest_link().beta;
  return c;
}

// Why the tuner leaves a pair out unless forced ("" when it considers it).
std::string why_not(const Topology& t, Algorithm algo, Protocol proto) {
  const HardwareProfile& p = *t.p;
  if (algo == Algorithm::InNetwork) {
    if (!p.switch_reduces)
      return "nvls needs a switch that reduces (NVLink SHARP or SHARP), and profile " + p.name + " has none";
    if (proto != Protocol::Simple) return "nvls runs the simple protocol only, as NCCL's NVLS does";
  }
  if (algo == Algorithm::Hierarchical && !t.uses_inter())
    return "hierarchical needs ranks on more than one node; " + std::to_string(t.n) + " ranks fit in one node of " + p.name;
  // What check_algorithm_topology refuses to run: the tuner never picks it (--algo auto once chose
  // hierarchical for 6 ranks on ib2x4, then the run refused its own choice).
  if (algo == Algorithm::Hierarchical && p.gpus_per_node > 1 && t.n % p.gpus_per_node != 0)
    return "hierarchical needs whole nodes, and " + std::to_string(t.n) + " ranks are not a multiple of " + p.name + "'s " +
           std::to_string(p.gpus_per_node) + " GPUs per node";
  if (proto == Protocol::LL128 && hw_of(p.intra_fabric) != kNvlinkHw)
    return "NCCL enables LL128 by default only where GPUs talk over NVLink, and " + p.name + "'s talk over " +
           fabric_name(p.intra_fabric);
  return "";
}

std::string time_text(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1) std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string pair_name(const Prediction& p) { return std::string(algorithm_name(p.algo)) + "/" + protocol_name(p.proto); }

bool matches(const Prediction& p, Algorithm algo, Protocol proto) {
  return (algo == Algorithm::Default || p.algo == algo) && (proto == Protocol::Default || p.proto == proto);
}

}  // namespace

Prediction predict(const HardwareProfile& profile, int world, CollectiveOp op, Algorithm algo, Protocol proto,
                   double bytes) {
  const Topology t(profile, world);
  const CollectiveTraits& traits = collective_traits(op);
  if (algo == Algorithm::Default) algo = traits.default_algorithm;
  if (proto == Protocol::Default) proto = Protocol::Simple;
  Prediction r;
  r.algo = algo;
  r.proto = proto;
  r.why_not = why_not(t, algo, proto);
  r.available = r.why_not.empty();
  if (t.n <= 1) return r;  // one rank: nothing moves
  Cost c;
  if (algo == Algorithm::DoubleTree) c = double_tree_cost(t, proto);
  else if (algo == Algorithm::Hierarchical) c = t.uses_inter() ? hierarchical_cost(t, proto) : ring_cost(t, op, proto);
  else if (algo == Algorithm::InNetwork) c = in_network_cost(t, proto);
  else if (algo == Algorithm::Tree || algo == Algorithm::Naive) c = whole_buffer_cost(t, op, algo, proto);
  else if (op == CollectiveOp::AllToAll) c = all_to_all_cost(t, algo, proto);
  else c = ring_cost(t, op, proto);
  const double beta = c.beta / wire_efficiency(proto);
  const double factor = bus_bandwidth_factor(op, t.n, algo);
  r.latency_s = c.latency;
  r.seconds = c.latency + bytes * beta;
  r.algbw = r.seconds > 0 ? bytes / r.seconds : 0;
  r.busbw = r.algbw * factor;
  r.peak_busbw = beta > 0 ? factor / beta : 0;
  return r;
}

std::vector<Prediction> predict_all(const HardwareProfile& profile, int world, CollectiveOp op, double bytes) {
  std::vector<Prediction> all;
  const CollectiveTraits& t = collective_traits(op);
  for (Algorithm a : kAlgorithms) {
    if (!t.runs(a)) continue;
    for (Protocol p : kProtocols) all.push_back(predict(profile, world, op, a, p, bytes));
  }
  return all;
}

Prediction select(const HardwareProfile& profile, int world, CollectiveOp op, double bytes, Algorithm algo,
                  Protocol proto) {
  std::vector<Prediction> all = predict_all(profile, world, op, bytes);
  if (all.empty()) {  // one fixed schedule: its algorithm, with the best protocol for it
    for (Protocol p : kProtocols) all.push_back(predict(profile, world, op, algo, p, bytes));
    algo = Algorithm::Default;
  }
  const Prediction* best = nullptr;
  // The forced candidates the tuner would enable, else (a forced pair it would not) any forced one.
  for (bool need_available : {true, false}) {
    for (const Prediction& p : all) {
      if (!matches(p, algo, proto) || (need_available && !p.available)) continue;
      if (!best || p.seconds < best->seconds) best = &p;
    }
    if (best) return *best;
  }
  return predict(profile, world, op, algo, proto, bytes);  // a forced pair the op does not run
}

std::string explain(const HardwareProfile& profile, int world, CollectiveOp op, double bytes, Algorithm algo,
                    Protocol proto) {
  if (world <= 1) return "one rank: nothing to communicate, so nothing to choose";
  const Topology t(profile, world);
  const Prediction chosen = select(profile, world, op, bytes, algo, proto);
  std::string where = " at " + format_bytes(bytes) + " on " + std::to_string(t.n) + " ranks over " +
                      std::to_string(t.nodes) + (t.nodes == 1 ? " node" : " nodes") + ": " +
                      (chosen.latency_s >= 0.5 * chosen.seconds ? "latency-bound" : "bandwidth-bound");
  const bool forced = algo != Algorithm::Default || proto != Protocol::Default;
  if (forced) {
    const Prediction tuned = select(profile, world, op, bytes);
    std::string s = pair_name(chosen) + " (the run's choice): " + time_text(chosen.seconds) + where;
    if (tuned.algo == chosen.algo && tuned.proto == chosen.proto) return s + "; the tuner picks the same";
    return s + "; the tuner would pick " + pair_name(tuned) + ": " + time_text(tuned.seconds);
  }
  // The fastest available pair of another algorithm (the predictions outlive the pointer into them).
  const std::vector<Prediction> all = predict_all(profile, world, op, bytes);
  const Prediction* other = nullptr;
  for (const Prediction& p : all)
    if (p.available && p.algo != chosen.algo && (!other || p.seconds < other->seconds)) other = &p;
  std::string s = pair_name(chosen) + ": " + time_text(chosen.seconds);
  if (other) s += " vs " + pair_name(*other) + " " + time_text(other->seconds);
  return s + where;
}

void check_forced_choice(const HardwareProfile& profile, CollectiveOp op, Algorithm algo, Protocol proto) {
  if (op != CollectiveOp::AllReduce || algo != Algorithm::InNetwork) return;
  if (!profile.switch_reduces)
    throw Error("--algo nvls needs a profile whose switch reduces (NVLink SHARP or SHARP), and " + profile.name +
                " has none; pick such a --profile or another algorithm");
  if (proto != Protocol::Default && proto != Protocol::Simple)
    throw Error(std::string("--algo nvls runs the simple protocol only (as NCCL's NVLS), not ") + protocol_name(proto) +
                "; use --proto simple or auto");
}

std::string algorithm_choice_name(Algorithm a) { return a == Algorithm::Default ? "auto" : algorithm_name(a); }

Algorithm parse_algorithm_choice(std::string_view text, CollectiveOp op) {
  if (text == "auto") return Algorithm::Default;
  const CollectiveTraits& t = collective_traits(op);
  std::vector<std::string> names = {"auto"};
  bool known = false;
  for (Algorithm a : kAlgorithms) {
    known = known || text == algorithm_name(a);
    if (t.algorithms != 0 && !t.runs(a)) continue;
    if (text == algorithm_name(a)) return a;
    names.push_back(algorithm_name(a));
  }
  if (known)
    throw Error("--algo " + std::string(text) + " is not " + (std::string("aeiou").find(t.display_name[0]) != std::string::npos ? "an " : "a ") +
                t.display_name + " algorithm; use " + choice_list(names));
  throw Error("--algo " + std::string(text) + " is not an algorithm; use " + choice_list(names));
}

std::string protocol_choice_name(Protocol p) { return p == Protocol::Default ? "auto" : protocol_name(p); }

Protocol parse_protocol_choice(std::string_view text) {
  std::string lower(text);  // NCCL_PROTO's spellings too: LL, LL128, Simple
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "auto") return Protocol::Default;
  for (Protocol p : kProtocols)
    if (lower == protocol_name(p)) return p;
  throw Error("--proto " + std::string(text) + " is not a protocol; use auto, simple, ll or ll128");
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace dtlab
