#include "engine/train/strategy.h"

#include "engine/core/check.h"

namespace dtlab {

namespace {

constexpr Support kOk{};
// A refusal PyTorch makes too, or that the strategy's design rules out.
constexpr Support no(const char* why, const char* fix) { return {false, why, fix, false}; }
// A combination the engine does not run yet.
constexpr Support todo(const char* why, const char* fix) { return {false, why, fix, true}; }

// Sharded checkpoints (engine/io/sharded_checkpoint.h): FSDP's shards, or each replicated parameter
// written once (torch's distributed checkpoint deduplicates replicas).
// The GPT under the strategies that cut the model by layers or replicate it from one process: the
// next parts of the transformer work.
constexpr Support kSkipIsDdps = no("it is DDP's unused-parameters lesson", "drop it, or use --strategy ddp");
// torch.distributed.algorithms.Join runs the join hooks of Joinable objects: DDP and
// ZeroRedundancyOptimizer are; FSDP and the pipeline schedules are not (docs/course_sources.md §19).
constexpr Support kJoinIsDdps = no("torch's Join shadows the collectives of a Joinable, and only DDP (and ZeroRedundancyOptimizer) is one",
                                   "use --strategy ddp --world N");

// The rows, in Strategy's order. Each column is one Feature, in Feature's order.
const std::array<StrategyTraits, kStrategyCount> kStrategyTable = {{
    {Strategy::Single, "single", "one process, no torch.distributed",
     "one rank: the reference every other strategy must match",
     {{
         /*TensorParallel*/ no("one rank has no group to split a layer across", "use --strategy ddp --world T --tp T (one replica in T shards)"),
         /*SequenceParallel*/ no("sequence parallelism splits activations across a tensor-parallel group", "use --strategy ddp --world T --tp T --sequence-parallel"),
         /*MixedPrecision*/ kOk,
         /*Lora*/ kOk,
         /*Recompute*/ kOk,
         /*Accumulation*/ kOk,
         /*ManyRanks*/ no("this strategy runs one rank", "drop --world, or use --strategy ddp"),
         /*Launch*/ no("one rank needs no launcher", "add --strategy ddp"),
         /*Cuda*/ kOk,
         /*SaveSharded*/ kOk,
         /*SkipLayer*/ kOk,
         /*Faults*/ no("faults are injected into the ranks' collectives, and one rank makes none", "use --strategy ddp (or fsdp) --world N"),
         /*Gpt*/ kOk,
         /*ClipGradNorm*/ kOk,
         /*Moe*/ kOk,
         /*ExpertParallel*/ no("one rank holds every expert", "use --strategy ddp --world N --ep N"),
         /*ContextParallel*/ no("one rank holds the whole sequence", "use --strategy ddp --world N --cp N"),
         /*Join*/ no("one rank has nobody to wait for when its data runs out", "use --strategy ddp --world N"),
     }}},
    {Strategy::Ddp, "ddp", "DistributedDataParallel",
     "replicas on N ranks, gradients all-reduced in buckets during backward",
     {{kOk, kOk, kOk, kOk, kOk, kOk, kOk, kOk, kOk, /*SaveSharded*/ kOk, kOk, kOk, /*Gpt*/ kOk, /*ClipGradNorm*/ kOk, /*Moe*/ kOk, /*ExpertParallel*/ kOk,
      /*ContextParallel*/ kOk, /*Join*/ kOk}}},
    {Strategy::Dp, "dp", "DataParallel",
     "one process drives N devices: scatter the batch, replicate the module, gather the outputs",
     {{
         /*TensorParallel*/ no("torch.nn.DataParallel replicates the whole module from one process and has no process groups to split it over", "use --strategy ddp (or fsdp) with --tp"),
         /*SequenceParallel*/ no("torch.nn.DataParallel has no tensor-parallel group", "use --strategy ddp with --tp and --sequence-parallel"),
         /*MixedPrecision*/ kOk,
         /*Lora*/ kOk,
         /*Recompute*/ kOk,
         /*Accumulation*/ kOk,
         /*ManyRanks*/ kOk,
         /*Launch*/ no("torch.nn.DataParallel drives every device from one process, so it cannot run one process per rank", "use --strategy ddp under dtlab-cli launch"),
         /*Cuda*/ kOk,
         /*SaveSharded*/ no("torch.nn.DataParallel keeps its one module in one process, which --save writes whole",
                            "use --save for one full checkpoint, or --strategy ddp"),
         /*SkipLayer*/ kSkipIsDdps,
         /*Faults*/ kOk,
         /*Gpt*/ kOk,
         /*ClipGradNorm*/ kOk,
         /*Moe*/ no("torch.nn.DataParallel throws its module replicas away after forward, so the load-balancing loss each "
                    "replica's router computes never reaches the loss (Megatron-core's MoE trains under DDP)",
                    "use --strategy ddp (or fsdp)"),
         /*ExpertParallel*/ no("torch.nn.DataParallel has no process groups to split the experts over", "use --strategy ddp with --ep"),
         /*ContextParallel*/ no("torch.nn.DataParallel has no process groups for the ring's sends", "use --strategy ddp (or fsdp) with --cp"),
         /*Join*/ no("torch.nn.DataParallel splits one batch from one process, so no rank's data runs out before another's",
                     "use --strategy ddp --world N"),
     }}},
    {Strategy::Fsdp, "fsdp", "FullyShardedDataParallel",
     "parameters, gradients and optimizer state sharded over N ranks (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, ZeRO-1)",
     {{
         kOk, kOk,
         /*MixedPrecision*/ kOk,
         kOk, kOk,
         /*Accumulation*/ kOk,
         kOk, kOk, kOk, kOk, kOk, kOk,
         /*Gpt*/ kOk,
         /*ClipGradNorm*/ kOk,
         /*Moe*/ kOk,
         /*ExpertParallel*/ kOk,
         /*ContextParallel*/ kOk,
         /*Join*/ kJoinIsDdps,
     }}},
    {Strategy::Pipeline, "pipeline", "torch.distributed.pipelining",
     "the model cut into stages on p ranks, micro-batches flowing through a schedule (GPipe, 1F1B, interleaved, ZB-H1)",
     {{
         /*TensorParallel*/ kOk,
         /*SequenceParallel*/ kOk,
         /*MixedPrecision*/ kOk,
         /*Lora*/ kOk,
         /*Recompute*/ kOk,
         /*Accumulation*/ no("the micro-batches are the pipeline's accumulation", "use --microbatches"),
         kOk, kOk, kOk,
         /*SaveSharded*/ kOk,
         /*SkipLayer*/ kSkipIsDdps,
         kOk,
         /*Gpt*/ kOk,
         /*ClipGradNorm*/ kOk,
         /*Moe*/ kOk,
         /*ExpertParallel*/ kOk,
         /*ContextParallel*/ kOk,
         /*Join*/ kJoinIsDdps,
     }}},
}};

constexpr const char* kFeatureFlags[kFeatureCount] = {
    "--tp", "--sequence-parallel", "--precision", "--lora-rank", "--activation-checkpointing", "--accum",
    "--world", "dtlab-cli launch", "--device cuda", "--save-sharded", "--skip-layer", "--fault", "--model gpt", "--clip-grad-norm", "--moe", "--ep", "--cp", "--join",
};

}  // namespace

const std::array<StrategyTraits, kStrategyCount>& strategy_table() { return kStrategyTable; }

const StrategyTraits& strategy_traits(Strategy s) {
  const StrategyTraits& t = kStrategyTable[static_cast<size_t>(s)];
  DTLAB_CHECK(t.kind == s, "the strategy table's rows are out of order");
  return t;
}

std::string strategy_choices(const char* separator) {
  std::string out;
  for (const StrategyTraits& t : kStrategyTable) out += (out.empty() ? "" : separator) + std::string(t.name);
  return out;
}

Strategy parse_strategy(const std::string& name) {
  for (const StrategyTraits& t : kStrategyTable)
    if (name == t.name) return t.kind;
  throw Error("--strategy '" + name + "' is not a strategy; use " + strategy_choices(", "));
}

const char* feature_flag(Feature f) { return kFeatureFlags[static_cast<size_t>(f)]; }

}  // namespace dtlab
