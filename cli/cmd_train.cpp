// dtlab-cli train: one training run, printed as it goes (human lines or JSON Lines).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/train_flags.h"
#include "cli/train_pipeline.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/checkpoint.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/expert_parallel.h"
#include "engine/parallel/memory_plan.h"
#include "engine/trace/cost_model.h"
#include "engine/train/train.h"

namespace dtlab::cli {

namespace {

struct TrainArgs {
  TrainConfig cfg;
  TrainFlags flags;  // every setting's flag, the lab's and dtlab-cli's own (cli/train_flags.h)
  bool json = false;
  int64_t log_every = 0;
  std::string device_why;
};

std::string human_seconds(double s) {
  char buf[32];
  if (s < 1.0) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    n++;
  }
  return out;
}

// Fills what depends on other flags: the model (from --init when --model is absent), every
// setting (cli/train_flags.h), and where the ranks run.
void finish_config(TrainArgs& a) {
  TrainConfig& c = a.cfg;
  // Continuing from a checkpoint without --model: take the model the checkpoint holds, its experts too.
  std::string file_moe;
  if (a.flags.given("--init") && !a.flags.given("--model")) {
    CheckpointInfo info = read_checkpoint_info(a.flags.text("--init"));
    if (!info.model_spec.empty()) c.model = ModelSpec::parse(info.model_spec);
    file_moe = info.moe;
  }
  finish_train_flags(a.flags, c);
  if (!file_moe.empty() && !a.flags.given("--moe")) c.moe = MoeSpec::parse(file_moe);
  int ranks_on_node = c.world_size;
  if (c.backend == "socket") {  // one rank of a world of processes: rank and world from the launcher
    c.socket = socket_options_from_env();
    if (!a.flags.given("--world")) c.world_size = c.socket.world_size;
    ranks_on_node = c.socket.local_world_size;
  }
  // Where the ranks run: what was asked, else the defaults of engine/train/device_select.h.
  a.device_why = choose_device(a.flags, c, ranks_on_node);
}

// The header's lines about the strategy: DDP's buckets, DataParallel's traffic, FSDP's units.
void print_strategy_lines(std::ostream& out, const Trainer& trainer) {
  const TrainConfig& c = trainer.config();
  if (c.strategy == Strategy::Ddp) {
    out << "  DDP: bucket cap " << human_bytes(c.ddp.bucket_cap_bytes) << ", first bucket "
        << human_bytes(c.ddp.first_bucket_bytes)
        << (c.ddp.find_unused_parameters ? ", find_unused_parameters" : "")
        << (c.ddp.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "")
        << (c.ddp.rebuild_buckets && !c.ddp.find_unused_parameters ? ", buckets rebuilt after iteration 1" : ", static buckets")
        << "; all-reduce order"
        << (c.ddp.find_unused_parameters || c.ddp.sized_first_iteration ? ""
                : " in iteration 1 (one bucket, as torch does with find_unused_parameters=False)")
        << ":\n";
    for (const std::string& line : trainer.planned_buckets()) out << "    " << line << "\n";
  }
  if (c.strategy == Strategy::Dp) {
    // Under LoRA the frozen base is broadcast too, and only the adapters have gradients.
    const bool lora = c.lora.rank > 0;
    int64_t adapters = 0;  // bytes: r x (in + out) floats per adapted Linear
    for (size_t i = 0; lora && i + 1 < c.model.dims.size(); i++)
      if (c.lora.adapts(2 * static_cast<int>(i))) adapters += c.lora.rank * (c.model.dims[i] + c.model.dims[i + 1]) * 4;
    out << "  DataParallel: rank 0 loads batches of " << c.batch * c.world_size << " and scatters "
        << c.batch << " samples to each of the " << c.world_size << " devices; every forward broadcasts the "
        << human_bytes(c.model.num_params() * static_cast<int64_t>(sizeof(float)) + adapters)
        << (lora ? " of parameters (the frozen base and the LoRA adapters)" : " of parameters") << " from rank 0, every backward reduce-adds the "
        << (lora ? "adapters' " + human_bytes(adapters) + " of gradients" : std::string("gradients"))
        << " onto rank 0, which alone steps\n";
  }
  if (c.cp > 1 && c.model.is_gpt()) {  // the CP groups and what each rank holds of a sample
    const int64_t T = c.model.gpt.ctx;
    std::vector<std::string> groups;
    std::vector<char> seen(static_cast<size_t>(c.world_size), 0);
    for (int r = 0; r < c.world_size; r++) {
      if (seen[static_cast<size_t>(r)]) continue;
      std::string g = "cp" + std::to_string(groups.size());
      const std::vector<int> ranks = cp_group_ranks(trainer.mesh(), c.cp, r);
      for (size_t i = 0; i < ranks.size(); i++) {
        g += (i ? "," : " ") + std::to_string(ranks[i]);
        seen[static_cast<size_t>(ranks[i])] = 1;
      }
      groups.push_back(g);
    }
    std::string joined;
    for (size_t i = 0; i < groups.size(); i++) joined += (i ? ", " : "") + groups[i];
    out << "  context parallelism: " << cp_layout_name(c.cp_layout) << ", groups " << joined << "; each rank holds " << T / c.cp
        << " of every sample's " << T << " positions"
        << (c.cp_layout == CpLayout::Zigzag ? " (chunks r and " + std::to_string(2 * c.cp - 1) + "-r of " + std::to_string(2 * c.cp) + ")"
            : c.cp_layout == CpLayout::Ulysses ? " (attention on " + std::to_string(c.model.gpt.heads / std::max(c.tp, 1) / c.cp) + " heads of every position, between two all-to-alls)"
                                               : " (one contiguous chunk; K/V blocks travel the ring)")
        << "\n";
  }
  if (c.ep > 1 && c.moe.on()) {  // the EP groups and which experts each rank holds
    const int64_t per = c.moe.experts / c.ep;
    out << "  expert parallelism: " << per << " of every MoE block's " << c.moe.experts << " experts per rank ("
        << (per == 1 ? std::string("EP rank e holds expert e")
                     : "EP rank e holds experts " + std::to_string(per) + "e to " + std::to_string(per) + "e + " + std::to_string(per - 1))
        << "), dispatch and combine all-to-alls over ";
    if (c.strategy == Strategy::Pipeline) {
      out << "runs of " << c.ep << " of each stage's ranks" << (c.tp > 1 ? " (TP ranks first)" : "") << "\n";
    } else {
      std::string groups, edp;
      for (int g = 0; g < c.world_size / c.ep; g++) {
        const std::vector<int> r = ep_group_ranks(g * c.ep, c.ep);
        groups += (g ? ", ep" : "ep") + std::to_string(g) + " " + std::to_string(r.front()) + "-" + std::to_string(r.back());
      }
      for (int e = 0; e < c.ep && c.world_size > c.ep; e++) {
        std::string ranks;
        for (int r : expert_dp_group_ranks(e, c.ep, c.world_size)) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
        edp += (e ? ", edp" : "edp") + std::to_string(e) + " " + ranks;
      }
      out << groups << (c.tp > 1 ? " (runs of " + std::to_string(c.ep) + " ranks, TP ranks first: Megatron's MoE parallel folding)" : "");
      if (c.strategy == Strategy::Fsdp && c.fsdp.sharding == Sharding::Hybrid)
        out << "; each block's experts an FSDP unit, sharded inside a node over the ranks holding them (" << c.fsdp.node_size / c.ep
            << " a node) and copied across nodes";
      else if (c.strategy == Strategy::Fsdp && c.fsdp.sharding == Sharding::NoShard)
        out << "; each block's experts an FSDP unit, its gradient all-reduced over " << (edp.empty() ? "the one rank holding them" : edp);
      else if (c.strategy == Strategy::Fsdp)
        out << "; each block's experts an FSDP unit, sharded over " << (edp.empty() ? "the one rank holding them" : edp);
      else if (!edp.empty())
        out << "; each expert's gradients summed over " << edp;
      out << "\n";
    }
  }
  if (c.strategy == Strategy::Fsdp)
    out << "  FSDP: " << sharding_name(c.fsdp.sharding)
        << (c.fsdp.sharding == Sharding::Hybrid
                ? " (node groups of " + std::to_string(trainer.config().fsdp.node_size) + " ranks)" : std::string())
        << ", units: "
        << (c.fsdp.wrap_layers ? "one per Linear layer" : "the whole model") << ", backward prefetch "
        << backward_prefetch_name(c.fsdp.backward_prefetch) << (c.fsdp.forward_prefetch ? ", forward prefetch" : "") << "\n";
}

// The run's header: model, data, strategy, device.
void print_header(const TrainArgs& a, std::ostream& out, const Trainer& trainer) {
  const TrainConfig& c = trainer.config();
  const Dataset& ds = trainer.dataset();
  const int64_t total = trainer.total_steps();
  out << "dtlab train: " << c.model.str() << " (" << with_commas(c.model.num_params())
      << " parameters) on " << ds.name << " (" << with_commas(ds.n) << " samples, " << ds.d
      << " features, " << ds.num_classes << " classes)\n";
  out << "  strategy " << strategy_name(c.strategy) << ", world " << c.world_size << ", batch " << c.batch
      << ", " << total << (total == 1 ? " step (" : " steps (") << trainer.batches_per_epoch() << " batches per epoch), "
      << c.optimizer.str() << ", seed " << c.seed << ", shuffle "
      << (c.shuffle ? "on" : "off") << (c.drop_last ? ", drop_last" : "") << "\n";
  if (is_mixed(c.precision))
    out << "  precision " << precision_name(c.precision) << ": 16-bit parameters, gradients and activations, a float32 master copy for "
        << "the optimizer (model.to(torch." << (c.precision == Precision::BF16 ? "bfloat16" : "float16") << "))"
        << (c.precision == Precision::FP16 ? ", the loss scaled by GradScaler" : "") << "\n";
  if (is_mixed(c.amp))
    out << "  autocast " << precision_name(c.amp) << ": float32 parameters, gradients and optimizer, 16-bit activations (torch.autocast)"
        << (c.amp == Precision::FP16 ? ", the loss scaled by GradScaler" : "") << "\n";
  bool pipeline_printed = false;
  if (c.strategy == Strategy::Pipeline) print_pipeline_header(out, trainer), pipeline_printed = true;
  if (!pipeline_printed && (c.accum > 1 || c.world_size > 1))
    out << "  effective batch " << trainer.effective_batch() << " = " << c.batch
        << (c.tp > 1 || c.cp > 1
                ? " per replica x " + std::to_string(trainer.data_replicas()) + (trainer.data_replicas() == 1 ? " replica" : " replicas")
                : " per rank x " + std::to_string(c.world_size) + (c.world_size == 1 ? " rank" : " ranks"))
        << " x " << c.accum
        << " accumulation " << (c.accum == 1 ? "step" : "steps") << "\n";
  if (c.skip_layer >= 0)
    out << "  branch: every " << c.skip_every << (c.skip_every == 1 ? " step" : " steps")
        << " the forward " << (c.skip_ranks.empty() ? std::string("of every rank") : "of " + ranks_text(c.skip_ranks))
        << " bypasses layer " << c.skip_layer << " (its parameters get no gradient)\n";
  print_strategy_lines(out, trainer);
  for (const std::string& line : trainer.describe_mesh_lines()) out << "  " << line << "\n";
  if (!c.init_path.empty()) out << "  initialized from " << c.init_path << "\n";
  out << "  device " << c.device << ", backend " << c.backend << " (" << a.device_why << ")\n";
  if (const double peak = trainer.peak_flops(); peak > 0) {  // what each step's MFU divides by
    const Roof r = trainer.roof();
    out << "  MFU: model FLOPs (6 N per " << (c.model.is_gpt() ? "token + 12 L C T" : "sample")
        << ", PaLM's) / step time / " << si_text(peak, "FLOP/s") << " (" << r.device << ": " << si_text(r.flops_per_s, "FLOP/s")
        << ", " << r.source << ")\n";
  } else {
    out << "  MFU: not shown, " << trainer.roof().source << "\n";
  }
  if (c.profile == "this") {  // the modeled clock's figures, and where they come from
    const std::string dir = this_profile_cache_dir();
    out << "  modeled clock: " << this_machine_profile().description
        << (dir.empty() ? std::string() : "; kept in " + dir + "/this-profile.json, DTLAB_REMEASURE=1 measures again") << "\n";
  }
  if (c.device == "cuda") out << "  " << trainer.describe_placement() << "\n";
  if (c.backend == "socket")
    out << "  backend socket: " << c.world_size << " processes, rank 0 at " << c.socket.master_addr << ":"
        << c.socket.master_port << "\n";
  if (c.monitor_port != 0)
    out << "  monitor: paused until a viewer attaches (up to " << seconds_text(c.monitor_wait_s)
        << "): dtlab --attach " << c.socket.master_addr << ":" << c.monitor_port << "\n";
  out.flush();
}

// Each step as it ends: a JSON line, or a line every `every` steps (about 20 in all) and a progress
// bar when err is a terminal.
struct StepPrinter {
  Streams& io;
  bool json = false, bar = false, branch = false;
  int64_t every = 1;
  bool one_first_bucket = false;  // DDP's iteration 1 all-reduces one bucket after backward (nothing to overlap)
  const char* unit = "samples";   // a GPT counts positions: "tokens"
  const Trainer* trainer = nullptr;  // MFU: its model FLOPs per step over the peak of the hardware
  double peak = 0;                   // trainer->peak_flops(); 0: no MFU (a GPU the peak table lacks)
  std::chrono::steady_clock::time_point last_draw{};

