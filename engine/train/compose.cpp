#include "engine/train/compose.h"

#include "engine/core/check.h"
#include "engine/train/train.h"

namespace dtlab {

namespace {

// Two features (or a feature and a setting) that do not run together. `applies` says whether `c`
// holds the other side; the sentence is "FLAG with WITH: WHY; FIX".
struct Combination {
  Feature feature;
  const char* with;
  bool (*applies)(const TrainConfig& c);
  const char* why;
  const char* fix;
  bool pending;  // the engine does not run it yet
};

const Combination kCombinations[] = {
    {Feature::Moe, "an mlp model", [](const TrainConfig& c) { return !c.model.is_gpt(); },
     "it replaces a transformer block's MLP with experts behind a router", "use --model gpt (e.g. gpt-tiny)", false},
    {Feature::Moe, "--tp and no --sequence-parallel", [](const TrainConfig& c) { return c.tp > 1 && !c.sequence_parallel; },
     "Megatron-core's MoELayer refuses to train tensor-parallel without sequence parallelism (each TP rank routes its own positions "
     "to whole experts)",
     "add --sequence-parallel", false},
    {Feature::ContextParallel, "an mlp model", [](const TrainConfig& c) { return !c.model.is_gpt(); },
     "it splits a sequence's positions, and an MLP's samples have none", "use --model gpt (e.g. gpt-tiny)", false},
    {Feature::ExpertParallel, "--strategy fsdp --wrap model", [](const TrainConfig& c) { return c.strategy == Strategy::Fsdp && !c.fsdp.wrap_layers; },
     "each block's experts are a unit of their own, sharded over other ranks than the rest (torchtitan wraps moe.experts apart), "
     "which a whole-model unit cannot be",
     "drop --wrap model", false},
    {Feature::Join, "--ep", [](const TrainConfig& c) { return c.ep > 1; },
     "the experts' all-to-alls need a token count from every rank of the expert group, and the join hook shadows DDP's "
     "all-reduces only, so the others would wait for the joined rank in their next dispatch (torch's Join hangs there too)",
     "drop --join, or --ep", false},
    {Feature::SkipLayer, "--model gpt", [](const TrainConfig& c) { return c.model.is_gpt(); },
     "it bypasses one of the MLP's Linear layers (DDP's unused-parameters lesson)", "drop --skip-layer, or use an mlp model", false},
};

// What a refusal calls the feature in its sentence.
std::string flag_text(const TrainConfig& c, Feature f) {
  if (f == Feature::MixedPrecision && is_mixed(c.amp)) return std::string("--amp ") + precision_name(c.amp);
  if (f == Feature::MixedPrecision) return std::string("--precision ") + (is_mixed(c.precision) ? precision_name(c.precision) : "bf16");
  return feature_flag(f);
}

std::string sentence(const std::string& flag, const char* with, const char* why, const char* fix, bool pending) {
  return flag + " with " + with + ": " + (pending ? "not built yet, " : "") + why + "; " + fix;
}

}  // namespace

std::vector<Feature> features_used(const TrainConfig& c) {
  std::vector<Feature> f;
  if (c.model.is_gpt()) f.push_back(Feature::Gpt);
  if (c.world_size > 1) f.push_back(Feature::ManyRanks);
  if (c.backend == "socket" || c.launched) f.push_back(Feature::Launch);
  if (c.device == "cuda") f.push_back(Feature::Cuda);
  if (c.tp > 1) f.push_back(Feature::TensorParallel);
  if (c.sequence_parallel) f.push_back(Feature::SequenceParallel);
  if (c.lora.rank > 0) f.push_back(Feature::Lora);
  if (is_mixed(c.precision) || is_mixed(c.amp)) f.push_back(Feature::MixedPrecision);
  if (c.activation_checkpointing) f.push_back(Feature::Recompute);
  if (c.accum > 1) f.push_back(Feature::Accumulation);
  if (!c.save_sharded_path.empty()) f.push_back(Feature::SaveSharded);
  if (c.skip_layer >= 0) f.push_back(Feature::SkipLayer);
  if (!c.faults.empty()) f.push_back(Feature::Faults);
  if (c.clip_grad_norm > 0) f.push_back(Feature::ClipGradNorm);
  if (c.moe.on()) f.push_back(Feature::Moe);
  if (c.ep > 1) f.push_back(Feature::ExpertParallel);
  if (c.cp > 1) f.push_back(Feature::ContextParallel);
  if (c.join) f.push_back(Feature::Join);
  return f;
}

std::string feature_refusal(const TrainConfig& c, Feature f) {
  const Support& s = strategy_traits(c.strategy)[f];
  if (!s.ok)
    return sentence(flag_text(c, f), (std::string("--strategy ") + strategy_name(c.strategy)).c_str(), s.why, s.fix, s.pending);
  for (const Combination& k : kCombinations)
    if (k.feature == f && k.applies(c)) return sentence(flag_text(c, f), k.with, k.why, k.fix, k.pending);
  return {};
}

void check_composition(const TrainConfig& c) {
  for (Feature f : features_used(c)) {
    const std::string why = feature_refusal(c, f);
    if (!why.empty()) throw Error(why);
  }
}

std::vector<RefusalLine> all_refusals() {
  std::vector<RefusalLine> out;
  for (const StrategyTraits& t : strategy_table())
    for (int i = 0; i < kFeatureCount; i++) {
      const Support& s = t.features[static_cast<size_t>(i)];
      if (s.ok) continue;
      const Feature f = static_cast<Feature>(i);
      out.push_back({std::string(t.name) + " x " + feature_flag(f),
                     sentence(feature_flag(f), (std::string("--strategy ") + t.name).c_str(), s.why, s.fix, s.pending), s.pending});
    }
  for (const Combination& k : kCombinations)
    out.push_back({std::string(feature_flag(k.feature)) + " x " + k.with,
                   sentence(feature_flag(k.feature), k.with, k.why, k.fix, k.pending),
                   k.pending});
  return out;
}

}  // namespace dtlab
