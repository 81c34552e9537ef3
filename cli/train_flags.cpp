#include "cli/train_flags.h"

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/parallel/pipeline.h"
#include "engine/train/device_probe.h"
#include "engine/trace/cost_model.h"
#include "engine/trace/tuning.h"

namespace dtlab::cli {

namespace {

void add_run_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  auto& all = f.all;
  // The strategies' help is their table's rows (engine/train/strategy.h).
  std::string help = "Parallel strategy:";
  for (const StrategyTraits& t : strategy_table()) help += std::string("\n  ") + t.name + ": " + t.summary + " (" + t.torch + ")";
  f.strategy = strategy_name(c.strategy);  // the front end's default (the lab's is ddp)
  all.push_back(app.add_option("--strategy", f.strategy, help)->capture_default_str());
  f.world = app.add_option("--world", c.world_size, "Number of ranks (for strategies that use several)")
                ->check(whole_number(1, kMaxRanks))->capture_default_str();
  f.model_opt = app.add_option("--model", f.model, "Model: mlp:D0,D1,...,Dk (layer widths) or a preset tiny | small | deep | wide")
                    ->capture_default_str();
  all.insert(all.end(), {f.world, f.model_opt});
  all.push_back(app.add_option("--data", c.data, "spiral | blobs | PATH.npz (with options, e.g. spiral:classes=4,points=500)")
                    ->capture_default_str());
  all.push_back(app.add_option("--batch", c.batch, "Batch size per rank")->check(whole_number(1, int64_t{1} << 20))->capture_default_str());
  f.steps = app.add_option("--steps", c.steps, "Number of optimizer steps")->check(whole_number(1, int64_t{1} << 40))->capture_default_str();
  all.push_back(f.steps);
  all.push_back(app.add_option("--accum", c.accum, "Gradient accumulation: micro-batches per optimizer step (DDP's no_sync for all but the last)")
                    ->check(whole_number(1, 1 << 20))->capture_default_str());
  all.push_back(app.add_option("--optimizer", f.optimizer, "sgd | adamw")->capture_default_str());
  f.lr_opt = app.add_option("--lr", f.lr, "Learning rate (default 0.1 for sgd, 0.01 for adamw)")->check(real_number(1e-12, 1e6));
  all.push_back(f.lr_opt);
}

void add_ddp_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  f.bucket_cap = app.add_option("--bucket-cap-mb", f.bucket_cap_mb, "DDP bucket cap in MiB (torch's bucket_cap_mb)")
                     ->check(real_number(0, 1e6))->capture_default_str();
  f.first_bucket = app.add_option("--first-bucket-mb", f.first_bucket_mb,
                                  "DDP first bucket cap in MiB (with only --bucket-cap-mb given, the cap, as torch)")
                       ->check(real_number(0, 1e6))->capture_default_str();
  f.ddp = {f.bucket_cap, f.first_bucket,
           app.add_flag("--sized-first-iteration", c.ddp.sized_first_iteration,
                        "DDP: sized buckets in iteration 1 too (torch uses one bucket there unless --find-unused-parameters)"),
           app.add_flag("--find-unused-parameters", c.ddp.find_unused_parameters, "DDP marks parameters the forward did not use as ready")};
  f.all.insert(f.all.end(), f.ddp.begin(), f.ddp.end());
}

void add_fsdp_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  f.node_size = app.add_option("--node-size", c.fsdp.node_size, "FSDP hybrid: ranks per shard group (default: the profile's ranks per node)")
                    ->check(whole_number(1, kMaxRanks));
  f.fsdp = {app.add_option("--sharding", f.sharding, "FSDP: full | grad-op | no-shard | hybrid | zero1")->capture_default_str(),
            f.node_size,
            app.add_option("--wrap", f.wrap, "FSDP units: layer (one per Linear) | model")->capture_default_str(),
            app.add_option("--backward-prefetch", f.backward_prefetch, "FSDP: none | pre (BACKWARD_PRE) | post (BACKWARD_POST)")
                ->capture_default_str(),
            app.add_flag("--forward-prefetch", c.fsdp.forward_prefetch, "FSDP: gather the next unit during this unit's forward")};
  f.all.insert(f.all.end(), f.fsdp.begin(), f.fsdp.end());
}