  double step_mfu(const StepReport& r) const {
    return trainer && peak > 0 ? mfu(trainer->model_flops(static_cast<double>(r.samples)), r.step_seconds, peak) : -1;
  }

  void operator()(const StepReport& r) {
    if (json) return print_json(r);
    if (r.step % every == 0 || r.step == 1 || r.step == r.total_steps || r.step_skipped) {
      char line[320];
      std::snprintf(line, sizeof line, "step %*lld/%lld  epoch %3lld  loss %.4f  acc %5.1f%%  %s %s/s",
                    static_cast<int>(std::to_string(r.total_steps).size()),
                    static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
                    static_cast<long long>(r.epoch), r.loss, 100.0 * r.accuracy,
                    with_commas(static_cast<int64_t>(std::llround(r.samples_per_sec))).c_str(), unit);
      if (const double m = step_mfu(r); m >= 0) {
        const size_t len = std::strlen(line);
        std::snprintf(line + len, sizeof line - len, "  MFU %.1f%%", 100.0 * m);
      }
      if (r.overlap >= 0) {
        const size_t len = std::strlen(line);
        std::snprintf(line + len, sizeof line - len, "  overlap %3.0f%%%s", 100.0 * r.overlap,
                      r.step == 1 && one_first_bucket ? " (iteration 1: one bucket, all-reduced after backward)" : "");
      }
      if (r.loss_scale > 0) {
        const size_t len = std::strlen(line);
        std::snprintf(line + len, sizeof line - len, "  scale %g%s", static_cast<double>(r.loss_scale),
                      r.step_skipped ? "  SKIPPED: inf/NaN in the gradients, scale halved" : "");
      }
      if (r.grad_norm >= 0) {  // --clip-grad-norm: the norm before clipping, and the factor applied
        const size_t len = std::strlen(line);
        if (r.clip_coef < 1) std::snprintf(line + len, sizeof line - len, "  grad norm %.6g clipped x%.6g", r.grad_norm, r.clip_coef);
        else std::snprintf(line + len, sizeof line - len, "  grad norm %.6g", r.grad_norm);
      }
      if (bar) io.err << "\r\033[K" << std::flush;
      io.out << line << "\n" << std::flush;
    }
    // Redraw at most 10 times a second: a fast run would otherwise spend its time on the terminal.
    auto now = std::chrono::steady_clock::now();
    if (bar && (now - last_draw > std::chrono::milliseconds(100) || r.step == r.total_steps)) {
      last_draw = now;
      const int width = 30;
      int filled = static_cast<int>(width * r.step / r.total_steps);
      char tail[96];
      std::snprintf(tail, sizeof tail, "] %lld/%lld  loss %.4f", static_cast<long long>(r.step),
                    static_cast<long long>(r.total_steps), r.loss);
      io.err << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << tail
             << std::flush;
    }
  }

