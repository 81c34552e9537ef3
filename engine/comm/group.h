// Process groups: a Communicator over a subset of a parent communicator's ranks, as
// torch.distributed.new_group gives, for HYBRID_SHARD's node groups (shard inside a node,
// replicate across nodes). Any backend can host them: a group's collectives are ring algorithms
// (reduce-scatter, all-gather, all-reduce = both) and direct sends (broadcast, reduce, all-to-all)
// built on the parent's send/recv, each group on its own tag. In the trace they are collectives of
// their group: each records, in the parent's RankContext, a CollectiveIssue and a Collective span
// (CollectiveInfo::group names the group and its global ranks, `seq` counts the group's own
// collectives) and one RingStep per transfer (global src/dst), whose span is the transfer's on the
// modeled clock; the transfers themselves record no Send/Recv events (kGroupStepTag).
//
// One GroupExecutor thread per rank runs the operations of every group of that rank in the order
// the rank issued them. Since every rank issues its group operations in the same program order,
// no two groups can wait on each other (separate threads per group could interleave their sends
// and receives differently on two ranks and deadlock). Every wait is bounded by the parent's
// watchdog: a lost message fails the parent's recv, and the group's Work rethrows that diagnosis.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/device.h"

namespace dtlab {

class GroupExecutor {
 public:
  GroupExecutor();
  ~GroupExecutor();  // finishes the queued operations first
  GroupExecutor(const GroupExecutor&) = delete;
  GroupExecutor& operator=(const GroupExecutor&) = delete;
  // Runs fn on the executor thread after everything queued before it; the Work completes when fn
  // returns (its times are fn's result) and fails with fn's exception. Waiting for it moves `ctx`'s
  // compute clock to the op's end, as waiting for any collective does (ctx may be null).
  WorkPtr submit(uint64_t seq, std::function<WorkTimes()> fn, RankContext* ctx = nullptr);
  // Returns once everything submitted so far has run (bounded: every task's receives are under
  // the parent's watchdog). A group calls it before it dies, so no queued task outlives its group.
  void drain();

 private:
  void loop();
  struct Task;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a task is running
  std::condition_variable idle_cv_;
  std::thread thread_;
};

// Called on every rank of `ranks` (global ranks of the parent, in group-rank order; this rank must
// be one of them). `tag` must be distinct per group and unused by other sends between the same
// ranks. float32 (all-gather and broadcast also int64); algorithms: ring for reduce-scatter,
// all-gather and all-reduce. Buffers and the algorithms' scratch live on `device` (the rank's: the parent moves its memory), where the
// partial sums are added. On a GPU the executor thread enqueues those copies and additions on the
// rank's compute stream beside the rank's own work: a rank must not write a buffer it handed to a
// group operation until that operation's Work is waited for (FSDP and the pipeline never do).
// `name` ("tp0", "dp1") names the group in events and views; "" gives "group<tag>". `tag` must be
// below kGroupStepTag. A group of a group is a group of the world, on the members' world ranks, run by
// its parent's executor (`executor` is then not used).
std::unique_ptr<Communicator> new_group(Communicator& parent, std::vector<int> ranks, int tag,
                                        std::shared_ptr<GroupExecutor> executor, Device& device = cpu_device(),
                                        std::string name = "");

}  // namespace dtlab
