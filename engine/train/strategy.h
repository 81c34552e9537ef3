// The training strategies as a type, and the one table of what each composes with.
//
// A strategy is how the ranks of one replica group share a training step (who holds which
// parameters, which collectives the step makes); the mesh dimensions (tp, sp) and the model
// techniques (mixed precision, LoRA, activation checkpointing, accumulation) are options laid over
// any strategy. Each strategy declares in its row of kStrategyTable which options it runs with; a
// refused option carries the reason, and validation (engine/train/train.cpp), the CLI's help, the
// lab's Run panel (a control greyed out with the reason) and lesson headers read the same row. The
// names ("ddp") are parsed once, here; everything else compares Strategy values.
//
// A refusal is only what PyTorch itself refuses or what the engine's design rules out, each with
// its sentence; docs/composition.md lists them.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dtlab {

enum class Strategy : uint8_t {
  Single,    // one rank, the reference every other strategy must match
  Ddp,       // torch.nn.parallel.DistributedDataParallel: replicas, gradients all-reduced in buckets
  Dp,        // torch.nn.DataParallel: one process drives every device (scatter, replicate, gather)
  Fsdp,      // FullyShardedDataParallel / ZeRO: parameters, gradients and optimizer state sharded
  Pipeline,  // torch.distributed.pipelining: stages on ranks, micro-batches through a schedule
};
inline constexpr int kStrategyCount = 5;

// An option of a run that a strategy runs with or refuses.
enum class Feature : uint8_t {
  TensorParallel,    // --tp > 1
  SequenceParallel,  // --sequence-parallel
  MixedPrecision,    // --precision bf16 | fp16
  Lora,              // --lora-rank
  Recompute,         // --activation-checkpointing
  Accumulation,      // --accum > 1
  ManyRanks,         // --world > 1
  Launch,            // one process per rank (dtlab-cli launch)
  Cuda,              // --device cuda
  SaveSharded,       // --save-sharded
  SkipLayer,         // --skip-layer (DDP's unused-parameters lesson)
  Faults,            // --fault
  Gpt,               // --model gpt (nanoGPT's GPT, engine/core/gpt.h)
  ClipGradNorm,      // --clip-grad-norm
  Moe,               // --moe (a GPT's mixture of experts)
  ExpertParallel,    // --ep > 1
  ContextParallel,   // --cp > 1
  Join,              // --join (torch's Join with DDP's join hook, for --uneven-rank)
};
inline constexpr int kFeatureCount = 18;

// A feature's support: ok, or the reason it is refused and what to do instead (two clauses
// of the sentence "FLAG with --strategy S: WHY; FIX").
struct Support {
  bool ok = true;
  const char* why = "";
  const char* fix = "";
  bool pending = false;  // refused only because the engine does not run it yet (a gap, not a rule)
};

struct StrategyTraits {
  Strategy kind;
  const char* name;     // the setting's value: "ddp"
  const char* torch;    // what it is in PyTorch: "DistributedDataParallel"
  const char* summary;  // one line for help texts and the Run panel
  std::array<Support, kFeatureCount> features;
  const Support& operator[](Feature f) const { return features[static_cast<size_t>(f)]; }
};

const StrategyTraits& strategy_traits(Strategy s);
const std::array<StrategyTraits, kStrategyCount>& strategy_table();
inline const char* strategy_name(Strategy s) { return strategy_traits(s).name; }
// dtlab::Error naming the strategies for anything else.
Strategy parse_strategy(const std::string& name);
// "single | ddp | dp | fsdp | pipeline"
std::string strategy_choices(const char* separator = " | ");

// The flag a user gives for `f` ("--tp", "--precision bf16").
const char* feature_flag(Feature f);
inline bool supports(Strategy s, Feature f) { return strategy_traits(s)[f].ok; }

}  // namespace dtlab