  void print_json(const StepReport& r) {
    nlohmann::json j = {{"step", r.step},         {"epoch", r.epoch},
                        {"loss", r.loss},         {"accuracy", r.accuracy},
                        {"batch", r.batch_size},  {"samples", r.samples},
                        {"samples_per_sec", r.samples_per_sec},
                        {"step_ms", r.step_seconds * 1e3}};
    if (const double m = step_mfu(r); m >= 0) j["mfu"] = m;
    if (r.overlap >= 0) j["overlap"] = r.overlap;
    if (branch) j["branch_taken"] = r.branch_taken;
    if (!r.bubble.empty()) j["bubble"] = r.bubble;
    if (r.loss_scale > 0) j["loss_scale"] = r.loss_scale, j["skipped"] = r.step_skipped;
    if (r.grad_norm >= 0) j["grad_norm"] = r.grad_norm, j["clip_coef"] = r.clip_coef;
    io.out << j.dump() << "\n";
  }
};

void print_json_summary(std::ostream& out, const TrainConfig& c, const TrainSummary& s) {
  nlohmann::json j = {{"summary", true},
                      {"steps", s.steps},
                      {"seconds", s.seconds},
                      {"samples_per_sec", s.samples_per_sec},
                      {"train_loss", s.eval_loss},
                      {"train_accuracy", s.eval_accuracy},
                      {"peak_bytes", s.memory.total_peak},
                      {"effective_batch", s.effective_batch}};
  if (c.strategy == Strategy::Ddp || c.strategy == Strategy::Dp) {
    j["world"] = c.world_size;
    if (s.mean_overlap >= 0) j["overlap"] = s.mean_overlap;
    else j["overlap"] = nullptr;  // no all-reduce to overlap (one replica)
    if (c.strategy == Strategy::Ddp) j["buckets"] = s.buckets, j["buckets_rebuilt"] = s.buckets_rebuilt;
    nlohmann::json mem = nlohmann::json::array();
    for (const MemoryStats& m : s.rank_memory) {
      nlohmann::json r;
      for (int i = 0; i < kNumMemCategories; i++) r[std::string(mem_category_name(static_cast<MemCategory>(i)))] = m.current[static_cast<size_t>(i)];
      r["peak"] = m.total_peak;
      mem.push_back(r);
    }
    j["rank_memory"] = mem;
  }
  if (c.strategy == Strategy::Pipeline) j["pipeline"] = pipeline_json(s);
  j["precision"] = precision_name(c.precision);
  if (c.precision == Precision::FP16) j["loss_scale"] = s.loss_scale, j["rank_skipped_steps"] = s.rank_skipped_steps;
  if (!c.save_path.empty()) j["saved"] = c.save_path;
  if (!c.save_sharded_path.empty()) j["saved_sharded"] = c.save_sharded_path;
  out << j.dump() << "\n";
}

// Memory per category at the peak of the last iteration: every rank's when they agree, else rank 0's
// (and, for DataParallel, a replica's).
void print_memory(std::ostream& out, const TrainConfig& c, const TrainSummary& s) {
  bool same = true;
  for (const MemoryStats& m : s.rank_memory)
    same = same && m.current == s.memory.current && m.peak == s.memory.peak;
  if (s.rank_memory.size() > 1 && same)
    out << "memory (each of the " << s.rank_memory.size() << " ranks, peak of the last iteration):";
  else
    out << "memory (rank 0, peak of the last iteration):";
  const char* sep = " ";  // the first category shown may not be the first (sharded bf16: no "parameters")
  for (int i = 0; i < kNumMemCategories; i++) {
    if (s.memory.peak[i] == 0) continue;
    out << sep << mem_category_name(static_cast<MemCategory>(i)) << " " << human_bytes(s.memory.peak[i]);
    sep = ", ";
  }
  out << "; total " << human_bytes(s.memory.total_peak) << "\n";
  if (c.strategy == Strategy::Dp && s.rank_memory.size() > 1) {  // a replica: nothing of the model between iterations
    const MemoryStats& m = s.rank_memory[1];
    out << "memory (rank 1, a replica, peak of the last iteration):";
    for (int i = 0; i < kNumMemCategories; i++)
      if (m.peak[i] != 0) out << " " << mem_category_name(static_cast<MemCategory>(i)) << " " << human_bytes(m.peak[i]) << ",";
    out << " total " << human_bytes(m.total_peak) << "; after it: " << human_bytes(m.total_current) << "\n";
  }
}

// --activation-checkpointing: the measured activations beside the planner's prediction, with and
// without it, of what rank 0 holds: the model's own buffers (16-bit under --precision, with the batch
// rounded to 16 bits and the logits widened back), LoRA's float32 scratch, the loss's probabilities and
// their gradient (2 x rows x classes floats) and, under DataParallel, the outputs gathered from every
// replica (the loss runs on rank 0 over the whole batch of --batch x --world rows).
void print_checkpointing(std::ostream& out, const TrainConfig& c, const TrainSummary& s) {
  const int64_t measured = s.memory.peak[static_cast<int>(MemCategory::Activations)];
  if (c.strategy == Strategy::Pipeline) {  // the prediction is the whole model's; a stage holds a part
    out << "activation checkpointing: each stage keeps only its blocks' outputs per micro-batch in flight "
           "(the activations column above)\n";
    return;
  }
  if (c.tp > 1) {  // mlp_activation_bytes plans an unsplit model, not a shard with its f and g buffers
    out << "activation checkpointing: activations peak " << human_bytes(measured) << " on each --tp " << c.tp
        << " shard (the planner predicts unsplit models only)\n";
    return;
  }
  const bool half = c.precision != Precision::FP32;
  const bool gpt = c.model.is_gpt();
  // Per sample: the model's input (an MLP's D features; a GPT's T token ids, which no dtype rounds)
  // and outputs (C classes; a GPT's T x V logits).
  const int64_t F = sizeof(float), B = c.batch, T = c.model.rows_per_sample();
  const int64_t C = c.model.out_features() * T, D = gpt ? 0 : c.model.in_features();
  const bool dp = c.strategy == Strategy::Dp;
  const int64_t rows = dp ? B * c.world_size : B;  // the loss's rows on rank 0
  auto model = [&](bool ckpt) {
    if (gpt) return gpt_activation_bytes(c.model.gpt, B, ckpt, {}, half ? 2 : 4);  // (its 16-bit copies included)
    const int64_t m = mlp_activation_bytes(c.model, B, ckpt);
    return half ? m / 2 + B * D * 2 + B * C * F : m;  // x.to(dtype), and the logits widened for the loss
  };
  // 16 bits: an MLP's LoRA scratch is the CPU emulation's float32, counted as other memory
  // (model_half.cpp); a GPT's is 16-bit activations (GptCore).
  const int64_t lora = gpt ? gpt_lora_activation_bytes(c.model.gpt, c.lora, B, {}, half ? 2 : 4)
                           : half ? 0 : mlp_lora_activation_bytes(c.model, c.lora, B);
  // DataParallel on rank 0: the gathered outputs in float32, and in 16 bits the whole batch's input,
  // outputs and output gradients rounded (engine/parallel/data_parallel.cpp).
  const int64_t gather = dp ? rows * C * F + (half ? rows * (D + 2 * C) * 2 : 0) : 0;
  const int64_t rest = lora + 2 * rows * C * F + gather;
  const int64_t with = model(true) + rest, without = model(false) + rest;
  std::string terms = "the model's " + std::string(half ? "16-bit " : "") + "buffers for a batch of " + std::to_string(B);
  if (lora > 0) terms += ", LoRA's scratch";
  terms += dp ? ", the loss's 2 x rows x classes floats and the gathered outputs over all " + std::to_string(rows) + " rows"
              : " and the loss's 2 x batch x classes floats";
  out << "activation checkpointing: activations peak " << human_bytes(measured) << "; predicted " << human_bytes(with) << " ("
      << human_bytes(without) << " without, "
      << (without >= with ? human_bytes(without - with) + " saved" : human_bytes(with - without) + " more") << "; " << terms
      << (measured == with ? ")\n" : "; the measured peak differs)\n");
}

// --precision bf16/fp16: the bytes per parameter of each part (rank 0's memory at the end over the
// model's parameter count: a sharded rank shows ZeRO's 16 / N), and fp16's loss scale and skipped
// steps. A pipeline rank holds only its stages, so it divides by the parameters it holds (its
// 16-bit parameters' bytes / 2).
// --amp (torch.autocast) prints the same figures: float32 parameters, no master copy.
void print_precision(std::ostream& out, const TrainConfig& c, const TrainSummary& s) {
  const bool stages = c.strategy == Strategy::Pipeline, amp = is_mixed(c.amp);
  const Precision p = amp ? c.amp : c.precision;
  const double P = stages ? static_cast<double>(s.memory.current_of(MemCategory::Parameters)) / (amp ? 4.0 : 2.0)
                          : static_cast<double>(c.model.num_params());
  auto per = [&](MemCategory k) { return P > 0 ? static_cast<double>(s.memory.current_of(k)) / P : 0.0; };
  char line[288];
  std::snprintf(line, sizeof line, "%s %s%s: bytes per parameter%s: parameters %g, gradients %g, master weights %g, "
                "optimizer state %g (total %g)", amp ? "autocast" : "mixed precision", precision_name(p),
                !amp ? "" : c.model.is_gpt() ? " (16-bit matmul outputs, held in float32 memory; float32 parameters)"
                                             : " (16-bit activations, float32 parameters)",
                stages ? " of rank 0's stages" : "",
                per(MemCategory::Parameters), per(MemCategory::Gradients),
                per(MemCategory::MasterWeights), per(MemCategory::OptimizerState),
                per(MemCategory::Parameters) + per(MemCategory::Gradients) + per(MemCategory::MasterWeights) + per(MemCategory::OptimizerState));
  out << line << "\n";
  if (p != Precision::FP16 || s.rank_skipped_steps.empty()) return;
  const std::vector<int64_t>& skipped = s.rank_skipped_steps.front();
  // Launched, this process (rank 0) ran one rank and knows its own skips only: every rank took the
  // same decision from the all-reduced found-inf flag, but only rank 0's is printed as measured.
  const bool launched = c.launched || c.backend == "socket";
  bool same = true;
  for (const auto& r : s.rank_skipped_steps) same = same && r == skipped;
  std::string list;
  for (int64_t k : skipped) list += (list.empty() ? "" : ", ") + std::to_string(k);
  out << "loss scale " << s.loss_scale << " at the end; skipped steps (inf/NaN in the gradients): "
      << (skipped.empty() ? "none" : list)
      << (launched ? " on rank 0 (each process knows its own)"
                   : same ? (s.rank_skipped_steps.size() > 1 ? ", on every rank" : "") : "; the ranks disagree")
      << "\n";
}

void print_summary(std::ostream& out, const Trainer& trainer, const TrainSummary& s) {
  const TrainConfig& c = trainer.config();
  char line[256];
  std::snprintf(line, sizeof line,
                "done: %lld step%s in %s (%s %s/s); %s: loss %.4f, accuracy %.1f%% (%lld/%lld)",
                static_cast<long long>(s.steps), s.steps == 1 ? "" : "s", human_seconds(s.seconds).c_str(),
                with_commas(static_cast<int64_t>(std::llround(s.samples_per_sec))).c_str(), c.model.is_gpt() ? "tokens" : "samples",
                c.eval_samples > 0 ? ("the training set's first " + std::to_string(c.eval_samples) + " samples").c_str() : "training set",
                s.eval_loss, 100.0 * s.eval_accuracy, static_cast<long long>(s.eval_correct),
                static_cast<long long>(s.eval_samples));
  out << line << "\n";
  if (c.strategy == Strategy::Ddp) {
    char ov[160];
    if (s.mean_overlap >= 0)
      std::snprintf(ov, sizeof ov, "mean overlap %.0f%% of all-reduce time hidden behind backward (modeled, %s)",
                    100.0 * s.mean_overlap, c.profile.c_str());
    else  // one replica (--world = --tp): DDP has no gradient all-reduce to hide
      std::snprintf(ov, sizeof ov, "no gradient all-reduce: one replica (--world %d = --tp %d), so nothing to overlap",
                    c.world_size, c.tp);
    out << ov << "\n";
    if (s.buckets_rebuilt) {
      out << "buckets rebuilt after iteration 1 in gradient-ready order:\n";
      for (const std::string& b : s.buckets) out << "    " << b << "\n";
    }
  }
  if (c.strategy == Strategy::Dp && s.mean_overlap >= 0) {
    char ov[160];
    std::snprintf(ov, sizeof ov, "mean overlap %.0f%% of the gradient reduce hidden behind backward (modeled, %s): "
                  "it starts once every replica's backward has finished", 100.0 * s.mean_overlap, c.profile.c_str());
    out << ov << "\n";
  }
  if (c.strategy == Strategy::Pipeline) print_pipeline_summary(out, trainer, s);
  print_memory(out, c, s);
  if (c.activation_checkpointing) print_checkpointing(out, c, s);
  if (is_mixed(c.precision) || is_mixed(c.amp)) print_precision(out, c, s);
  if (!c.trace_path.empty()) out << "trace written to " << c.trace_path << " (open it in ui.perfetto.dev)\n";
  if (!c.save_path.empty())
    out << "saved " << c.save_path << " (step " << s.start_step + s.steps << ")\n";
  if (!c.save_sharded_path.empty())
    out << "saved a sharded checkpoint in " << c.save_sharded_path << " (one file per rank that owns "
        << "parameters, and index.json; step " << s.start_step + s.steps << ")\n";
}

// Prints the run as it goes.
int report_run(TrainArgs& a, Streams& given, Trainer& trainer) {
  // Under `dtlab-cli launch` only rank 0 reports; the other ranks stay quiet unless they fail.
  std::ostream discard(nullptr);
  Streams quiet{discard, given.err, false};
  Streams& io = a.cfg.launched && a.cfg.socket.rank != 0 ? quiet : given;
  const TrainConfig& c = trainer.config();
  if (!a.json) print_header(a, io.out, trainer);
  StepPrinter printer{io, a.json, io.terminal && !a.json, c.skip_layer >= 0,
                      a.log_every > 0 ? a.log_every : std::max<int64_t>(1, trainer.total_steps() / 20)};
  if (c.model.is_gpt()) printer.unit = "tokens";
  printer.trainer = &trainer;
  printer.peak = trainer.peak_flops();
  printer.one_first_bucket = c.strategy == Strategy::Ddp && c.accum == 1 && !c.ddp.find_unused_parameters &&
                             !c.ddp.sized_first_iteration && c.ddp.rebuild_buckets;
  TrainSummary s = trainer.run(printer);
  if (printer.bar) io.err << "\r\033[K" << std::flush;
  if (a.json) print_json_summary(io.out, c, s);
  else print_summary(io.out, trainer, s);
  return 0;
}

int run_train(TrainArgs& a, Streams& io) {
  finish_config(a);
  Trainer trainer(a.cfg);
  if (io.mode == Mode::CheckConfig) return 0;  // every check passed; train nothing
  return report_run(a, io, trainer);
}

// The flags of dtlab-cli train that set no run setting: how it reports.
void add_output_flags(CLI::App& app, TrainArgs& a) {
  app.add_flag("--json", a.json, "Print JSON Lines: one object per step, then a summary");
  app.add_option("--log-every", a.log_every, "Print every N steps (default: about 20 lines)")->check(whole_number(1, int64_t{1} << 40));
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  a->cfg.steps = 300;  // unless --epochs
  add_train_flags(app, a->flags, a->cfg, SettingScope::Cli);
  a->flags.option("--steps")->excludes(a->flags.option("--epochs"));
  add_output_flags(app, *a);
  return [a](Streams& io) { return run_train(*a, io); };
}

}  // namespace dtlab::cli