void add_pipeline_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  PipelineOptions& p = c.pipeline;
  f.pipeline = {
      app.add_option("--stages", p.stages, "Pipeline: ranks per pipeline, p (the model is cut into p x --chunks stages)")
          ->check(whole_number(1, kMaxRanks))->capture_default_str(),
      app.add_option("--microbatches", p.microbatches, "Pipeline: micro-batches per batch, m (--batch must be a multiple)")
          ->check(whole_number(1, 4096))->capture_default_str(),
      app.add_option("--schedule", f.schedule, "Pipeline schedule: gpipe | 1f1b | interleaved | zb-h1")->capture_default_str(),
      app.add_option("--chunks", p.chunks, "Pipeline: stages per rank, v (interleaved)")->check(whole_number(1, kMaxRanks))->capture_default_str(),
      app.add_option("--dp", p.dp, "Pipeline: data-parallel replicas, D (world = stages x dp x tp; rank = (replica x p + stage rank) x tp + tp rank)")
          ->check(whole_number(1, kMaxRanks))->capture_default_str(),
      app.add_option("--split", f.split, "Pipeline: Linear layers per stage, e.g. 2,2,1 (default: balanced by parameter count)"),
      app.add_flag("--unit-costs", f.unit_costs, "Pipeline: every F, B, I and W costs 1 ms of modeled time (equal stages; "
                                                 "with --profile ideal the measured bubbles equal the formulas)"),
  };
  f.all.insert(f.all.end(), f.pipeline.begin(), f.pipeline.end());
}

void add_other_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  f.all.insert(f.all.end(), {
      app.add_option("--skip-layer", c.skip_layer, "Model branch: bypass this square Linear (Sequential index) on every --skip-every-th step")
          ->check(whole_number(0, 1 << 20)),
      app.add_option("--skip-every", c.skip_every, "Period of the --skip-layer branch in steps")
          ->check(whole_number(1, int64_t{1} << 40))->capture_default_str(),
      app.add_option("--skip-ranks", c.skip_ranks, "Ranks whose forward takes the --skip-layer branch, e.g. 1,3 (default: every rank)")
          ->delimiter(',')->check(whole_number(0, kMaxRanks - 1)),
      app.add_flag("--allow-nonfinite", c.allow_nonfinite, "Train on when the loss becomes NaN or infinite (default: stop at that step, "
                                                           "naming the rank and the first non-finite layer)"),
      app.add_option("--fault", f.faults, "Inject a fault: skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M (repeatable)"),
      app.add_option("--profile", c.profile, "Hardware profile of the modeled clock: " + join(profile_names(), ", ") + " (ideal: free communication)")->capture_default_str(),
      app.add_option("--algo", f.algo, "All-reduce algorithm (NCCL_ALGO): ring (default) | tree | naive | dbtree | hierarchical | "
                                       "nvls | auto (the tuning model's pick per call, from its bytes, the profile and the world)"),
      app.add_option("--proto", f.proto, "Protocol (NCCL_PROTO): auto (default: the tuning model's pick) | simple | ll | ll128"),
      app.add_option("--tp", c.tp, "Tensor parallelism: ranks per TP group, Megatron's column/row split of each Linear pair "
                                   "(world = dp x stages x tp, tp fastest as torch's init_device_mesh)")
          ->check(whole_number(1, kMaxRanks))->capture_default_str(),
      app.add_flag("--sequence-parallel", c.sequence_parallel, "With --tp: activations outside the Linear pairs split by rows; "
                                                               "the all-reduces become reduce-scatter + all-gather"),
      app.add_option("--seed", c.seed, "Seed for the model init (torch.manual_seed) and the sampler")
          ->check(whole_number(0, (int64_t{1} << 32) - 1))->capture_default_str(),
      app.add_option("--timeout", c.timeout_s, "Watchdog: seconds before a stuck collective or DDP bucket fails, diagnosed")
          ->check(real_number(0.001, 1e6))->capture_default_str(),
      app.add_option("--device", f.device, "cpu | cuda (default: cuda when a GPU is present, else cpu; DTLAB_DEVICE sets it)"),
      app.add_option("--backend", f.backend, "Where ranks run: threads (all in this process) | cuda (threads sharing a GPU) | nccl "
                                             "(one GPU per rank) | socket (one process per rank, as dtlab-cli launch starts them); "
                                             "default: nccl with a GPU per rank, cuda with fewer GPUs, else threads"),
      app.add_flag("--activation-checkpointing", c.activation_checkpointing,
                   "torch.utils.checkpoint per Linear+ReLU block: forward keeps only block inputs, backward recomputes "
                   "each block first (same results, less activation memory, more compute)"),
  });
}

