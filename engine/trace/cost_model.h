// The modeled clock: hardware profiles (links with alpha-beta costs, a reduction cost, a compute
// rate) and the alpha-beta formulas of docs/course_sources.md §6, so a 2-core laptop can show what 8 GPUs on
// NVLink or 2 nodes on Ethernet would do. Algorithms charge each step with step_time(), which finds
// the physical links a step's transfers cross (GPU ports, NIC rails, the reducing switch) and charges
// the slowest with its contention; summed over a collective's steps on uniform links that equals
// collective_time() (the closed formulas).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/collective.h"
#include "engine/core/double_tree.h"  // kPipelineChunks, double_tree_parent

namespace dtlab {

struct Link {
  double alpha = 0;  // seconds per message
  double beta = 0;   // seconds per byte (1 / bandwidth)
};

// What carries the bytes: inside a node (shared memory for threads on one machine, NVLink point to
// point, an NVSwitch, or a PCIe switch) and between nodes (InfiniBand or Ethernet NICs).
enum class Fabric : uint8_t { SharedMemory, NVLink, NVSwitch, PCIe, InfiniBand, Ethernet };
const char* fabric_name(Fabric f);  // "shared memory", "NVLink", "NVSwitch", "PCIe", "InfiniBand", "Ethernet"

struct HardwareProfile {
  std::string name;         // "nvlink8", "pcie8", "ib2x4", "eth2x4", "dgx-h100", "this", ...
  std::string description;  // "8 GPUs on NVLink (300 GB/s)", shown in the GUI
  int gpus_per_node = 8;    // ranks per node; rank r lives on node r / gpus_per_node
  int nodes = 1;
  Link intra;               // between ranks of one node (one GPU's port into the node's fabric)
  Link inter;               // between nodes: one NIC (rail) of a node into the network
  double gamma = 0;         // seconds per byte reduced (one read-add of a float stream)
  double flops_per_s = 0;   // compute rate of one rank
  // "this": one thread's OpenBLAS sgemm rate, the CPU roofline's ceiling per BLAS thread (roofline.h);
  // 0 on the built-in profiles.
  double sgemm_flops_per_thread = 0;
  Fabric intra_fabric = Fabric::NVLink;
  Fabric inter_fabric = Fabric::InfiniBand;
  int rails = 1;            // NICs per node; local GPU g sends off-node through NIC g % rails
  // The fabric reduces in the switch (NVLink SHARP inside a node, SHARP on InfiniBand between
  // nodes): the in-network all-reduce runs only on such profiles.
  bool switch_reduces = false;
  std::string measured;     // "this": when its figures were measured ("2026-11-29 17:05 UTC"); "" otherwise
};

// The built-in profiles (seed figures from docs/course_sources.md §6), in display order.
const std::vector<HardwareProfile>& builtin_profiles();
// Measures this machine once (memcpy bandwidth, a thread hand-off latency, reduction bandwidth,
// sgemm rate with the library's threads and with one; well under a second) and keeps the figures in this_profile_cache_dir()'s
// this-profile.json, so every launch on this machine predicts with the same figures (a measurement
// per launch moved with the load: 11.1 us one launch, 7.2 us the next, for one all-gather). The file
// names the CPU and the date; DTLAB_REMEASURE=1 (or deleting the file) measures again. Read once
// per process.
const HardwareProfile& this_machine_profile();
// $DTLAB_CACHE_DIR, else $XDG_CACHE_HOME/dtlab, else $HOME/.cache/dtlab; "" when none is set.
std::string this_profile_cache_dir();
// The "this" profile cached in DIR/this-profile.json when that file is whole and was measured on
// this machine (same CPU model and thread count); otherwise (or with `remeasure`) measured now and
// written there atomically. A directory that cannot be written only costs the cache.
HardwareProfile load_or_measure_this_profile(const std::string& cache_dir, bool remeasure = false);
// A built-in profile's name, "this", or "ideal" (free communication: what a schedule alone costs);
// dtlab::Error listing the names otherwise.
HardwareProfile find_profile(std::string_view name);
// Every name find_profile takes, in display order: the built-in ones, then "this" and "ideal".
std::vector<std::string> profile_names();

// The physical links of a topology (docs/course_sources.md §6b), each a resource that the transfers
// of one step share: a GPU's port into its node's fabric (one per direction), a node's NIC rails (one
// per direction; local GPU g uses rail g % rails) and the reducing switch (NVSwitch with NVLS inside a
// node, the network switch with SHARP across nodes).
enum class LinkKind : uint8_t { PortOut, PortIn, RailOut, RailIn, Switch };
const char* link_kind_name(LinkKind k);  // "GPU port out", "GPU port in", "NIC out", "NIC in", "switch"
struct LinkLoad {
  LinkKind kind = LinkKind::PortOut;
  int node = 0;         // the node it belongs to; -1: the network switch between nodes
  int index = 0;        // ports: the rank; rails: the rail (NIC) of the node; switch: 0
  int load = 0;         // transfers crossing it in the step
  double seconds = 0;   // alpha + load x bytes x beta
  bool operator==(const LinkLoad&) const = default;
};

// bus_bandwidth_factor(op, n), nccl-tests' busbw = algbw x factor, is a column of the collective
// table (engine/core/collective.h); the cost model's algbw and the bench's both scale by it.

// Closed forms (p ranks, n bytes, per-message a, per-byte b, per-byte reduction g).
double ring_allgather_time(int p, double n, double a, double b);
double ring_reduce_scatter_time(int p, double n, double a, double b, double g);
double ring_allreduce_time(int p, double n, double a, double b, double g);
double binomial_broadcast_time(int p, double n, double a, double b);
double binomial_reduce_time(int p, double n, double a, double b, double g);
double tree_allreduce_time(int p, double n, double a, double b, double g);   // reduce + broadcast
double naive_allreduce_time(int p, double n, double a, double b, double g);  // gather to 0 + reduce + send back
// Hierarchical all-reduce over `nodes` nodes of `local` ranks: ring reduce-scatter inside (local - 1
// steps of n / local), ring all-reduce across nodes on the shard (2(nodes - 1) steps of
// n / (local nodes), the `local` rings sharing the rails: rail_load of them on the busiest NIC),
// ring all-gather inside (local - 1 steps of n / local).
double hierarchical_allreduce_time(int local, int nodes, double n, Link intra, Link inter, int rail_load, double g);
// In-network: K + 1 steps of n / K (K = kPipelineChunks; each rank sends chunk t up and gets
// chunk t - 1 back; the switch reduces, the ranks do not). `a`, `b`: the slowest link a chunk crosses.
double in_network_allreduce_time(int p, double n, double a, double b);
// The double binary tree has no formula this short: a rank sends in both trees and a parent hears
// two children at once, so its steps' loads vary; CostModel::collective_time walks its steps.

class CostModel {
 public:
  CostModel(HardwareProfile profile, int world_size);
  const HardwareProfile& profile() const { return profile_; }
  int world_size() const { return world_size_; }
  int node_of(int rank) const;
  const Link& link(int src, int dst) const;  // intra or inter
  // The slowest link among consecutive ring neighbours (r -> r+1 mod p): what bounds a ring step.
  Link ring_link() const;

