// What the collectives are, below every layer that names them: the op, reduction and algorithm enums,
// and one table (nccl-tests style) of what each op is: its names, the algorithms it runs, its buffers'
// element counts, its payload and its bus bandwidth factor. The communicator (engine/comm) runs the
// ops, events and the cost model (engine/trace) describe them, the CLI bench and the lab's views print
// them: all read this table, so a fact about an op is written once, here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dtlab {

enum class ReduceOp : uint8_t { Sum, Avg, Max };
enum class CollectiveOp : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Barrier,
  Send,
  Recv,
  AllToAll,
  // new values go at the end, with a row in kCollectiveTable
};
// Default: the communicator's configured algorithm for that op (the table's default_algorithm
// unless configured otherwise: ring for all-reduce, reduce-scatter and all-gather; tree for
// broadcast and reduce).
// Tree is the binomial tree (broadcast, reduce; all-reduce as reduce then broadcast). The last three
// are all-reduce only (docs/course_sources.md §6b):
//   DoubleTree    NCCL's Tree: two binary trees (NCCL's ncclGetDtree), each carrying half of the
//                 buffer, reduce up then broadcast down, pipelined in chunks;
//   Hierarchical  reduce-scatter inside each node, all-reduce across nodes between the ranks holding
//                 the same shard, all-gather inside each node;
//   InNetwork     NVLS / SHARP: every rank sends its buffer to a switch that reduces it and sends the
//                 result back (transfers to or from the switch name kNetworkSwitch as their peer).
// All-to-all runs Pairwise (n-1 rounds; in round k rank r sends to r+k and receives from r-k, one
// pair per rank at a time) or Grouped (NCCL's: every send and receive posted in one group, all pairs
// moving at once; nccl-tests' alltoall.cu).
enum class Algorithm : uint8_t { Default, Ring, Tree, Naive, DoubleTree, Hierarchical, InNetwork, Pairwise, Grouped };
// Every Algorithm but Default, in display order.
inline constexpr Algorithm kAlgorithms[] = {Algorithm::Ring, Algorithm::Tree, Algorithm::Naive, Algorithm::DoubleTree,
                                            Algorithm::Hierarchical, Algorithm::InNetwork, Algorithm::Pairwise, Algorithm::Grouped};
inline constexpr Algorithm kLastAlgorithm = Algorithm::Grouped;
// The peer of a transfer that goes to or comes from the in-network reducing switch (not a rank; -1
// stays "no peer").
inline constexpr int kNetworkSwitch = -2;

// NCCL's protocols (docs/course_sources.md §6b), NCCL_PROTO's names in lower case: Simple (whole
// buffers, a fence per step: full bandwidth, the highest latency), LL (8-byte lines of 4 data bytes
// and a 4-byte flag: the lowest latency, half the bandwidth), LL128 (128-byte lines with 8 flag bytes:
// low latency, 120/128 of the bandwidth). Default: the tuning model's choice.
enum class Protocol : uint8_t { Default, Simple, LL, LL128 };
inline constexpr Protocol kProtocols[] = {Protocol::Simple, Protocol::LL, Protocol::LL128};

// A buffer's length in units of `count`, the element count a call passes (CollDesc::count).
enum class Elements : uint8_t { Zero, Count, CountTimesWorld };
// nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md): busbw = algbw x factor, n ranks.
enum class BusBw : uint8_t { One, NMinus1OverN, TwoNMinus1OverN };

constexpr uint16_t algorithm_bit(Algorithm a) { return static_cast<uint16_t>(1u << static_cast<unsigned>(a)); }
constexpr uint16_t kRingTreeNaive =
    algorithm_bit(Algorithm::Ring) | algorithm_bit(Algorithm::Tree) | algorithm_bit(Algorithm::Naive);
constexpr uint16_t kAllReduceAlgorithms = kRingTreeNaive | algorithm_bit(Algorithm::DoubleTree) |
                                         algorithm_bit(Algorithm::Hierarchical) | algorithm_bit(Algorithm::InNetwork);

