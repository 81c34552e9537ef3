// dtlab-cli train: one training run, printed as it goes (human lines or JSON Lines).
#include <filesystem>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/train_pipeline.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/checkpoint.h"
#include "engine/train/device_probe.h"
#include "engine/train/train.h"

namespace dtlab::cli {

namespace {

struct TrainArgs {
  TrainConfig cfg;
  std::string model = "mlp:2,64,64,3";
  CLI::Option* model_opt = nullptr;
  std::string optimizer = "adamw";
  double lr = 0, momentum = 0, weight_decay = 0;
  bool json = false;
  int64_t log_every = 0;
  std::string trace_clock = "wall";
  std::string device = "cpu", device_why;
  CLI::Option *world_opt = nullptr, *device_opt = nullptr, *backend_opt = nullptr;
  double bucket_cap_mb = 25, first_bucket_mb = 1;
  bool static_buckets = false;
  std::vector<std::string> faults;
  PipelineArgs pipeline;
  std::string sharding = "full", wrap = "layer", backward_prefetch = "pre";
  CLI::Option *sharding_opt = nullptr, *wrap_opt = nullptr, *bp_opt = nullptr, *fp_opt = nullptr, *node_opt = nullptr;
  CLI::Option *bucket_opt = nullptr, *first_bucket_opt = nullptr, *find_unused_opt = nullptr,
              *view_opt = nullptr, *static_opt = nullptr, *sized_first_opt = nullptr;
  CLI::Option *lr_opt = nullptr, *wd_opt = nullptr, *momentum_opt = nullptr, *steps_opt = nullptr,
              *epochs_opt = nullptr;
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

// Fills what depends on other flags: the model (from --init when --model is absent) and the
// optimizer's defaults, which differ per optimizer.
void finish_config(TrainArgs& a) {
  TrainConfig& c = a.cfg;
  // Continuing from a checkpoint without --model: take the model the checkpoint holds.
  std::string spec = a.model;
  if (!c.init_path.empty() && a.model_opt->count() == 0) {
    CheckpointInfo info = read_checkpoint_info(c.init_path);
    if (!info.model_spec.empty()) spec = info.model_spec;
  }
  c.model = ModelSpec::parse(spec);
  c.optimizer = default_optimizer_config(parse_optimizer_kind(a.optimizer));
  const bool sgd = c.optimizer.kind == OptimizerKind::SGD;
  if (!sgd && a.momentum_opt->count() > 0)
    throw Error("--momentum applies to --optimizer sgd; AdamW keeps its own moments (betas 0.9, 0.999)");
  if (a.lr_opt->count()) c.optimizer.lr = a.lr;
  if (a.wd_opt->count()) c.optimizer.weight_decay = a.weight_decay;
  if (sgd) c.optimizer.momentum = a.momentum;
  if (a.steps_opt->count() == 0 && a.epochs_opt->count() == 0) c.steps = 300;
  if (a.trace_clock != "wall" && a.trace_clock != "modeled")
    throw Error("--trace-clock " + a.trace_clock + " is not a clock; use wall or modeled");
  c.trace_modeled = a.trace_clock == "modeled";
  find_profile(c.profile);  // a bad name fails here, before any work
  if (c.strategy != "ddp") {
    for (CLI::Option* o : {a.bucket_opt, a.first_bucket_opt, a.find_unused_opt, a.view_opt, a.static_opt, a.sized_first_opt})
      if (o->count() > 0)
        throw Error(o->get_name() + " configures DDP's buckets; add --strategy ddp --world N");
  }
  // torch: bucket_cap_mb * 1024 * 1024 bytes (MB here means MiB, as in torch).
  c.ddp.bucket_cap_bytes = static_cast<int64_t>(a.bucket_cap_mb * 1048576.0);
  // Current torch: an explicit bucket_cap_mb makes the first bucket as large as the others
  // (dtlab's --first-bucket-mb plays torch's dist._DEFAULT_FIRST_BUCKET_BYTES when given).
  const bool first_from_cap = a.bucket_opt->count() > 0 && a.first_bucket_opt->count() == 0;
  c.ddp.first_bucket_bytes = first_from_cap ? c.ddp.bucket_cap_bytes : static_cast<int64_t>(a.first_bucket_mb * 1048576.0);
  if (c.ddp.bucket_cap_bytes < 1) throw Error("--bucket-cap-mb is too small: a bucket must hold at least 1 byte");
  if (c.ddp.first_bucket_bytes < 1) throw Error("--first-bucket-mb is too small: a bucket must hold at least 1 byte");
  c.ddp.rebuild_buckets = !a.static_buckets;
  for (const std::string& f : a.faults) c.faults.push_back(parse_fault(f));
  if (c.strategy != "fsdp") {
    for (CLI::Option* o : {a.sharding_opt, a.wrap_opt, a.bp_opt, a.fp_opt, a.node_opt})
      if (o->count() > 0) throw Error(o->get_name() + " configures FSDP; add --strategy fsdp --world N");
  }
  c.fsdp.sharding = parse_sharding(a.sharding);
  if (a.wrap != "layer" && a.wrap != "model") throw Error("--wrap " + a.wrap + " is not a wrap policy; use layer (one unit per Linear) or model");
  c.fsdp.wrap_layers = a.wrap == "layer";
  c.fsdp.backward_prefetch = parse_backward_prefetch(a.backward_prefetch);
  if (c.backend == "socket") {  // one rank of a world of processes: rank and world from the launcher
    c.socket = socket_options_from_env();
    if (a.world_opt->count() == 0) c.world_size = c.socket.world_size;
  }
  // Where the ranks run: what was asked, else the defaults of engine/train/device_select.h.
  // DTLAB_DEVICE gives --device's default (the test suites pin cpu with it).
  DeviceQuery q;
  q.device = a.device_opt->count() ? a.device : "";
  q.backend = a.backend_opt->count() ? c.backend : "";
  q.strategy = c.strategy;
  q.ranks_on_node = c.world_size;
  if (c.backend == "socket") {
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    q.ranks_on_node = local ? std::max(1, std::atoi(local)) : 1;
  }
  probe_devices(q);
  const DeviceChoice dc = resolve_device(q);
  c.device = dc.device;
  c.launched = dc.launched;
  if (c.device == "cuda") c.backend = dc.backend;
  a.device_why = dc.why;
  finish_pipeline_config(a.pipeline, c, a.world_opt->count() > 0);
  if (!c.faults.empty() && c.strategy == "single")
    throw Error("--fault injects into the ranks' collectives; add --strategy ddp (or fsdp) --world N");
}

// Prints the run as it goes.
int report_run(TrainArgs& a, Streams& given, Trainer& trainer) {
  // Under `dtlab-cli launch` only rank 0 reports; the other ranks stay quiet unless they fail.
  std::ostream discard(nullptr);
  Streams quiet{discard, given.err, false};
  Streams& io = a.cfg.launched && a.cfg.socket.rank != 0 ? quiet : given;
  const TrainConfig& c = trainer.config();
  const Dataset& ds = trainer.dataset();
  const int64_t total = trainer.total_steps();
  const int64_t every = a.log_every > 0 ? a.log_every : std::max<int64_t>(1, total / 20);
  const bool bar = io.terminal && !a.json;

  if (!a.json) {
    io.out << "dtlab train: " << c.model.str() << " (" << with_commas(c.model.num_params())
           << " parameters) on " << ds.name << " (" << with_commas(ds.n) << " samples, " << ds.d
           << " features, " << ds.num_classes << " classes)\n";
    io.out << "  strategy " << c.strategy << ", world " << c.world_size << ", batch " << c.batch
           << ", " << total << " steps (" << trainer.batches_per_epoch() << " batches per epoch), "
           << c.optimizer.str() << ", seed " << c.seed << ", shuffle "
           << (c.shuffle ? "on" : "off") << (c.drop_last ? ", drop_last" : "") << "\n";
    bool pipeline_printed = false;
    if (c.strategy == "pipeline") print_pipeline_header(io.out, trainer), pipeline_printed = true;
    if (!pipeline_printed && (c.accum > 1 || c.world_size > 1))
      io.out << "  effective batch " << trainer.effective_batch() << " = " << c.batch << " per rank x "
             << c.world_size << (c.world_size == 1 ? " rank" : " ranks") << " x " << c.accum
             << " accumulation " << (c.accum == 1 ? "step" : "steps") << "\n";
    if (c.skip_layer >= 0)
      io.out << "  branch: every " << c.skip_every << (c.skip_every == 1 ? " step" : " steps")
             << " the forward " << (c.skip_ranks.empty() ? std::string("of every rank") : "of " + ranks_text(c.skip_ranks))
             << " bypasses layer " << c.skip_layer << " (its parameters get no gradient)\n";
    if (c.strategy == "ddp") {
      io.out << "  DDP: bucket cap " << human_bytes(c.ddp.bucket_cap_bytes) << ", first bucket "
             << human_bytes(c.ddp.first_bucket_bytes)
             << (c.ddp.find_unused_parameters ? ", find_unused_parameters" : "")
             << (c.ddp.gradient_as_bucket_view ? ", gradient_as_bucket_view" : "")
             << (c.ddp.rebuild_buckets && !c.ddp.find_unused_parameters ? ", buckets rebuilt after iteration 1" : ", static buckets")
             << "; all-reduce order"
             << (c.ddp.find_unused_parameters || c.ddp.sized_first_iteration ? ""
                     : " in iteration 1 (one bucket, as torch does with find_unused_parameters=False)")
             << ":\n";
      for (const std::string& line : trainer.planned_buckets()) io.out << "    " << line << "\n";
    }
    if (c.strategy == "dp")
      io.out << "  DataParallel: rank 0 loads batches of " << c.batch * c.world_size << " and scatters "
             << c.batch << " samples to each of the " << c.world_size << " devices; every forward broadcasts the "
             << human_bytes(c.model.num_params() * static_cast<int64_t>(sizeof(float)))
             << " of parameters from rank 0, every backward reduce-adds the gradients onto rank 0, which alone steps\n";
    if (c.strategy == "fsdp")
      io.out << "  FSDP: " << sharding_name(c.fsdp.sharding)
             << (c.fsdp.sharding == Sharding::Hybrid
                     ? " (node groups of " + std::to_string(trainer.config().fsdp.node_size) + " ranks)" : std::string())
             << ", units: "
             << (c.fsdp.wrap_layers ? "one per Linear layer" : "the whole model") << ", backward prefetch "
             << backward_prefetch_name(c.fsdp.backward_prefetch) << (c.fsdp.forward_prefetch ? ", forward prefetch" : "") << "\n";
    if (!c.init_path.empty()) io.out << "  initialized from " << c.init_path << "\n";
    io.out << "  device " << c.device << ", backend " << c.backend << " (" << a.device_why << ")\n";
    if (c.device == "cuda") io.out << "  " << trainer.describe_placement() << "\n";
    if (c.backend == "socket")
      io.out << "  backend socket: " << c.world_size << " processes, rank 0 at " << c.socket.master_addr << ":"
             << c.socket.master_port << "\n";
    if (c.monitor_port != 0)
      io.out << "  monitor: paused until a viewer attaches (up to " << seconds_text(c.monitor_wait_s)
             << "): dtlab --attach " << c.socket.master_addr << ":" << c.monitor_port << "\n";
    io.out.flush();
  }

  auto last_draw = std::chrono::steady_clock::time_point{};
  auto on_step = [&](const StepReport& r) {
    if (a.json) {
      nlohmann::json j = {{"step", r.step},         {"epoch", r.epoch},
                          {"loss", r.loss},         {"accuracy", r.accuracy},
                          {"batch", r.batch_size},  {"samples", r.samples},
                          {"samples_per_sec", r.samples_per_sec},
                          {"step_ms", r.step_seconds * 1e3}};
      if (r.overlap >= 0) j["overlap"] = r.overlap;
      if (c.skip_layer >= 0) j["branch_taken"] = r.branch_taken;
      if (!r.bubble.empty()) j["bubble"] = r.bubble;
      io.out << j.dump() << "\n";
      return;
    }
    if (r.step % every == 0 || r.step == 1 || r.step == r.total_steps) {
      char line[200];
      std::snprintf(line, sizeof line, "step %*lld/%lld  epoch %3lld  loss %.4f  acc %5.1f%%  %s samples/s",
                    static_cast<int>(std::to_string(r.total_steps).size()),
                    static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
                    static_cast<long long>(r.epoch), r.loss, 100.0 * r.accuracy,
                    with_commas(static_cast<int64_t>(std::llround(r.samples_per_sec))).c_str());
      if (r.overlap >= 0) {
        const size_t len = std::strlen(line);
        std::snprintf(line + len, sizeof line - len, "  overlap %3.0f%%", 100.0 * r.overlap);
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
  };
  TrainSummary s = trainer.run(on_step);
  if (bar) io.err << "\r\033[K" << std::flush;

  if (a.json) {
    nlohmann::json j = {{"summary", true},
                        {"steps", s.steps},
                        {"seconds", s.seconds},
                        {"samples_per_sec", s.samples_per_sec},
                        {"train_loss", s.eval_loss},
                        {"train_accuracy", s.eval_accuracy},
                        {"peak_bytes", s.memory.total_peak},
                        {"effective_batch", s.effective_batch}};
    if (c.strategy == "ddp" || c.strategy == "dp") {
      j["world"] = c.world_size;
      j["overlap"] = s.mean_overlap;
      if (c.strategy == "ddp") j["buckets"] = s.buckets, j["buckets_rebuilt"] = s.buckets_rebuilt;
      nlohmann::json mem = nlohmann::json::array();
      for (const MemoryStats& m : s.rank_memory) {
        nlohmann::json r;
        for (int i = 0; i < kNumMemCategories; i++) r[std::string(mem_category_name(static_cast<MemCategory>(i)))] = m.current[static_cast<size_t>(i)];
        r["peak"] = m.total_peak;
        mem.push_back(r);
      }
      j["rank_memory"] = mem;
    }
    if (c.strategy == "pipeline") j["pipeline"] = pipeline_json(s);
    if (!c.save_path.empty()) j["saved"] = c.save_path;
    if (!c.save_sharded_path.empty()) j["saved_sharded"] = c.save_sharded_path;
    io.out << j.dump() << "\n";
    return 0;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "done: %lld steps in %s (%s samples/s); training set: loss %.4f, accuracy %.1f%% (%lld/%lld)",
                static_cast<long long>(s.steps), human_seconds(s.seconds).c_str(),
                with_commas(static_cast<int64_t>(std::llround(s.samples_per_sec))).c_str(),
                s.eval_loss, 100.0 * s.eval_accuracy, static_cast<long long>(s.eval_correct),
                static_cast<long long>(s.eval_samples));
  io.out << line << "\n";
  if (c.strategy == "ddp") {
    char ov[96];
    std::snprintf(ov, sizeof ov, "mean overlap %.0f%% of all-reduce time hidden behind backward (modeled, %s)",
                  100.0 * s.mean_overlap, c.profile.c_str());
    io.out << ov << "\n";
    if (s.buckets_rebuilt) {
      io.out << "buckets rebuilt after iteration 1 in gradient-ready order:\n";
      for (const std::string& b : s.buckets) io.out << "    " << b << "\n";
    }
  }
  if (c.strategy == "dp" && s.mean_overlap >= 0) {
    char ov[160];
    std::snprintf(ov, sizeof ov, "mean overlap %.0f%% of the gradient reduce hidden behind backward (modeled, %s): "
                  "it starts once every replica's backward has finished", 100.0 * s.mean_overlap, c.profile.c_str());
    io.out << ov << "\n";
  }
  if (c.strategy == "pipeline") print_pipeline_summary(io.out, trainer, s);
  bool same = true;
  for (const MemoryStats& m : s.rank_memory)
    same = same && m.current == s.memory.current && m.peak == s.memory.peak;
  if (s.rank_memory.size() > 1 && same)
    io.out << "memory (each of the " << s.rank_memory.size() << " ranks, peak of the last iteration):";
  else
    io.out << "memory (rank 0, peak of the last iteration):";
  for (int i = 0; i < kNumMemCategories; i++) {
    if (s.memory.peak[i] == 0) continue;
    io.out << (i ? ", " : " ") << mem_category_name(static_cast<MemCategory>(i)) << " "
           << human_bytes(s.memory.peak[i]);
  }
  io.out << "; total " << human_bytes(s.memory.total_peak) << "\n";
  if (c.strategy == "dp" && s.rank_memory.size() > 1) {  // a replica: nothing of the model between iterations
    const MemoryStats& m = s.rank_memory[1];
    io.out << "memory (rank 1, a replica, peak of the last iteration):";
    for (int i = 0; i < kNumMemCategories; i++)
      if (m.peak[i] != 0) io.out << " " << mem_category_name(static_cast<MemCategory>(i)) << " " << human_bytes(m.peak[i]) << ",";
    io.out << " total " << human_bytes(m.total_peak) << "; after it: " << human_bytes(m.total_current) << "\n";
  }
  if (!c.trace_path.empty()) io.out << "trace written to " << c.trace_path << " (open it in ui.perfetto.dev)\n";
  if (!c.save_path.empty())
    io.out << "saved " << c.save_path << " (step " << s.start_step + s.steps << ")\n";
  if (!c.save_sharded_path.empty())
    io.out << "saved a sharded checkpoint in " << c.save_sharded_path << " (one file per rank that owns "
           << "parameters, and index.json; step " << s.start_step + s.steps << ")\n";
  return 0;
}

int run_train(TrainArgs& a, Streams& io) {
  finish_config(a);
  Trainer trainer(a.cfg);
  return report_run(a, io, trainer);
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  TrainConfig& c = a->cfg;
  app.add_option("--strategy", c.strategy, "Parallel strategy: single | ddp | dp (torch.nn.DataParallel) | fsdp | pipeline")->capture_default_str();
  a->backend_opt = app.add_option("--backend", c.backend, "Where ranks run: threads (all in this process) | cuda (threads sharing a GPU) | nccl (one GPU per rank) | socket (one process per rank, as dtlab-cli launch starts them); default: nccl with a GPU per rank, cuda with fewer GPUs, else threads");
  a->device_opt = app.add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present, else cpu; DTLAB_DEVICE sets it)");
  a->world_opt = app.add_option("--world", c.world_size, "Number of ranks (for strategies that use several)")->check(whole_number(1, 64));
  a->model_opt = app.add_option("--model", a->model, "Model spec mlp:D0,D1,...,Dk (with --init: the checkpoint's)")->capture_default_str();
  app.add_option("--data", c.data, "spiral | blobs | PATH.npz (with options, e.g. spiral:classes=4,points=500)")->capture_default_str();
  app.add_option("--batch", c.batch, "Batch size per rank")->check(whole_number(1, int64_t{1} << 24))->capture_default_str();
  a->steps_opt = app.add_option("--steps", c.steps, "Number of optimizer steps (default 300)")->check(whole_number(1, int64_t{1} << 40));
  a->epochs_opt = app.add_option("--epochs", c.epochs, "Number of epochs")->check(whole_number(1, int64_t{1} << 30));
  a->steps_opt->excludes(a->epochs_opt);
  app.add_option("--optimizer", a->optimizer, "sgd | adamw")->capture_default_str();
  a->lr_opt = app.add_option("--lr", a->lr, "Learning rate (default 0.1 for sgd, 0.01 for adamw)")->check(real_number(1e-12, 1e6));
  a->momentum_opt = app.add_option("--momentum", a->momentum, "SGD momentum (default 0)")->check(real_number(0, 0.999999));
  a->wd_opt = app.add_option("--weight-decay", a->weight_decay, "Weight decay (default 0 for sgd, 0.01 for adamw, as torch)")->check(real_number(0, 1e6));
  app.add_option("--seed", c.seed, "Seed for the model init (torch.manual_seed) and the sampler")->check(whole_number(0, (int64_t{1} << 32) - 1))->capture_default_str();
  app.add_flag("--shuffle,!--no-shuffle", c.shuffle, "Shuffle each epoch (default on)");
  app.add_flag("--drop-last", c.drop_last, "Drop the last partial batch of each epoch");
  app.add_option("--init", c.init_path, "Start from a checkpoint's parameters: a safetensors file or a --save-sharded directory (the optimizer state starts fresh)")
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            std::error_code ec;
            return std::filesystem::exists(path, ec) ? "" : "'" + path + "' does not exist; check the path";
          },
          "PATH"));
  app.add_option("--save", c.save_path, "Write a safetensors checkpoint at the end (atomic)")->check(output_path());
  app.add_option("--save-sharded", c.save_sharded_path, "FSDP: write a sharded checkpoint directory at the end (one file per rank plus index.json)")->check(output_path());
  app.add_flag("--json", a->json, "Print JSON Lines: one object per step, then a summary");
  app.add_option("--trace", c.trace_path, "Write a Chrome trace (Perfetto, chrome://tracing) of the run")->check(output_path());
  app.add_option("--trace-clock", a->trace_clock, "Timeline of --trace: wall or modeled")->capture_default_str();
  app.add_option("--profile", c.profile, "Hardware profile of the modeled clock: nvlink8, pcie8, ib2x4, eth2x4, this, ideal (free communication)")->capture_default_str();
  app.add_option("--log-every", a->log_every, "Print every N steps (default: about 20 lines)")->check(whole_number(1, int64_t{1} << 40));
  app.add_option("--threads", c.threads, "BLAS threads (default: OpenBLAS's choice)")->check(whole_number(0, 256));
  app.add_option("--accum", c.accum, "Gradient accumulation: micro-batches per optimizer step (DDP's no_sync for all but the last)")->check(whole_number(1, 1 << 20))->capture_default_str();
  a->bucket_opt = app.add_option("--bucket-cap-mb", a->bucket_cap_mb, "DDP bucket cap in MiB (torch's bucket_cap_mb)")->check(real_number(0, 1 << 20))->capture_default_str();
  a->first_bucket_opt = app.add_option("--first-bucket-mb", a->first_bucket_mb, "DDP first bucket cap in MiB")->check(real_number(0, 1 << 20))->capture_default_str();
  a->find_unused_opt = app.add_flag("--find-unused-parameters", c.ddp.find_unused_parameters, "DDP marks parameters the forward did not use as ready");
  a->view_opt = app.add_flag("--gradient-as-bucket-view", c.ddp.gradient_as_bucket_view, "Gradients live in DDP's buckets (saves one gradient-sized buffer)");
  a->sharding_opt = app.add_option("--sharding", a->sharding, "FSDP: full | grad-op | no-shard | hybrid | zero1")->capture_default_str();
  a->node_opt = app.add_option("--node-size", c.fsdp.node_size, "FSDP hybrid: ranks per shard group (default: the profile's ranks per node)")->check(whole_number(1, 64));
  a->wrap_opt = app.add_option("--wrap", a->wrap, "FSDP units: layer (one per Linear) | model")->capture_default_str();
  a->bp_opt = app.add_option("--backward-prefetch", a->backward_prefetch, "FSDP: none | pre (BACKWARD_PRE) | post (BACKWARD_POST)")->capture_default_str();
  a->fp_opt = app.add_flag("--forward-prefetch", c.fsdp.forward_prefetch, "FSDP: gather the next unit during this unit's forward");
  a->static_opt = app.add_flag("--static-buckets", a->static_buckets, "Keep DDP's construction-time buckets (no rebuild after iteration 1)");
  a->sized_first_opt = app.add_flag("--sized-first-iteration", c.ddp.sized_first_iteration, "DDP: sized buckets in iteration 1 too (torch uses one bucket there unless --find-unused-parameters)");
  app.add_option("--skip-layer", c.skip_layer, "Model branch: bypass this square Linear (Sequential index) on every --skip-every-th step")->check(whole_number(0, 1 << 20));
  app.add_option("--skip-every", c.skip_every, "Period of the --skip-layer branch in steps")->check(whole_number(1, int64_t{1} << 40))->capture_default_str();
  app.add_option("--skip-ranks", c.skip_ranks, "Ranks whose forward takes the --skip-layer branch, e.g. 1,3 (default: every rank)")->delimiter(',')->check(whole_number(0, 1 << 20));
  app.add_flag("--allow-nonfinite", c.allow_nonfinite, "Train on when the loss becomes NaN or infinite (default: stop at that step, naming the rank and the first non-finite layer)");
  app.add_option("--monitor", c.monitor_port, "Under dtlab-cli launch: rank 0 serves the run to 'dtlab --attach MASTER_ADDR:PORT' on this port; the run starts paused")->check(whole_number(1, 65535));
  app.add_option("--monitor-wait", c.monitor_wait_s, "Seconds a --monitor run waits for its viewer to attach")->check(real_number(0.001, 1e6))->capture_default_str();
  app.add_option("--timeout", c.timeout_s, "Watchdog: seconds before a stuck collective or DDP bucket fails, diagnosed")->check(real_number(0.001, 1e6))->capture_default_str();
  add_pipeline_flags(app, a->pipeline, c);
  app.add_option("--fault", a->faults, "Inject a fault: skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M (repeatable)");
  return [a](Streams& io) { return run_train(*a, io); };
}

}  // namespace dtlab::cli
