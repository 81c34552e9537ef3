// The modeled clock: hardware profiles (links with alpha-beta costs, a reduction cost, a compute
// rate) and the alpha-beta formulas of docs/course_sources.md §6, so a 2-core laptop can show what 8 GPUs on
// NVLink or 2 nodes on Ethernet would do. Algorithms charge each step with step_time(); summed over
// a collective's steps on uniform links that equals collective_time() (the closed formulas).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/collective.h"

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
  Fabric intra_fabric = Fabric::NVLink;
  Fabric inter_fabric = Fabric::InfiniBand;
  int rails = 1;            // NICs per node; local GPU g sends off-node through NIC g % rails
  // The fabric reduces in the switch (NVLink SHARP inside a node, SHARP on InfiniBand between
  // nodes): the in-network all-reduce runs only on such profiles.
  bool switch_reduces = false;
};

// The built-in profiles (seed figures from docs/course_sources.md §6), in display order.
const std::vector<HardwareProfile>& builtin_profiles();
// Measures this machine once (memcpy bandwidth, a thread hand-off latency, reduction bandwidth,
// sgemm rate; well under a second) and caches the result.
const HardwareProfile& this_machine_profile();
// "nvlink8", "pcie8", "ib2x4", "eth2x4", "this", or "ideal" (free communication: what a schedule
// alone costs); dtlab::Error listing the names otherwise.
HardwareProfile find_profile(std::string_view name);

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
  // the receiver also reduces them. The step ends when its slowest transfer does.
  double step_time(const std::vector<std::pair<int, int>>& transfers, double bytes, bool reduce) const;
  // Whole collective of `bytes` (the payload S: the full buffer for all-reduce, broadcast and
  // reduce; the gathered/scattered total for all-gather and reduce-scatter), on the profile's
  // links as the algorithm uses them.
  double collective_time(CollectiveOp op, Algorithm algo, double bytes) const;
  double compute_time(double flops) const;

 private:
  HardwareProfile profile_;
  int world_size_;
};

}  // namespace dtlab