struct CollectiveTraits {
  CollectiveOp op;
  const char* name;          // PyTorch profiler's spelling: "allreduce", "reduce_scatter", "all_to_all"
  const char* display_name;  // prose: "all-reduce", "reduce-scatter"
  const char* short_name;    // one word, NCCL's op name in lower case: "reducescatter" (bench --op)
  const char* nccl_call;     // what the nccl backend calls: "ncclReduceScatter"
  uint16_t algorithms;       // algorithm_bit set of those it runs; 0: one fixed schedule, any choice is ignored
  Algorithm default_algorithm;  // what Default means unless the communicator is configured otherwise
  Elements in, out;          // input and output lengths (for one-buffer ops both are that buffer's)
  Elements payload;          // S, nccl-tests' size: the bytes algbw divides by the time
  bool out_of_place;         // reads `in` and writes `buf`; else works on one buffer
  bool reduces;              // applies a ReduceOp
  bool has_root;
  BusBw busbw;
  const char* explanation;   // one line: what the op leaves where

  constexpr bool runs(Algorithm a) const { return (algorithms & algorithm_bit(a)) != 0; }
  constexpr int64_t in_count(int64_t count, int world) const { return elements(in, count, world); }
  constexpr int64_t out_count(int64_t count, int world) const { return elements(out, count, world); }
  constexpr int64_t payload_count(int64_t count, int world) const { return elements(payload, count, world); }
  constexpr double busbw_factor(int n) const {
    if (busbw == BusBw::TwoNMinus1OverN) return 2.0 * (n - 1) / n;
    if (busbw == BusBw::NMinus1OverN) return static_cast<double>(n - 1) / n;
    return 1.0;
  }
  constexpr const char* busbw_formula() const {
    return busbw == BusBw::TwoNMinus1OverN ? "2(n-1)/n" : busbw == BusBw::NMinus1OverN ? "(n-1)/n" : "1";
  }

  static constexpr int64_t elements(Elements e, int64_t count, int world) {
    return e == Elements::Zero ? 0 : e == Elements::CountTimesWorld ? count * world : count;
  }
};

// One row per CollectiveOp, in enum order (checked below).
inline constexpr CollectiveTraits kCollectiveTable[] = {
    // op, name, display name, short name, NCCL call,
    //   algorithms, default, in, out, payload, out of place, reduces, has root, busbw, explanation
    {CollectiveOp::AllReduce, "allreduce", "all-reduce", "allreduce", "ncclAllReduce",
     kAllReduceAlgorithms, Algorithm::Ring, Elements::Count, Elements::Count, Elements::Count, false, true, false,
     BusBw::TwoNMinus1OverN, "in place: every rank ends with the reduction of all ranks' buffers"},
    {CollectiveOp::ReduceScatter, "reduce_scatter", "reduce-scatter", "reducescatter", "ncclReduceScatter",
     algorithm_bit(Algorithm::Ring), Algorithm::Ring, Elements::CountTimesWorld, Elements::Count,
     Elements::CountTimesWorld, true, true, false,
     BusBw::NMinus1OverN, "rank r ends with block r of the reduction of all ranks' inputs"},
    {CollectiveOp::AllGather, "allgather", "all-gather", "allgather", "ncclAllGather",
     algorithm_bit(Algorithm::Ring), Algorithm::Ring, Elements::Count, Elements::CountTimesWorld,
     Elements::CountTimesWorld, true, false, false,
     BusBw::NMinus1OverN, "every rank ends with all ranks' inputs, block r from rank r"},
    {CollectiveOp::Broadcast, "broadcast", "broadcast", "broadcast", "ncclBroadcast",
     algorithm_bit(Algorithm::Tree) | algorithm_bit(Algorithm::Naive), Algorithm::Tree, Elements::Count,
     Elements::Count, Elements::Count, false, false, true,
     BusBw::One, "the root's buffer is copied to every rank"},
    {CollectiveOp::Reduce, "reduce", "reduce", "reduce", "ncclReduce",
     algorithm_bit(Algorithm::Tree) | algorithm_bit(Algorithm::Naive), Algorithm::Tree, Elements::Count,
     Elements::Count, Elements::Count, false, true, true,
     BusBw::One, "the root ends with the reduction; the other ranks' buffers stay unchanged"},
    {CollectiveOp::Barrier, "barrier", "barrier", "barrier", "ncclAllReduce (of one float)",
     0, Algorithm::Ring, Elements::Count, Elements::Count, Elements::Zero, false, false, false,
     BusBw::One, "moves no data: no rank leaves before every rank has arrived"},
    {CollectiveOp::Send, "send", "send", "send", "ncclSend",
     0, Algorithm::Ring, Elements::Count, Elements::Count, Elements::Count, false, false, false,
     BusBw::One, "point to point: the buffer goes to one peer (buffered, the sender does not wait)"},
    {CollectiveOp::Recv, "recv", "recv", "recv", "ncclRecv",
     0, Algorithm::Ring, Elements::Count, Elements::Count, Elements::Count, false, false, false,
     BusBw::One, "point to point: the buffer is filled from one peer"},
    {CollectiveOp::AllToAll, "all_to_all", "all-to-all", "alltoall", "ncclSend/ncclRecv (one group)",
     static_cast<uint16_t>(algorithm_bit(Algorithm::Pairwise) | algorithm_bit(Algorithm::Grouped)), Algorithm::Pairwise, Elements::CountTimesWorld, Elements::CountTimesWorld, Elements::CountTimesWorld,
     true, false, false,
     BusBw::NMinus1OverN, "block j of rank i's input lands in block i of rank j's output"},
};