// LoRA (peft's LoraConfig: r, lora_alpha default 8, adapters on every Linear unless listed;
// docs/course_sources.md §6d).
void add_lora_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  f.lora_rank_opt = app.add_option("--lora-rank", f.lora_rank, "LoRA: adapter rank r; freezes the base weights and trains only the adapters");
  f.lora_alpha_opt = app.add_option("--lora-alpha", c.lora.alpha, "LoRA: alpha (scaling = alpha / r; peft's default 8)");
  f.lora_layers_opt = app.add_option("--lora-layers", c.lora.layers, "LoRA: Sequential indices of the adapted Linears, e.g. 0,4 (default: every Linear)")
                          ->delimiter(',');
  f.merge_lora_opt = app.add_flag("--merge-lora", c.merge_lora, "LoRA: --save writes the merged weights (W + scaling B A), a plain torch.nn.Sequential state_dict");
  for (CLI::Option* o : {f.lora_rank_opt, f.lora_alpha_opt, f.lora_layers_opt, f.merge_lora_opt}) f.all.push_back(o);
}

// Mixed precision (docs/course_sources.md §6e): 16-bit parameters, activations and gradients with fp32
// master weights and optimizer state; fp16 adds torch's GradScaler.
void add_precision_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  f.all.insert(f.all.end(), {
      app.add_option("--precision", f.precision, "fp32 | bf16 | fp16: mixed precision keeps parameters, activations and gradients "
                                                 "in 16 bits and fp32 master weights and optimizer state (fp16 adds a loss scaler)")
          ->capture_default_str(),
      app.add_option("--reduce-dtype", f.reduce_dtype, "Mixed precision: the dtype gradients are reduced in (DDP's buckets, "
                                                       "FSDP's reduce-scatter): the training dtype (default) or fp32"),
      app.add_option("--inject-overflow", c.inject_overflow_steps, "fp16: on these steps (e.g. 3,7) one rank's gradients overflow "
                                                                  "for real (its loss is scaled by a further 2^24); the scaler skips them")
          ->delimiter(','),
      app.add_option("--inject-overflow-rank", c.inject_overflow_rank, "fp16: the rank whose gradients --inject-overflow overflows (default 0)"),
  });
}

void finish_precision(const TrainFlags& f, TrainConfig& c) {
  c.precision = parse_precision(f.precision.c_str());
  if (f.reduce_dtype.empty()) return;
  if (!is_mixed(c.precision))
    throw Error("--reduce-dtype chooses how 16-bit gradients are all-reduced; add --precision bf16 or fp16");
  if (f.reduce_dtype != "fp32" && f.reduce_dtype != precision_name(c.precision))
    throw Error("--reduce-dtype " + f.reduce_dtype + " is not one of this run's choices; use fp32 or " + precision_name(c.precision) +
                " (the training dtype)");
  c.reduce_fp32 = f.reduce_dtype == "fp32";
}

void finish_lora(const TrainFlags& f, TrainConfig& c) {
  if (f.lora_rank_opt->count() == 0) {
    for (const CLI::Option* o : {f.lora_alpha_opt, f.lora_layers_opt, f.merge_lora_opt})
      if (o->count() > 0) throw Error(o->get_name() + " configures LoRA adapters; add --lora-rank R (e.g. --lora-rank 4)");
    return;
  }
  c.lora.rank = f.lora_rank;
  check_lora_spec(c.model, c.lora);
  if (c.merge_lora && c.save_path.empty())
    throw Error("--merge-lora says what --save writes; add --save PATH.safetensors");
}

// Each flag of `group` that was given needs `strategy`.
void refuse_unless(bool strategy_given, const std::vector<CLI::Option*>& group, const std::string& why_and_fix) {
  if (strategy_given) return;
  for (const CLI::Option* o : group)
    if (o->count() > 0) throw Error(o->get_name() + why_and_fix);
}

void finish_ddp(const TrainFlags& f, TrainConfig& c) {
  refuse_unless(c.strategy == Strategy::Ddp, f.ddp, " configures DDP's buckets; add --strategy ddp --world N");
  // torch: bucket_cap_mb * 1024 * 1024 bytes (MB here means MiB, as in torch).
  c.ddp.bucket_cap_bytes = static_cast<int64_t>(f.bucket_cap_mb * 1048576.0);
  // Current torch: an explicit bucket_cap_mb makes the first bucket as large as the others
  // (dtlab's --first-bucket-mb plays torch's dist._DEFAULT_FIRST_BUCKET_BYTES when given).
  const bool first_from_cap = f.bucket_cap->count() > 0 && f.first_bucket->count() == 0;
  c.ddp.first_bucket_bytes = first_from_cap ? c.ddp.bucket_cap_bytes : static_cast<int64_t>(f.first_bucket_mb * 1048576.0);
  if (c.ddp.bucket_cap_bytes < 1) throw Error("--bucket-cap-mb is too small: a bucket must hold at least 1 byte");
  if (c.ddp.first_bucket_bytes < 1) throw Error("--first-bucket-mb is too small: a bucket must hold at least 1 byte");
}

