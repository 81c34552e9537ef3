#include "engine/train/settings.h"

#include <climits>
#include <cmath>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/ddp.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/pipeline.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/tuning.h"
#include "engine/train/setting_fields.h"

namespace dtlab {

using nlohmann::json;

namespace {

using namespace setting_fields;

#define DTLAB_FIELD(path) [](auto& c) -> auto& { return c.path; }

constexpr double kNoLimit = 1e300;

// torch: bucket_cap_mb * 1024 * 1024 bytes (MB means MiB, as in torch).
int64_t mib_to_bytes(const char* flag, const std::string& text) {
  const double bytes = from_text<double>(flag, text) * 1048576.0;
  if (bytes < 1) throw Error(std::string(flag) + " is too small: a bucket must hold at least 1 byte");
  return static_cast<int64_t>(bytes);
}
SettingValue bytes_to_mib(int64_t bytes) { return {number_text(static_cast<double>(bytes) / 1048576.0)}; }

std::string fault_text(const Fault& f) {
  std::string s = std::string(f.kind == FaultKind::Skip ? "skip" : "delay") + ":rank=" + std::to_string(f.rank) +
                  ",collective=" + std::to_string(f.seq);
  if (f.kind == FaultKind::Delay) s += ",ms=" + std::to_string(std::llround(f.delay_s * 1000.0));
  return s;
}

FaultKind parse_fault_kind(const std::string& kind) {
  if (kind != "skip" && kind != "delay") throw Error("the run configuration's fault kind '" + kind + "' is not skip or delay");
  return kind == "skip" ? FaultKind::Skip : FaultKind::Delay;
}

using G = SettingGroup;
using T = SettingType;
constexpr SettingScope kBoth = SettingScope::Both, kCli = SettingScope::Cli, kJson = SettingScope::Json;

// One row's declaration: flag, JSON key, type, group, scope, help; then range, default shown, example.
Setting row(const char* flag, const char* key, T type, G group, SettingScope scope, std::string help, double min = 0,
            double max = 0, bool show_default = false, const char* example = "") {
  Setting s{};
  s.flag = flag, s.key = key, s.type = type, s.group = group, s.scope = scope, s.help = std::move(help);
  s.min = min, s.max = max, s.show_default = show_default, s.example = example;
  return s;
}

Setting faults_row() {
  Setting s = row("--fault", "faults", T::TextList, G::Faults, kBoth,
                  "Inject a fault: skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M (repeatable)", 0, 0, false,
                  "delay:rank=1,collective=2,ms=500");
  s.get = [](const TrainConfig& c) {
    SettingValue v;
    for (const Fault& f : c.faults) v.push_back(fault_text(f));
    return v;
  };
  s.set = [](TrainConfig& c, const SettingValue& v) {
    c.faults.clear();
    for (const std::string& text : v) c.faults.push_back(parse_fault(text));
  };
  s.to_json = [](const TrainConfig& c, json& out) {
    out = json::array();
    for (const Fault& f : c.faults)
      out.push_back({{"kind", f.kind == FaultKind::Skip ? "skip" : "delay"}, {"rank", f.rank}, {"seq", f.seq}, {"delay_s", f.delay_s}});
  };
  s.from_json = [](TrainConfig& c, const json& j) {
    if (!j.is_array()) throw Error(field_error("faults", "must be a list of faults"));
    c.faults.clear();
    for (const json& e : j) {
      if (!e.is_object()) throw Error(field_error("faults", "must be a list of objects"));
      Fault f;
      std::string kind = "skip";
      if (e.contains("kind")) read_json(e["kind"], "faults.kind", kind);
      f.kind = parse_fault_kind(kind);
      if (e.contains("rank")) read_json(e["rank"], "faults.rank", f.rank);
      if (e.contains("seq")) read_json(e["seq"], "faults.seq", f.seq);
      if (e.contains("delay_s")) read_json(e["delay_s"], "faults.delay_s", f.delay_s);
      c.faults.push_back(f);
    }
  };
  return s;
}

// --unit-costs sets pipeline.fixed_costs; JSON carries any fixed costs (tests set unequal ones).
Setting unit_costs_row() {
  Setting s = row("--unit-costs", "pipeline.fixed_costs", T::Flag, G::Pipeline, kBoth,
                  "Pipeline: every F, B, I and W costs 1 ms of modeled time (equal stages; with --profile ideal the "
                  "measured bubbles equal the formulas)",
                  0, 0, false, "true");
  s.get = [](const TrainConfig& c) { return SettingValue{c.pipeline.fixed_costs ? "true" : "false"}; };
  s.set = [](TrainConfig& c, const SettingValue& v) {
    if (from_text<bool>("--unit-costs", one_item("--unit-costs", v)))
      c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
    else
      c.pipeline.fixed_costs.reset();
  };
  s.to_json = [](const TrainConfig& c, json& out) {
    if (const auto& a = c.pipeline.fixed_costs)
      out = {{"forward", a->forward}, {"backward", a->backward}, {"backward_input", a->backward_input},
             {"backward_weight", a->backward_weight}, {"hop_latency", a->hop_latency}};
  };
  s.from_json = [](TrainConfig& c, const json& j) {
    if (!j.is_object()) throw Error(field_error("pipeline.fixed_costs", "must be an object of action costs"));
    ActionCosts a;
    const std::pair<const char*, double*> parts[] = {{"forward", &a.forward}, {"backward", &a.backward},
                                                     {"backward_input", &a.backward_input},
                                                     {"backward_weight", &a.backward_weight}, {"hop_latency", &a.hop_latency}};
    for (const auto& [key, v] : parts)
      if (j.contains(key)) read_json(j[key], key, *v);
    c.pipeline.fixed_costs = a;
  };
  return s;
}

std::string strategy_help() {
  std::string help = "Parallel strategy:";  // the strategies' table rows (engine/train/strategy.h)
  for (const StrategyTraits& t : strategy_table()) help += std::string("\n  ") + t.name + ": " + t.summary + " (" + t.torch + ")";
  return help;
}

std::vector<Setting> make_settings() {
  std::vector<Setting> s;
  const double kInt = INT_MAX;
  // A LoRA rank is the adapter's inner width: far below any layer this engine trains. A bound keeps
  // --lora-rank 2147483647 a range sentence, not an allocation that fails as "out of memory".
  const double kMaxLoraRank = 65536;
  // Run: what trains, on how many ranks, for how long.
  s.push_back(named(row("--strategy", "strategy", T::Choice, G::Run, kBoth, strategy_help(), 0, 0, true, "ddp"),
                    DTLAB_FIELD(strategy), strategy_name, parse_strategy));
  s.push_back(field(row("--world", "world_size", T::Int, G::Run, kBoth, "Number of ranks (for strategies that use several)", 1,
                        kMaxRanks, true, "3"),
                    DTLAB_FIELD(world_size)));
  s.push_back(named(row("--model", "model", T::Text, G::Run, kBoth,
                        "Model: mlp:D0,D1,...,Dk (layer widths), a preset tiny | small | deep | wide, or nanoGPT's GPT: gpt:layers=L,heads=H,embd=C,ctx=T | gpt-tiny | gpt2-124m", 0, 0, true, "mlp:2,8,3"),
                    DTLAB_FIELD(model), [](const ModelSpec& m) { return m.str(); },
                    [](const std::string& text) { return ModelSpec::parse(model_preset_spec(text)); }));
  s.push_back(field(row("--data", "data", T::Text, G::Run, kBoth,
                        "spiral | blobs | text[:PATH] (a GPT's characters) | PATH.npz (with options, e.g. spiral:classes=4,points=500)", 0, 0, true, "blobs"),
                    DTLAB_FIELD(data)));
  s.push_back(field(row("--batch", "batch", T::Int, G::Run, kBoth, "Batch size per rank", 1, 1 << 20, true, "7"), DTLAB_FIELD(batch)));
  s.push_back(field(row("--steps", "steps", T::Int, G::Run, kBoth, "Number of optimizer steps", 1, static_cast<double>(int64_t{1} << 40),
                        true, "5"),
                    DTLAB_FIELD(steps)));
  s.push_back(field(row("--accum", "accum", T::Int, G::Run, kBoth,
                        "Gradient accumulation: micro-batches per optimizer step (DDP's no_sync for all but the last)", 1, 1 << 20,
                        true, "2"),
                    DTLAB_FIELD(accum)));
  // --optimizer starts from the optimizer's defaults; the rows after it (--lr, --momentum) refine them.
  s.push_back(named(row("--optimizer", "optimizer.kind", T::Choice, G::Run, kBoth, "sgd | adamw", 0, 0, true, "sgd"),
                    DTLAB_FIELD(optimizer), [](const OptimizerConfig& o) { return optimizer_name(o.kind); },
                    [](const std::string& text) { return default_optimizer_config(parse_optimizer_kind(text)); }));
  // named() above writes the whole OptimizerConfig; JSON keeps only the kind under this key.
  s.back().to_json = [](const TrainConfig& c, json& out) { out = optimizer_name(c.optimizer.kind); };
  s.back().from_json = [](TrainConfig& c, const json& j) {
    std::string text;
    read_json(j, "optimizer.kind", text);
    c.optimizer.kind = parse_optimizer_kind(text);
  };
  s.push_back(field(row("--lr", "optimizer.lr", T::Real, G::Run, kBoth, "Learning rate (default 0.1 for sgd, 0.01 for adamw)", 1e-12,
                        1e6, false, "0.05"),
                    DTLAB_FIELD(optimizer.lr)));
  s.push_back(field(row("--clip-grad-norm", "clip_grad_norm", T::Real, G::Run, kBoth,
                        "Clip the gradients to this total 2-norm before every optimizer step (torch.nn.utils.clip_grad_norm_, "
                        "norm over the whole model however it is sharded; 0: off)",
                        0, 1e6, false, "0.5"),
                    DTLAB_FIELD(clip_grad_norm)));

  // DDP
  s.push_back(converted(row("--bucket-cap-mb", "ddp.bucket_cap_bytes", T::Real, G::Ddp, kBoth,
                            "DDP bucket cap in MiB (torch's bucket_cap_mb)", 0, 1e6, true, "2"),
                        DTLAB_FIELD(ddp.bucket_cap_bytes), [](const TrainConfig& c) { return bytes_to_mib(c.ddp.bucket_cap_bytes); },
                        [](TrainConfig& c, const std::string& text) {
                          // Current torch: an explicit bucket_cap_mb makes the first bucket as large as the
                          // others; --first-bucket-mb, a later row, plays dist._DEFAULT_FIRST_BUCKET_BYTES.
                          c.ddp.bucket_cap_bytes = c.ddp.first_bucket_bytes = mib_to_bytes("--bucket-cap-mb", text);
                        }));
  s.push_back(converted(row("--first-bucket-mb", "ddp.first_bucket_bytes", T::Real, G::Ddp, kBoth,
                            "DDP first bucket cap in MiB (with only --bucket-cap-mb given, the cap, as torch)", 0, 1e6, true, "0.5"),
                        DTLAB_FIELD(ddp.first_bucket_bytes),
                        [](const TrainConfig& c) { return bytes_to_mib(c.ddp.first_bucket_bytes); },
                        [](TrainConfig& c, const std::string& text) { c.ddp.first_bucket_bytes = mib_to_bytes("--first-bucket-mb", text); }));
  s.push_back(field(row("--sized-first-iteration", "ddp.sized_first_iteration", T::Flag, G::Ddp, kBoth,
                        "DDP: sized buckets in iteration 1 too (torch uses one bucket there unless --find-unused-parameters)", 0, 0,
                        false, "true"),
                    DTLAB_FIELD(ddp.sized_first_iteration)));
  s.push_back(named(row("--comm-hook", "ddp.comm_hook", T::Choice, G::Ddp, kBoth,
                        "DDP communication hook (torch's register_comm_hook): none | fp16 | bf16 (fp16_compress_hook, "
                        "bf16_compress_hook: each bucket cast to 16 bits, divided by the world size, all-reduced, cast back) | "
                        "topk:ratio=F (top-k sparsification with error feedback: each rank all-gathers its ceil(F n) largest "
                        "entries and their indices) | powersgd:rank=R,start=S (powerSGD_hook: each gradient matrix all-reduced "
                        "as rank-R factors P and Q from iteration S, with error feedback); add ,error_feedback=false to topk or "
                        "powersgd to drop what was not sent (torch's use_error_feedback=False)",
                        0, 0, false, "fp16"),
                    DTLAB_FIELD(ddp.comm_hook), comm_hook_text, parse_comm_hook));
  s.push_back(field(row("--find-unused-parameters", "ddp.find_unused_parameters", T::Flag, G::Ddp, kBoth,
                        "DDP marks parameters the forward did not use as ready, and all-reduces which ones each rank used", 0, 0,
                        false, "true"),
                    DTLAB_FIELD(ddp.find_unused_parameters)));
  s.push_back(converted(row("--uneven-rank", "uneven_rank", T::Int, G::Ddp, kBoth,
                            "Uneven inputs: this rank's data runs out one step before the others' (under --tp or --cp its whole "
                            "replica's; without --join the others wait in their next all-reduce until --timeout)",
                            0, kMaxRanks - 1, false, "1"),
                        DTLAB_FIELD(uneven_rank),
                        [](const TrainConfig& c) { return c.uneven_rank >= 0 ? SettingValue{std::to_string(c.uneven_rank)} : SettingValue{}; },
                        [](TrainConfig& c, const std::string& text) { c.uneven_rank = from_text<int>("--uneven-rank", text); }));
  s.push_back(field(row("--join", "join", T::Flag, G::Ddp, kBoth,
                        "torch.distributed.algorithms.Join: a rank whose data ran out shadows the others' all-reduces with zeros "
                        "(DDP's join hook; the average still divides by the whole world)",
                        0, 0, false, "true"),
                    DTLAB_FIELD(join)));

  // FSDP
  s.push_back(named(row("--sharding", "fsdp.sharding", T::Choice, G::Fsdp, kBoth, "FSDP: full | grad-op | no-shard | hybrid | zero1", 0,
                        0, true, "grad-op"),
                    DTLAB_FIELD(fsdp.sharding), sharding_flag, [](const std::string& t) { return parse_sharding(t); }));
  s.push_back(converted(row("--fsdp-api", "fsdp.api", T::Choice, G::Fsdp, kBoth,
                            "FSDP: 1 (FullyShardedDataParallel: each unit one flat parameter) | 2 (fully_shard: each parameter "
                            "its own Shard(0) DTensor, padded on its own)",
                            0, 0, true, "2"),
                        DTLAB_FIELD(fsdp.api), [](const TrainConfig& c) { return SettingValue{std::to_string(c.fsdp.api)}; },
                        [](TrainConfig& c, const std::string& text) {
                          if (text != "1" && text != "2")
                            throw Error("--fsdp-api " + text + " is not an FSDP API; use 1 (FullyShardedDataParallel) or 2 (fully_shard)");
                          c.fsdp.api = text == "1" ? 1 : 2;
                        }));
  s.push_back(converted(row("--reshard-after-forward", "fsdp.reshard_after_forward", T::Text, G::Fsdp, kBoth,
                            "FSDP2: true (free a unit's parameters after its forward) | false (keep them for its backward, "
                            "SHARD_GRAD_OP's memory) | N (keep a 1/N shard; the backward all-gathers inside groups of N ranks)",
                            0, 0, true, "2"),
                        DTLAB_FIELD(fsdp.reshard_after_forward),
                        [](const TrainConfig& c) { return SettingValue{reshard_after_forward_text(c.fsdp.reshard_after_forward)}; },
                        [](TrainConfig& c, const std::string& text) {
                          c.fsdp.reshard_after_forward = parse_reshard_after_forward(text);
                        }));
  s.push_back(field(row("--prefetch", "fsdp.prefetch", T::Int, G::Fsdp, kBoth,
                        "FSDP2: units gathered ahead, as set_modules_to_forward_prefetch / set_modules_to_backward_prefetch "
                        "name them (forward with --forward-prefetch; backward with --backward-prefetch pre)",
                        1, 64, true, "2"),
                    DTLAB_FIELD(fsdp.prefetch)));
  s.push_back(converted(row("--node-size", "fsdp.node_size", T::Int, G::Fsdp, kBoth,
                            "FSDP hybrid: ranks per shard group (default: the profile's ranks per node)", 1, kMaxRanks, false, "2"),
                        DTLAB_FIELD(fsdp.node_size),
                        [](const TrainConfig& c) { return c.fsdp.node_size > 0 ? SettingValue{std::to_string(c.fsdp.node_size)} : SettingValue{}; },
                        [](TrainConfig& c, const std::string& text) {
                          if (c.fsdp.sharding != Sharding::Hybrid) throw Error("--node-size sets HYBRID_SHARD's shard group; add --sharding hybrid");
                          c.fsdp.node_size = from_text<int>("--node-size", text);
                        }));
  s.push_back(converted(row("--wrap", "fsdp.wrap_layers", T::Choice, G::Fsdp, kBoth, "FSDP units: layer (one per Linear) | model", 0, 0,
                            true, "model"),
                        DTLAB_FIELD(fsdp.wrap_layers),
                        [](const TrainConfig& c) { return SettingValue{c.fsdp.wrap_layers ? "layer" : "model"}; },
                        [](TrainConfig& c, const std::string& text) {
                          if (text != "layer" && text != "model")
                            throw Error("--wrap " + text + " is not a wrap policy; use layer (one unit per Linear) or model");
                          c.fsdp.wrap_layers = text == "layer";
                        }));
  s.push_back(named(row("--backward-prefetch", "fsdp.backward_prefetch", T::Choice, G::Fsdp, kBoth,
                        "FSDP: none | pre (BACKWARD_PRE) | post (BACKWARD_POST)", 0, 0, true, "post"),
                    DTLAB_FIELD(fsdp.backward_prefetch),
                    [](BackwardPrefetch p) { return p == BackwardPrefetch::None ? "none" : p == BackwardPrefetch::Pre ? "pre" : "post"; },
                    [](const std::string& t) { return parse_backward_prefetch(t); }));
  s.push_back(field(row("--forward-prefetch", "fsdp.forward_prefetch", T::Flag, G::Fsdp, kBoth,
                        "FSDP: gather the next unit during this unit's forward", 0, 0, false, "true"),
                    DTLAB_FIELD(fsdp.forward_prefetch)));

  // Pipeline
  s.push_back(field(row("--stages", "pipeline.stages", T::Int, G::Pipeline, kBoth,
                        "Pipeline: ranks per pipeline, p (the model is cut into p x --chunks stages)", 1, kMaxRanks, true, "3"),
                    DTLAB_FIELD(pipeline.stages)));
  s.push_back(field(row("--microbatches", "pipeline.microbatches", T::Int, G::Pipeline, kBoth,
                        "Pipeline: micro-batches per batch, m (--batch must be a multiple)", 1, 4096, true, "8"),
                    DTLAB_FIELD(pipeline.microbatches)));
  s.push_back(named(row("--schedule", "pipeline.schedule", T::Choice, G::Pipeline, kBoth,
                        "Pipeline schedule: gpipe | 1f1b | interleaved | zb-h1", 0, 0, true, "zb-h1"),
                    DTLAB_FIELD(pipeline.schedule), schedule_kind_flag, [](const std::string& t) { return parse_schedule_kind(t); }));
  s.push_back(field(row("--chunks", "pipeline.chunks", T::Int, G::Pipeline, kBoth, "Pipeline: stages per rank, v (interleaved)", 1,
                        kMaxRanks, true, "2"),
                    DTLAB_FIELD(pipeline.chunks)));
  s.push_back(field(row("--dp", "pipeline.dp", T::Int, G::Pipeline, kBoth,
                        "Pipeline: data-parallel replicas, D (world = stages x dp x cp x tp; rank = ((replica x cp + cp rank) x p + stage rank) x tp + tp rank)",
                        1, kMaxRanks, true, "2"),
                    DTLAB_FIELD(pipeline.dp)));
  s.push_back(converted(row("--split", "pipeline.split", T::Text, G::Pipeline, kBoth,
                            "Pipeline: Linear layers per stage, e.g. 2,2,1 (default: balanced by parameter count)", 0, 0, false, "1,2"),
                        DTLAB_FIELD(pipeline.split),
                        [](const TrainConfig& c) {
                          std::vector<std::string> parts;
                          for (int n : c.pipeline.split) parts.push_back(std::to_string(n));
                          return parts.empty() ? SettingValue{} : SettingValue{join(parts, ",")};
                        },
                        [](TrainConfig& c, const std::string& text) { c.pipeline.split = parse_split(text); }));
  s.push_back(unit_costs_row());

  // The model's branch, the loss's guard
  s.push_back(converted(row("--skip-layer", "skip_layer", T::Int, G::Run, kBoth,
                            "Model branch: bypass this square Linear (Sequential index) on every --skip-every-th step", 0, 1 << 20,
                            false, "2"),
                        DTLAB_FIELD(skip_layer),
                        [](const TrainConfig& c) { return c.skip_layer < 0 ? SettingValue{} : SettingValue{std::to_string(c.skip_layer)}; },
                        [](TrainConfig& c, const std::string& text) { c.skip_layer = from_text<int>("--skip-layer", text); }));
  s.push_back(field(row("--skip-every", "skip_every", T::Int, G::Run, kBoth, "Period of the --skip-layer branch in steps", 1,
                        static_cast<double>(int64_t{1} << 40), true, "3"),
                    DTLAB_FIELD(skip_every)));
  s.push_back(field(row("--skip-ranks", "skip_ranks", T::IntList, G::Run, kBoth,
                        "Ranks whose forward takes the --skip-layer branch, e.g. 1,3 (default: every rank)", 0, kMaxRanks - 1, false,
                        "1,3"),
                    DTLAB_FIELD(skip_ranks)));
  s.push_back(field(row("--eval-samples", "eval_samples", T::Int, G::Run, kBoth,
                        "The final evaluation's samples: the training set's first N (default 0: every one)", 0,
                        static_cast<double>(int64_t{1} << 40), false, "256"),
                    DTLAB_FIELD(eval_samples)));
  s.push_back(field(row("--allow-nonfinite", "allow_nonfinite", T::Flag, G::Run, kBoth,
                        "Train on when the loss becomes NaN or infinite (default: stop at that step, naming the rank and the first "
                        "non-finite layer)", 0, 0, false, "true"),
                    DTLAB_FIELD(allow_nonfinite)));
  s.push_back(faults_row());

  // Communication: the modeled hardware and the collectives' algorithm
  s.push_back(field(row("--profile", "profile", T::Text, G::Comm, kBoth,
                        "Hardware profile of the modeled clock: " + join(profile_names(), ", ") + " (ideal: free communication)", 0, 0,
                        true, "ideal"),
                    DTLAB_FIELD(profile)));
  s.push_back(named(row("--algo", "algo", T::Choice, G::Comm, kBoth,
                        "All-reduce algorithm (NCCL_ALGO): ring (default) | tree | naive | dbtree | hierarchical | nvls | auto (the "
                        "tuning model's pick per call, from its bytes, the profile and the world)", 0, 0, false, "tree"),
                    DTLAB_FIELD(algo), algorithm_choice_name, [](const std::string& t) { return parse_algorithm_choice(t); }));
  s.push_back(named(row("--proto", "proto", T::Choice, G::Comm, kBoth,
                        "Protocol (NCCL_PROTO): auto (default: the tuning model's pick) | simple | ll | ll128", 0, 0, false, "ll128"),
                    DTLAB_FIELD(proto), protocol_choice_name, [](const std::string& t) { return parse_protocol_choice(t); }));
  s.push_back(named(row("--alltoall", "alltoall", T::Choice, G::Comm, kBoth,
                        "All-to-all algorithm (--ep's dispatch and combine, Ulysses'): pairwise (default: n-1 rounds, each rank "
                        "sending to one peer a round, a step each) | grouped (NCCL's: every send and receive in one group, one step)",
                        0, 0, false, "grouped"),
                    DTLAB_FIELD(alltoall_algo), algorithm_name, [](const std::string& t) {
                      if (t == "pairwise" || t == "default") return Algorithm::Pairwise;
                      if (t == "grouped") return Algorithm::Grouped;
                      throw Error("--alltoall '" + t + "' is not an all-to-all algorithm; use pairwise or grouped");
                    }));

  // Mesh
  s.push_back(field(row("--tp", "tp", T::Int, G::Mesh, kBoth,
                        "Tensor parallelism: ranks per TP group, Megatron's column/row split of each Linear pair (world = dp x stages "
                        "x tp, tp fastest as torch's init_device_mesh)", 1, kMaxRanks, true, "2"),
                    DTLAB_FIELD(tp)));
  s.push_back(field(row("--sequence-parallel", "sequence_parallel", T::Flag, G::Mesh, kBoth,
                        "With --tp: activations outside the Linear pairs split by rows; the all-reduces become reduce-scatter + "
                        "all-gather", 0, 0, false, "true"),
                    DTLAB_FIELD(sequence_parallel)));
  s.push_back(named(row("--moe", "moe", T::Text, G::Mesh, kBoth,
                            "A GPT's MLP as a mixture of experts (Megatron-core's router): experts=E,top_k=K[,capacity=F]"
                            "[,every=N][,aux=A]; capacity F drops the tokens past ceil(tokens x K / E x F) per expert, every=2 "
                            "puts it in blocks 0, 2, ...; aux is the load-balancing loss's coefficient (0.01)",
                            0, 0, false, "experts=4,top_k=2"),
                    DTLAB_FIELD(moe), [](const MoeSpec& m) { return m.str(); },
                    [](const std::string& text) { return text.empty() ? MoeSpec{} : MoeSpec::parse(text); }));
  s.push_back(field(row("--ep", "ep", T::Int, G::Mesh, kBoth,
                        "Expert parallelism (with --moe, --strategy ddp, fsdp or pipeline): each MoE block's experts split over groups of "
                        "EP consecutive ranks (a pipeline: of a stage's replicas); tokens reach their experts by all-to-all, expert "
                        "gradients are reduced over the ranks holding the same experts (fsdp: which shard them)", 1, kMaxRanks, true, "2"),
                    DTLAB_FIELD(ep)));
  s.push_back(field(row("--cp", "cp", T::Int, G::Mesh, kBoth,
                        "Context parallelism (a GPT, --strategy ddp, fsdp or pipeline): each sample's positions split over groups of CP ranks "
                        "that read the same batches; attention meets the others' keys by ring steps or all-to-alls (--cp-layout)",
                        1, kMaxRanks, true, "2"),
                    DTLAB_FIELD(cp)));
  s.push_back(named(row("--cp-layout", "cp_layout", T::Choice, G::Mesh, kBoth,
                        "With --cp: ring (contiguous chunks, K/V blocks around the ring) | zigzag (chunks r and 2c-1-r: the causal "
                        "work balanced) | ulysses (all-to-alls to a head split; heads must divide by cp)",
                        0, 0, false, "zigzag"),
                    DTLAB_FIELD(cp_layout), cp_layout_name, [](const std::string& t) { return parse_cp_layout(t); }));

  s.push_back(field(row("--seed", "seed", T::Int, G::Run, kBoth, "Seed for the model init (torch.manual_seed) and the sampler", 0,
                        4294967295.0, true, "7"),
                    DTLAB_FIELD(seed)));
  s.push_back(field(row("--timeout", "timeout_s", T::Real, G::Comm, kBoth,
                        "Watchdog: seconds before a stuck collective or DDP bucket fails, diagnosed", 0.001, 1e6, true, "5"),
                    DTLAB_FIELD(timeout_s)));
  // Placement: what was asked; cli's choose_device resolves it (and checks the names) after parsing.
  s.push_back(field(row("--device", "device", T::Text, G::Placement, kBoth,
                        "cpu | cuda (default: cuda when a GPU is present, else cpu; DTLAB_DEVICE sets it)", 0, 0, false, "cuda"),
                    DTLAB_FIELD(device)));
  s.push_back(field(row("--backend", "backend", T::Text, G::Placement, kBoth,
                        "Where ranks run: threads (all in this process) | cuda (threads sharing a GPU) | nccl (one GPU per rank) | "
                        "socket (one process per rank, as dtlab-cli launch starts them); default: nccl with a GPU per rank, cuda "
                        "with fewer GPUs, else threads", 0, 0, false, "nccl"),
                    DTLAB_FIELD(backend)));
  s.push_back(field(row("--activation-checkpointing", "activation_checkpointing", T::Flag, G::Run, kBoth,
                        "torch.utils.checkpoint per Linear+ReLU block: forward keeps only block inputs, backward recomputes each "
                        "block first (same results, less activation memory, more compute)", 0, 0, false, "true"),
                    DTLAB_FIELD(activation_checkpointing)));

  // LoRA (peft's LoraConfig: r, lora_alpha default 8, adapters on every Linear (a GPT's c_attn) unless listed;
  // docs/course_sources.md §6d)
  s.push_back(field(row("--lora-rank", "lora.rank", T::Int, G::Lora, kBoth,
                        "LoRA: adapter rank r; freezes the base weights and trains only the adapters", 0, kMaxLoraRank, false, "2"),
                    DTLAB_FIELD(lora.rank)));
  s.push_back(field(row("--lora-alpha", "lora.alpha", T::Real, G::Lora, kBoth, "LoRA: alpha (scaling = alpha / r; peft's default 8)",
                        -kNoLimit, kNoLimit, false, "16"),
                    DTLAB_FIELD(lora.alpha)));
  s.push_back(field(row("--lora-layers", "lora.layers", T::IntList, G::Lora, kBoth,
                        "LoRA: Sequential indices of the adapted Linears, e.g. 0,4, or a GPT's blocks whose c_attn is adapted (default: every one)", INT_MIN, kInt, false, "0,2"),
                    DTLAB_FIELD(lora.layers)));
  s.push_back(field(row("--merge-lora", "merge_lora", T::Flag, G::Lora, kBoth,
                        "LoRA: --save writes the merged weights (W + scaling B A), the plain model's state_dict", 0, 0, false,
                        "true"),
                    DTLAB_FIELD(merge_lora)));

  // Mixed precision (docs/course_sources.md §6e): 16-bit parameters, activations and gradients with
  // fp32 master weights and optimizer state; fp16 adds torch's GradScaler.
  s.push_back(named(row("--precision", "precision", T::Choice, G::Precision, kBoth,
                        "fp32 | bf16 | fp16: mixed precision keeps parameters, activations and gradients in 16 bits and fp32 master "
                        "weights and optimizer state (fp16 adds a loss scaler)", 0, 0, true, "bf16"),
                    DTLAB_FIELD(precision), precision_name, [](const std::string& t) { return parse_precision(t.c_str()); }));
  s.push_back(named(row("--amp", "amp", T::Choice, G::Precision, kBoth,
                        "fp32 | bf16 | fp16: torch.autocast: parameters, gradients and optimizer state stay fp32, each Linear runs "
                        "on 16-bit casts and the activations are 16-bit (fp16 adds GradScaler); not with --precision",
                        0, 0, true, "bf16"),
                    DTLAB_FIELD(amp), precision_name, [](const std::string& t) {
                      if (t != "fp32" && t != "bf16" && t != "fp16") throw Error("--amp " + t + " is not a dtype; use bf16 or fp16 (fp32: no autocast)");
                      return parse_precision(t.c_str());
                    }));
  s.push_back(converted(row("--reduce-dtype", "reduce_fp32", T::Choice, G::Precision, kBoth,
                            "Mixed precision: the dtype gradients are reduced in (DDP's buckets, FSDP's reduce-scatter): the "
                            "training dtype (default) or fp32", 0, 0, false, "fp32"),
                        DTLAB_FIELD(reduce_fp32),
                        [](const TrainConfig& c) { return c.reduce_fp32 ? SettingValue{"fp32"} : SettingValue{}; },
                        [](TrainConfig& c, const std::string& text) {
                          if (!is_mixed(c.precision))
                            throw Error("--reduce-dtype chooses how 16-bit gradients are all-reduced; add --precision bf16 or fp16");
                          if (text != "fp32" && text != precision_name(c.precision))
                            throw Error("--reduce-dtype " + text + " is not one of this run's choices; use fp32 or " +
                                        precision_name(c.precision) + " (the training dtype)");
                          c.reduce_fp32 = text == "fp32";
                        }));
  s.push_back(field(row("--inject-overflow", "inject_overflow_steps", T::IntList, G::Precision, kBoth,
                        "fp16: on these steps (e.g. 3,7) one rank's gradients overflow for real (its loss is scaled by a further "
                        "2^24); the scaler skips them", static_cast<double>(INT64_MIN), static_cast<double>(INT64_MAX), false, "3,7"),
                    DTLAB_FIELD(inject_overflow_steps)));
  s.push_back(field(row("--inject-overflow-rank", "inject_overflow_rank", T::Int, G::Precision, kBoth,
                        "fp16: the rank whose gradients --inject-overflow overflows (default 0)", 0, kMaxRanks - 1, false, "1"),
                    DTLAB_FIELD(inject_overflow_rank)));

  // dtlab-cli train only: epochs, SGD's settings, checkpoints, output, launch's monitor.
  s.push_back(converted(row("--epochs", "epochs", T::Int, G::Run, kCli, "Number of epochs (instead of --steps)", 1,
                            static_cast<double>(int64_t{1} << 30), false, "2"),
                        DTLAB_FIELD(epochs), [](const TrainConfig& c) { return value_of(c.epochs); },
                        [](TrainConfig& c, const std::string& text) {
                          c.epochs = from_text<int64_t>("--epochs", text);
                          c.steps = 0;  // epochs instead of the front end's default steps
                        }));
  s.push_back(converted(row("--momentum", "optimizer.momentum", T::Real, G::Run, kCli, "SGD momentum (default 0)", 0, 0.999999, false,
                            "0.9"),
                        DTLAB_FIELD(optimizer.momentum), [](const TrainConfig& c) { return value_of(c.optimizer.momentum); },
                        [](TrainConfig& c, const std::string& text) {
                          if (c.optimizer.kind != OptimizerKind::SGD)
                            throw Error("--momentum applies to --optimizer sgd; AdamW keeps its own moments (betas 0.9, 0.999)");
                          c.optimizer.momentum = from_text<double>("--momentum", text);
                        }));
  s.push_back(field(row("--weight-decay", "optimizer.weight_decay", T::Real, G::Run, kCli,
                        "Weight decay (default 0 for sgd, 0.01 for adamw, as torch)", 0, 1e6, false, "0.5"),
                    DTLAB_FIELD(optimizer.weight_decay)));
  s.push_back(field(row("--shuffle", "shuffle", T::Flag, G::Run, kCli, "Shuffle each epoch (default on)", 0, 0, false, "false"),
                    DTLAB_FIELD(shuffle)));
  s.back().off_flag = "--no-shuffle";
  s.push_back(field(row("--drop-last", "drop_last", T::Flag, G::Run, kCli, "Drop the last partial batch of each epoch (the DataLoader's drop_last; the DistributedSampler still pads by repeating rows, as torch's default)", 0, 0, false,
                        "true"),
                    DTLAB_FIELD(drop_last)));
  s.push_back(field(row("--init", "init_path", T::InputPath, G::Output, kCli,
                        "Start from a checkpoint's parameters: a safetensors file or a --save-sharded directory (the optimizer state "
                        "starts fresh); without --model, its model too", 0, 0, false, "."),
                    DTLAB_FIELD(init_path)));
  s.push_back(field(row("--save", "save_path", T::OutputPath, G::Output, kCli, "Write a safetensors checkpoint at the end (atomic)", 0, 0,
                        false, "out.safetensors"),
                    DTLAB_FIELD(save_path)));
  s.push_back(field(row("--save-sharded", "save_sharded_path", T::OutputPath, G::Output, kCli,
                        "write a sharded checkpoint directory at the end (one file per rank plus index.json: FSDP's shards, or each replicated parameter once)", 0, 0, false,
                        "shards"),
                    DTLAB_FIELD(save_sharded_path)));
  s.push_back(field(row("--trace", "trace_path", T::OutputPath, G::Output, kCli,
                        "Write a Chrome trace (Perfetto, chrome://tracing) of the run", 0, 0, false, "trace.json"),
                    DTLAB_FIELD(trace_path)));
  s.push_back(converted(row("--trace-clock", "trace_modeled", T::Choice, G::Output, kCli, "Timeline of --trace: wall or modeled", 0, 0,
                            true, "modeled"),
                        DTLAB_FIELD(trace_modeled),
                        [](const TrainConfig& c) { return SettingValue{c.trace_modeled ? "modeled" : "wall"}; },
                        [](TrainConfig& c, const std::string& text) {
                          if (text != "wall" && text != "modeled")
                            throw Error("--trace-clock " + text + " is not a clock; use wall or modeled");
                          c.trace_modeled = text == "modeled";
                        }));
  s.push_back(field(row("--threads", "threads", T::Int, G::Placement, kCli, "BLAS threads (default: 1 when several ranks share the machine, as torchrun sets OMP_NUM_THREADS=1; else OpenBLAS's choice)", 0, 256, false,
                        "2"),
                    DTLAB_FIELD(threads)));
  s.push_back(field(row("--gradient-as-bucket-view", "ddp.gradient_as_bucket_view", T::Flag, G::Ddp, kCli,
                        "Gradients live in DDP's buckets (saves one gradient-sized buffer)", 0, 0, false, "true"),
                    DTLAB_FIELD(ddp.gradient_as_bucket_view)));
  s.push_back(converted(row("--static-buckets", "ddp.rebuild_buckets", T::Flag, G::Ddp, kCli,
                            "Keep DDP's construction-time buckets (no rebuild after iteration 1)", 0, 0, false, "true"),
                        DTLAB_FIELD(ddp.rebuild_buckets),
                        [](const TrainConfig& c) { return SettingValue{c.ddp.rebuild_buckets ? "false" : "true"}; },
                        [](TrainConfig& c, const std::string& text) { c.ddp.rebuild_buckets = !from_text<bool>("--static-buckets", text); }));
  s.push_back(field(row("--monitor", "monitor_port", T::Int, G::Output, kCli,
                        "Under dtlab-cli launch: rank 0 serves the run to 'dtlab --attach MASTER_ADDR:PORT' on this port; the run "
                        "starts paused", 1, 65535, false, "29500"),
                    DTLAB_FIELD(monitor_port)));
  s.push_back(field(row("--monitor-wait", "monitor_wait_s", T::Real, G::Output, kCli, "Seconds a --monitor run waits for its viewer to attach",
                        0.001, 1e6, true, "5"),
                    DTLAB_FIELD(monitor_wait_s)));

  // JSON only: what the front end or the launcher fills in, which a viewer still needs.
  s.push_back(field(row("", "optimizer.dampening", T::Real, G::Run, kJson, "SGD dampening", 0, 0, false, "0.5"),
                    DTLAB_FIELD(optimizer.dampening)));
  s.push_back(field(row("", "optimizer.beta1", T::Real, G::Run, kJson, "AdamW beta1", 0, 0, false, "0.8"), DTLAB_FIELD(optimizer.beta1)));
  s.push_back(field(row("", "optimizer.beta2", T::Real, G::Run, kJson, "AdamW beta2", 0, 0, false, "0.99"), DTLAB_FIELD(optimizer.beta2)));
  s.push_back(field(row("", "optimizer.eps", T::Real, G::Run, kJson, "AdamW eps", 0, 0, false, "1e-06"), DTLAB_FIELD(optimizer.eps)));
  s.push_back(field(row("", "start_paused", T::Flag, G::Run, kJson, "The stepper starts paused (the lab)", 0, 0, false, "true"),
                    DTLAB_FIELD(start_paused)));
  s.push_back(field(row("", "launched", T::Flag, G::Placement, kJson, "One process per rank (dtlab-cli launch)", 0, 0, false, "true"),
                    DTLAB_FIELD(launched)));
  s.push_back(field(row("", "socket.rank", T::Int, G::Placement, kJson, "This process's rank (RANK)", 0, 0, false, "1"),
                    DTLAB_FIELD(socket.rank)));
  s.push_back(field(row("", "socket.world_size", T::Int, G::Placement, kJson, "The launched world (WORLD_SIZE)", 0, 0, false, "4"),
                    DTLAB_FIELD(socket.world_size)));
  s.push_back(field(row("", "socket.local_rank", T::Int, G::Placement, kJson, "This process's rank on its node (LOCAL_RANK)", 0, 0, false,
                        "1"),
                    DTLAB_FIELD(socket.local_rank)));
  s.push_back(field(row("", "socket.master_addr", T::Text, G::Placement, kJson, "Rank 0's host (MASTER_ADDR)", 0, 0, false, "10.0.0.1"),
                    DTLAB_FIELD(socket.master_addr)));
  s.push_back(field(row("", "socket.master_port", T::Int, G::Placement, kJson, "Rank 0's port (MASTER_PORT)", 0, 0, false, "4321"),
                    DTLAB_FIELD(socket.master_port)));
  s.push_back(field(row("", "socket.timeout_s", T::Real, G::Placement, kJson, "Seconds to connect", 0, 0, false, "7"),
                    DTLAB_FIELD(socket.timeout_s)));
  const auto algorithm_row = [](const char* key, const char* help, auto ref, const char* example) {
    return named(row("", key, T::Choice, G::Placement, kJson, help, 0, 0, false, example), ref, algorithm_name,
                 [](const std::string& t) { return parse_algorithm(t); });
  };
  s.push_back(algorithm_row("socket.allreduce", "The launched world's all-reduce algorithm", DTLAB_FIELD(socket.algorithms.allreduce), "tree"));
  s.push_back(algorithm_row("socket.broadcast", "The launched world's broadcast algorithm", DTLAB_FIELD(socket.algorithms.broadcast), "naive"));
  s.push_back(algorithm_row("socket.reduce", "The launched world's reduce algorithm", DTLAB_FIELD(socket.algorithms.reduce), "naive"));
  return s;
}

#undef DTLAB_FIELD

bool strategy_is(const TrainConfig& c, Strategy s) { return c.strategy == s; }

const SettingGroupInfo kGroups[] = {
    {G::Run, "Run", nullptr, "", ""},
    {G::Ddp, "DDP", [](const TrainConfig& c) { return strategy_is(c, Strategy::Ddp); },
     " configures DDP; add --strategy ddp --world N", ""},
    {G::Fsdp, "FSDP", [](const TrainConfig& c) { return strategy_is(c, Strategy::Fsdp); }, " configures FSDP; add --strategy fsdp --world N",
     ""},
    {G::Pipeline, "Pipeline", [](const TrainConfig& c) { return strategy_is(c, Strategy::Pipeline); },
     " configures a pipeline; add --strategy pipeline --stages p", ""},
    {G::Mesh, "Mesh", nullptr, "", ""},
    {G::Comm, "Communication", nullptr, "", ""},
    {G::Precision, "Mixed precision", nullptr, "", ""},
    {G::Lora, "LoRA", [](const TrainConfig& c) { return c.lora.rank != 0; },
     " configures LoRA adapters; add --lora-rank R (e.g. --lora-rank 4)", "--lora-rank"},
    {G::Faults, "Faults", nullptr, "", ""},
    {G::Placement, "Placement", nullptr, "", ""},
    {G::Output, "Checkpoints and output", nullptr, "", ""},
};

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = make_settings();
  return table;
}

const Setting* find_setting(std::string_view flag) {
  for (const Setting& s : settings())
    if (!flag.empty() && (flag == s.flag || flag == s.off_flag)) return &s;
  return nullptr;
}

const SettingGroupInfo& setting_group(SettingGroup g) {
  for (const SettingGroupInfo& info : kGroups)
    if (info.group == g) return info;
  DTLAB_CHECK(false, "a setting group without its row in kGroups; add one");
  return kGroups[0];
}

std::string setting_text(const Setting& s, const TrainConfig& c) { return join(s.get(c), ","); }

std::vector<std::pair<std::string, std::string>> changed_settings(const TrainConfig& c) {
  const TrainConfig defaults;
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Setting& s : settings()) {
    const std::string text = setting_text(s, c);
    if (text != setting_text(s, defaults)) rows.emplace_back(*s.flag ? s.flag : s.key, text);
  }
  return rows;
}

std::string model_preset_spec(const std::string& name) {
  // The lab's presets: small enough to step through by hand, several buckets with small caps.
  if (name == "tiny") return "mlp:2,16,16,3";
  if (name == "small") return "mlp:2,64,64,3";
  if (name == "deep") return "mlp:2,64,64,64,64,3";
  if (name == "wide") return "mlp:2,256,256,3";
  return name;
}

}  // namespace dtlab