  // One algorithm step in which every (src, dst) pair moves `bytes` concurrently; with `reduce`
  // the receiving ranks also reduce them (a switch reduces at line rate: no gamma). A peer may be
  // kNetworkSwitch. The step ends when its slowest link does, a link's time growing with its load.
  double step_time(const std::vector<std::pair<int, int>>& transfers, double bytes, bool reduce) const;
  // The links such a step uses, each with its load and time, sorted by (kind, node, index). Where
  // the transfer goes: ranks on one node, src's port out and dst's port in; on different nodes,
  // src's NIC rail out and dst's NIC rail in; to or from the switch, the rank's port (and, when the
  // world spans nodes, its rail), and the switch itself (non-blocking: its alpha only).
  std::vector<LinkLoad> link_loads(const std::vector<std::pair<int, int>>& transfers, double bytes) const;
  // Whole collective of `bytes` (the payload S: the full buffer for all-reduce, broadcast and
  // reduce; the gathered/scattered total for all-gather and reduce-scatter), on the profile's
  // links as the algorithm uses them.
  double collective_time(CollectiveOp op, Algorithm algo, double bytes) const;
  double compute_time(double flops) const;

 private:
  double double_tree_time(double bytes) const;
  double hierarchical_time(double bytes) const;
  double in_network_time(double bytes) const;

  HardwareProfile profile_;
  int world_size_;
};

}  // namespace dtlab