void finish_fsdp(const TrainFlags& f, TrainConfig& c) {
  refuse_unless(c.strategy == Strategy::Fsdp, f.fsdp, " configures FSDP; add --strategy fsdp --world N");
  c.fsdp.sharding = parse_sharding(f.sharding);
  if (f.node_size->count() > 0 && c.fsdp.sharding != Sharding::Hybrid)
    throw Error("--node-size sets HYBRID_SHARD's shard group; add --sharding hybrid");
  if (f.wrap != "layer" && f.wrap != "model") throw Error("--wrap " + f.wrap + " is not a wrap policy; use layer (one unit per Linear) or model");
  c.fsdp.wrap_layers = f.wrap == "layer";
  c.fsdp.backward_prefetch = parse_backward_prefetch(f.backward_prefetch);
}

void finish_pipeline(const TrainFlags& f, TrainConfig& c) {
  refuse_unless(c.strategy == Strategy::Pipeline, f.pipeline, " configures a pipeline; add --strategy pipeline --stages p");
  if (c.strategy != Strategy::Pipeline) return;
  c.pipeline.schedule = parse_schedule_kind(f.schedule);
  if (!f.split.empty()) c.pipeline.split = parse_split(f.split);
  if (f.unit_costs) c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
  if (f.world->count() == 0) c.world_size = c.pipeline.stages * c.pipeline.dp * c.tp;
}

}  // namespace

std::string model_preset_spec(const std::string& name) {
  // The lab's presets: small enough to step through by hand, several buckets with small caps.
  if (name == "tiny") return "mlp:2,16,16,3";
  if (name == "small") return "mlp:2,64,64,3";
  if (name == "deep") return "mlp:2,64,64,64,64,3";
  if (name == "wide") return "mlp:2,256,256,3";
  return name;
}

void add_train_flags(CLI::App& app, TrainFlags& f, TrainConfig& c) {
  add_run_flags(app, f, c);
  add_ddp_flags(app, f, c);
  add_fsdp_flags(app, f, c);
  add_pipeline_flags(app, f, c);
  add_other_flags(app, f, c);
  add_lora_flags(app, f, c);
  add_precision_flags(app, f, c);
}

void finish_train_flags(const TrainFlags& f, TrainConfig& c) {
  c.strategy = parse_strategy(f.strategy);
  c.model = ModelSpec::parse(model_preset_spec(f.model));
  c.optimizer = default_optimizer_config(parse_optimizer_kind(f.optimizer));
  if (f.lr_opt->count() > 0) c.optimizer.lr = f.lr;
  const HardwareProfile profile = find_profile(c.profile);  // a bad name fails here, before any work
  if (!f.algo.empty()) c.algo = parse_algorithm_choice(f.algo);
  if (!f.proto.empty()) c.proto = parse_protocol_choice(f.proto);
  check_forced_choice(profile, CollectiveOp::AllReduce, c.algo, c.proto);
  finish_ddp(f, c);
  for (const std::string& text : f.faults) c.faults.push_back(parse_fault(text));
  finish_fsdp(f, c);
  finish_pipeline(f, c);
  finish_lora(f, c);
  finish_precision(f, c);
  if (c.strategy == Strategy::Single) {
    if (f.world->count() > 0 && c.world_size != 1)
      throw Error("--strategy single runs one rank, but --world is " + std::to_string(c.world_size) +
                  "; drop --world, set it to 1, or use --strategy ddp");
    c.world_size = 1;
    if (!c.faults.empty()) throw Error("--fault injects into the ranks' collectives; add --strategy ddp (or fsdp) --world N");
  }
}

std::string choose_device(const TrainFlags& f, TrainConfig& c, int ranks_on_node, const std::string& fallback_device) {
  DeviceQuery q;
  q.device = f.device.empty() ? fallback_device : f.device;
  q.backend = f.backend;
  q.strategy = c.strategy;
  q.ranks_on_node = ranks_on_node;
  probe_devices(q);
  const DeviceChoice dc = resolve_device(q);
  c.device = dc.device;
  c.backend = dc.backend;
  c.launched = dc.launched;
  return dc.why;
}

}  // namespace dtlab::cli