constexpr bool collective_table_in_enum_order() {
  for (size_t i = 0; i < std::size(kCollectiveTable); i++)
    if (static_cast<size_t>(kCollectiveTable[i].op) != i) return false;
  return true;
}
static_assert(collective_table_in_enum_order() &&
                  std::size(kCollectiveTable) == static_cast<size_t>(CollectiveOp::AllToAll) + 1,
              "kCollectiveTable needs one row per CollectiveOp, in enum order");

// What a value outside the enum (a corrupt wire message or trace) reads as: named "?", no reduction,
// no root, busbw factor 1, any algorithm accepted.
inline constexpr CollectiveTraits kUnknownCollective = {
    static_cast<CollectiveOp>(std::size(kCollectiveTable)), "?", "?", "?", "?", 0, Algorithm::Ring,
    Elements::Count, Elements::Count, Elements::Count, false, false, false, BusBw::One, "not a collective dtlab knows"};

constexpr std::span<const CollectiveTraits> collective_table() { return kCollectiveTable; }
constexpr const CollectiveTraits& collective_traits(CollectiveOp op) {
  const auto i = static_cast<size_t>(op);
  return i < std::size(kCollectiveTable) ? kCollectiveTable[i] : kUnknownCollective;
}
// The op whose PyTorch profiler name is `name` ("allreduce", "reduce_scatter", ...), if any.
std::optional<CollectiveOp> find_collective(std::string_view name);

// PyTorch profiler spellings ("allreduce", "reduce_scatter", "allgather", "broadcast", ...).
constexpr const char* collective_name(CollectiveOp op) { return collective_traits(op).name; }
// nccl-tests' busbw = algbw x factor: all-reduce 2(n-1)/n; reduce-scatter, all-gather and
// all-to-all (n-1)/n; the others 1.
constexpr double bus_bandwidth_factor(CollectiveOp op, int n) { return collective_traits(op).busbw_factor(n); }
// With the algorithm: what nccl-tests prints takes the op's factor whatever algorithm ran, an
// all-reduce reduced inside the network (NVLS, SHARP: Algorithm::InNetwork) included, so its busbw
// can pass the ring's bound. Only doc/PERFORMANCE.md mentions (n-1)/(n+1) for it; all_reduce_perf
// (src/all_reduce.cu, AllReduceGetBw) always applies 2(n-1)/n (docs/course_sources.md §6).
constexpr double bus_bandwidth_factor(CollectiveOp op, int n, Algorithm /*algo*/) { return bus_bandwidth_factor(op, n); }
// "default", "ring", "tree", "naive", "dbtree", "hierarchical", "nvls" (what --algo takes).
const char* algorithm_name(Algorithm a);
// Prose: "ring", "binomial tree", "naive", "double binary tree", "hierarchical", "in-network (NVLS/SHARP)".
const char* algorithm_display_name(Algorithm a);
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"
Algorithm parse_algorithm(std::string_view text);  // dtlab::Error on unknown names
const char* protocol_name(Protocol p);             // "default", "simple", "ll", "ll128"
Protocol parse_protocol(std::string_view text);    // dtlab::Error on unknown names
// The algorithms an op runs as a choice: "ring", "tree or naive", "ring, tree, naive, dbtree, ...".
std::string algorithm_choices(const CollectiveTraits& t);
// dtlab::Error unless the op runs that algorithm (the table's `algorithms`): all-reduce
// every one; reduce-scatter and all-gather ring; broadcast and reduce tree|naive; Default,
// and any choice for the ops with one fixed schedule, is always fine.
void check_algorithm(CollectiveOp op, Algorithm algo);

}  // namespace dtlab
