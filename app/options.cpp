#include "app/options.h"

#include "engine/monitor/monitor.h"
#include "engine/train/device_probe.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"
#include "engine/parallel/pipeline.h"
#include "engine/trace/cost_model.h"
#include "app/trace_loader.h"

namespace dtlab::app {

namespace {

// The lab's model presets: small enough to step through by hand, several buckets with small caps.
std::string preset_model(const std::string& name) {
  if (name == "tiny") return "mlp:2,16,16,3";
  if (name == "small") return "mlp:2,64,64,3";
  if (name == "deep") return "mlp:2,64,64,64,64,3";
  if (name == "wide") return "mlp:2,256,256,3";
  return name;
}

// The flags that configure the window's own training run: refused with --attach and --open, whose
// runs were configured elsewhere.
constexpr const char* kRunFlags[] = {
    "--strategy", "--world", "--model", "--data", "--batch", "--steps", "--accum", "--optimizer", "--lr", "--bucket-cap-mb",
    "--first-bucket-mb", "--sized-first-iteration", "--find-unused-parameters", "--sharding", "--node-size", "--wrap",
    "--backward-prefetch", "--forward-prefetch", "--stages", "--microbatches", "--schedule", "--chunks", "--dp", "--split",
    "--unit-costs", "--skip-layer", "--skip-every", "--skip-ranks", "--allow-nonfinite", "--fault", "--profile", "--seed",
    "--timeout", "--device", "--backend"};

// --open and its companions: the paths exist and hold traces, one rank per file, a known profile,
// a model dtlab can build (given, or from the directory's dtlab.json); live-run flags and script
// commands are refused, since no training runs.
void check_open(const CLI::App& app, AppOptions& o) {
  if (o.open.empty()) {
    for (const char* flag : {"--trace-ranks", "--compare-profile", "--trace-model"})
      if (app.count(flag) > 0) throw Error(std::string(flag) + " goes with --open DIR; add --open and the traces' directory");
    for (const ScriptCommand& c : o.script)
      if (trace_command(c) && o.lesson.empty())  // a lesson may open traces (its `open:` line)
        throw Error("script command " + std::to_string(c.line) + " works on imported traces; add --open DIR");
    return;
  }
  if (!o.attach.empty()) throw Error("--open shows recorded traces and --attach a launched run; drop one of them");
  if (!o.lesson.empty() || o.play) throw Error("--open shows recorded traces and --lesson runs its own; drop one of them");
  for (const char* flag : kRunFlags)
    if (app.count(flag) > 0)
      throw Error(std::string("--open shows a recorded job, so ") + flag + " cannot apply; drop it (--trace-model and "
                  "--compare-profile set the Compare panel's run)");
  for (const char* flag : {"--running", "--speed", "--clock", "--compare"})
    if (app.count(flag) > 0) throw Error(std::string("--open shows a recorded job, so ") + flag + " cannot apply; drop it");
  for (const ScriptCommand& c : o.script)
    if (c.kind == ScriptCommand::View && !trace_command(c) && c.arg != "timeline" && c.arg != "inspector" && c.arg != "all")
      throw Error("script command " + std::to_string(c.line) + " 'view " + c.arg + "' shows a live run; with --open the views are "
                  "timeline, collectives, breakdown, compare and all");
  for (const ScriptCommand& c : o.script)
    if (live_command(c))
      throw Error("script command " + std::to_string(c.line) + " steps a live run, and --open shows a recorded job; "
                  "use wait trace, select collective K, zoom, compare, view, screenshot and quit");
  const TraceFiles files = list_trace_files(o.open);
  if (!o.trace_ranks.empty()) {
    if (o.trace_ranks.size() != files.files.size())
      throw Error("--trace-ranks names " + std::to_string(o.trace_ranks.size()) + (o.trace_ranks.size() == 1 ? " rank" : " ranks") +
                  " for " + std::to_string(files.files.size()) + (files.files.size() == 1 ? " trace file" : " trace files") +
                  "; give one rank per file, in the order " + (o.open.size() == 1 && files.files.size() > 1 ? "the files sort" : "given"));
    std::vector<int> sorted = o.trace_ranks;
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
      throw Error("--trace-ranks gives rank " + std::to_string(*d) + " twice; each file is one rank");
  }
  if (o.compare_profile != "this" && o.compare_profile != "ideal") {
    try {
      find_profile(o.compare_profile);
    } catch (const Error& e) {
      throw Error(std::string("--compare-profile: ") + e.what());
    }
  }
  const TraceMeta meta = read_trace_meta(o.open);
  o.trace_batch = meta.batch;
  o.trace_bucket_cap_mb = meta.bucket_cap_mb;
  o.trace_first_bucket_mb = meta.first_bucket_mb;
  if (app.count("--trace-model") == 0) o.trace_model = meta.model;
  if (!o.trace_model.empty()) {
    const std::string where = app.count("--trace-model") > 0 ? "--trace-model" : meta.path + "'s model";
    try {
      o.trace_model = ModelSpec::parse(preset_model(o.trace_model)).str();
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
}

}  // namespace

void deepen_for_pipeline(TrainConfig& c) {
  std::vector<int64_t>& d = c.model.dims;
  const int64_t width = d.size() > 2 ? d[d.size() - 2] : 64;
  while (static_cast<int>(d.size()) - 1 < c.pipeline.stages * c.pipeline.chunks) d.insert(d.end() - 1, width);
}

void fit_pipeline(TrainConfig& c) {
  PipelineOptions& o = c.pipeline;
  c.world_size = o.stages * o.dp;
  c.accum = 1;
  if (c.batch % o.microbatches != 0)
    c.batch = std::max<int64_t>(1, (c.batch + o.microbatches / 2) / o.microbatches) * o.microbatches;
  deepen_for_pipeline(c);
  if (!o.split.empty() && static_cast<int>(o.split.size()) != o.stages * o.chunks) o.split.clear();
}

int parse_app_options(int argc, char** argv, AppOptions& o, std::string* error) {
  CLI::App app{"dtlab: step through distributed training, collective by collective", "dtlab"};
  TrainConfig& c = o.train;
  c.strategy = "ddp";
  c.world_size = 4;
  c.steps = 1000;
  c.batch = 64;
  // The lab's clock models this machine by default: compute and communication then show at the
  // scale they really run here, so backward and the overlapping all-reduces are both visible
  // (on nvlink8 a lesson-sized model's compute is nanoseconds next to microseconds of latency).
  c.profile = "this";
  c.optimizer = default_optimizer_config(OptimizerKind::AdamW);
  // Small caps so the lesson model shows several buckets.
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
  c.start_paused = true;
  c.timeout_s = 60;
  std::string model = "wide", optimizer = "adamw", script_file, run_cmds, clock = "modeled";
  std::string sharding = "full", wrap = "layer", backward_prefetch = "pre";
  double bucket_mb = 4096.0 / 1048576.0, first_mb = 1024.0 / 1048576.0, lr = 0;
  app.add_option("--strategy", c.strategy, "single | ddp | dp (torch.nn.DataParallel) | fsdp | pipeline")->capture_default_str();
  auto* world_opt = app.add_option("--world", c.world_size, "Ranks, 1 to 16")->check(CLI::Range(1, 16))->capture_default_str();
  auto* model_opt = app.add_option("--model", model, "Preset tiny|small|deep|wide or mlp:D0,...,Dk")->capture_default_str();
  app.add_option("--data", c.data, "spiral | blobs | PATH.npz")->capture_default_str();
  app.add_option("--batch", c.batch, "Batch per rank")->check(CLI::Range(int64_t{1}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--steps", c.steps, "Optimizer steps")->check(CLI::Range(int64_t{1}, int64_t{1} << 40))->capture_default_str();
  app.add_option("--accum", c.accum, "Gradient accumulation micro-batches")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--optimizer", optimizer, "sgd | adamw")->capture_default_str();
  auto* lr_opt = app.add_option("--lr", lr, "Learning rate")->check(CLI::Range(1e-12, 1e6));
  auto* bucket_opt = app.add_option("--bucket-cap-mb", bucket_mb, "DDP bucket cap in MiB (lab default 0.004)")->check(CLI::Range(1e-9, 1e6));
  auto* first_opt = app.add_option("--first-bucket-mb", first_mb, "DDP first bucket cap in MiB (lab default 0.001; with only --bucket-cap-mb given, the cap, as torch)")->check(CLI::Range(1e-9, 1e6));
  app.add_flag("--sized-first-iteration", c.ddp.sized_first_iteration, "DDP: sized buckets in iteration 1 too (torch uses one bucket there unless --find-unused-parameters)");
  app.add_flag("--find-unused-parameters", c.ddp.find_unused_parameters, "DDP marks unused parameters ready");
  auto* sharding_opt = app.add_option("--sharding", sharding, "FSDP: full | grad-op | no-shard | hybrid | zero1")->capture_default_str();
  auto* node_opt = app.add_option("--node-size", c.fsdp.node_size, "FSDP hybrid: ranks per shard group (default: the profile's ranks per node)")->check(CLI::Range(1, 64));
  auto* wrap_opt = app.add_option("--wrap", wrap, "FSDP units: layer (one per Linear) | model")->capture_default_str();
  auto* bp_opt = app.add_option("--backward-prefetch", backward_prefetch, "FSDP: none | pre (BACKWARD_PRE) | post (BACKWARD_POST)")->capture_default_str();
  auto* fp_opt = app.add_flag("--forward-prefetch", c.fsdp.forward_prefetch, "FSDP: gather the next unit during this unit's forward");
  // Pipeline (dtlab-cli train's flags; the lab starts at p = 4, m = 8).
  c.pipeline.stages = 4;
  c.pipeline.microbatches = 8;
  std::string schedule = "1f1b", split, compare;
  bool unit_costs = false;
  const std::vector<CLI::Option*> pipe_opts = {
      app.add_option("--stages", c.pipeline.stages, "Pipeline: ranks per pipeline, p (the model is cut into p x --chunks stages)")
          ->check(CLI::Range(1, 16))->capture_default_str(),
      app.add_option("--microbatches", c.pipeline.microbatches, "Pipeline: micro-batches per batch, m (--batch must be a multiple)")
          ->check(CLI::Range(1, 4096))->capture_default_str(),
      app.add_option("--schedule", schedule, "Pipeline schedule: gpipe | 1f1b | interleaved | zb-h1")->capture_default_str(),
      app.add_option("--chunks", c.pipeline.chunks, "Pipeline: stages per rank, v (interleaved)")->check(CLI::Range(1, 16))->capture_default_str(),
      app.add_option("--dp", c.pipeline.dp, "Pipeline: data-parallel replicas, D (world = stages x dp)")->check(CLI::Range(1, 16))->capture_default_str(),
      app.add_option("--split", split, "Pipeline: Linear layers per stage, e.g. 2,2,1 (default: balanced by parameter count)"),
      app.add_flag("--unit-costs", unit_costs, "Pipeline: every F, B, I and W costs 1 ms of modeled time (with --profile ideal "
                                               "the measured bubbles equal the formulas)"),
      app.add_option("--compare", compare, "Pipeline view: simulate this schedule under the run's, with its action costs"),
  };
  app.add_option("--skip-layer", c.skip_layer, "Model branch: bypass this square Linear every --skip-every steps");
  app.add_flag("--allow-nonfinite", c.allow_nonfinite, "Train on when the loss becomes NaN or infinite (default: stop, diagnosed)");
  app.add_option("--skip-every", c.skip_every, "Period of the branch")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--skip-ranks", c.skip_ranks, "Ranks whose forward takes the --skip-layer branch, e.g. 1,3 (default: every rank)")->delimiter(',')->check(CLI::Range(0, 15));
  std::vector<std::string> faults;
  app.add_option("--fault", faults, "Inject a fault (repeatable): skip:rank=R,collective=K or delay:rank=R,collective=K,ms=M");
  app.add_option("--profile", c.profile, "Hardware profile: nvlink8, pcie8, ib2x4, eth2x4, this, ideal (free communication)")->capture_default_str();
  app.add_option("--seed", c.seed, "Seed (torch.manual_seed's 32-bit range, as dtlab-cli train)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{4294967295}))->capture_default_str();
  app.add_option("--timeout", c.timeout_s, "Watchdog seconds")->check(CLI::Range(0.001, 1e6))->capture_default_str();
  app.add_option("--clock", clock, "Timeline clock: modeled or wall")->capture_default_str();
  app.add_option("--script", script_file, "Run the commands in FILE (one per line)")->check(CLI::ExistingFile);
  app.add_option("--run", run_cmds, "Run commands, separated by ';' (e.g. \"step collective 3; screenshot a.png; quit\")");
  app.add_option("--screenshot", o.screenshot, "Save PATH.png after --frames frames, then quit");
  app.add_option("--frames", o.frames, "Frames before --screenshot")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--bench-frames", o.bench_frames, "Render N frames and print median and p95 CPU ms per frame")->check(CLI::Range(1, 1000000));
  app.add_flag("--presentation", o.presentation, "Large fonts and high contrast (projectors)");
  app.add_flag("--running", o.running, "Start running instead of paused");
  app.add_option("--speed", o.speed, "Modeled seconds per wall second while running (0: full speed)")->check(CLI::Range(0.0, 1e6));
  app.add_option("--width", o.width, "Window width")->check(CLI::Range(320, 8192))->capture_default_str();
  app.add_option("--height", o.height, "Window height")->check(CLI::Range(240, 8192))->capture_default_str();
  app.add_option("--config-dir", o.config_dir, "Where the window layout (imgui.ini) is kept");
  app.add_option("--lesson", o.lesson, "Open a lesson: NAME (lessons/*NAME.md) or PATH.md");
  std::string device, backend;
  app.add_option("--device", device, "cpu | cuda (default: cuda when a GPU is present, else cpu; DTLAB_DEVICE sets it)");
  app.add_option("--backend", backend, "threads | cuda (ranks share a GPU) | nccl (one GPU per rank); default: nccl with a GPU per rank, cuda with fewer, else threads");
  app.add_option("--attach", o.attach, "Show and step a launched run: HOST:PORT of its 'train --monitor PORT' (rank 0's host)");
  app.add_option("--open", o.open, "Show a multi-rank job's PyTorch profiler traces: a directory of per-rank .json/.json.gz files, "
                                   "or the files (repeatable)");
  app.add_option("--trace-ranks", o.trace_ranks, "With --open: the rank of each file in order, for traces that record none (e.g. 0,1,2,3)")
      ->delimiter(',')->check(CLI::Range(0, 4095));
  app.add_option("--compare-profile", o.compare_profile, "With --open: the hardware profile dtlab models the traced all-reduces on")
      ->capture_default_str();
  app.add_option("--trace-model", o.trace_model, "With --open: the traced model as dtlab builds it, e.g. mlp:2,512,512,3 (default: dtlab.json's)");
  app.add_flag("--check-spoilers", o.check_spoilers, "With --play: fail when a question's answer is on screen before its check");
  app.add_flag("--play", o.play, "With --lesson: play it without a person (it still needs a display: xvfb-run -a), answering with the live figures; exit 1 on a failed step");
  app.set_version_flag("--version", "dtlab 0.1.0");
  try {
    app.parse(argc, argv);
    if (clock != "modeled" && clock != "wall") throw Error("--clock " + clock + " is not a clock; use modeled or wall");
    o.modeled_clock = clock == "modeled";
    c.model = ModelSpec::parse(preset_model(model));
    c.optimizer = default_optimizer_config(parse_optimizer_kind(optimizer));
    if (lr_opt->count()) c.optimizer.lr = lr;
    c.ddp.bucket_cap_bytes = static_cast<int64_t>(bucket_mb * 1048576.0);
    // torch: an explicit bucket_cap_mb makes the first bucket as large as the others.
    c.ddp.first_bucket_bytes = bucket_opt->count() > 0 && first_opt->count() == 0
                                   ? c.ddp.bucket_cap_bytes : static_cast<int64_t>(first_mb * 1048576.0);
    if (c.ddp.bucket_cap_bytes < 1 || c.ddp.first_bucket_bytes < 1)
      throw Error("bucket caps must hold at least 1 byte; raise --bucket-cap-mb / --first-bucket-mb");
    if (c.strategy == "single" && c.world_size != 1) c.world_size = 1;
    if (c.strategy != "fsdp")
      for (CLI::Option* f : {sharding_opt, wrap_opt, bp_opt, fp_opt, node_opt})
        if (f->count() > 0) throw Error(f->get_name() + " configures FSDP; add --strategy fsdp");
    c.fsdp.sharding = parse_sharding(sharding);
    if (c.strategy != "pipeline") {
      for (CLI::Option* f : pipe_opts)
        if (f->count() > 0) throw Error(f->get_name() + " configures a pipeline; add --strategy pipeline --stages p");
    } else {
      c.pipeline.schedule = parse_schedule_kind(schedule);
      if (!split.empty()) c.pipeline.split = parse_split(split);
      if (!compare.empty()) o.compare = static_cast<int>(parse_schedule_kind(compare));
      if (unit_costs) c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
      if (world_opt->count() == 0) c.world_size = c.pipeline.stages * c.pipeline.dp;
      if (c.world_size > 16)
        throw Error("--stages x --dp is " + std::to_string(c.world_size) + " ranks; the lab runs at most 16");
      if (model_opt->count() == 0) deepen_for_pipeline(c);  // the default model, cut into p x v stages
    }
    if (node_opt->count() > 0 && c.fsdp.sharding != Sharding::Hybrid)
      throw Error("--node-size sets HYBRID_SHARD's shard group; add --sharding hybrid");
    if (wrap != "layer" && wrap != "model") throw Error("--wrap " + wrap + " is not a wrap policy; use layer (one unit per Linear) or model");
    c.fsdp.wrap_layers = wrap == "layer";
    c.fsdp.backward_prefetch = parse_backward_prefetch(backward_prefetch);
    find_profile(c.profile);
    for (const std::string& f : faults) c.faults.push_back(parse_fault(f));
    if (!c.faults.empty() && c.strategy == "single")
      throw Error("--fault injects into the ranks' collectives; add --strategy ddp (or fsdp) --world N");
    if (o.play && o.lesson.empty()) throw Error("--play plays a lesson; add --lesson NAME");
    if (o.check_spoilers && !o.play) throw Error("--check-spoilers checks a played lesson; add --play --lesson NAME");
    if (!std::isfinite(o.speed)) throw Error("--speed must be a number from 0 to 1000000 (modeled seconds per wall second)");
    if (backend == "socket")
      throw Error("--backend socket is how dtlab-cli launch runs one process per rank; to watch such a run, launch it "
                  "with --monitor PORT and start dtlab --attach HOST:PORT");
    {
      // Where the ranks run. A lesson's scenario (error given) keeps the CPU engine its figures
      // were written against unless it names --device.
      DeviceQuery q;
      q.device = device.empty() && error ? "cpu" : device;
      q.backend = backend;
      q.strategy = c.strategy;
      q.ranks_on_node = c.world_size;
      probe_devices(q);
      const DeviceChoice dc = resolve_device(q);
      c.device = dc.device;
      c.backend = dc.backend;
    }
    if (!o.attach.empty()) {
      std::string host;
      int port = 0;
      parse_monitor_address(o.attach, host, port);
      if (!o.lesson.empty()) throw Error("--attach shows a launched run and --lesson runs its own; drop one of them");
      // A launched run's configuration is its ranks' (dtlab-cli train ... --monitor PORT): a flag
      // that would configure this window's own run cannot change it, so it is refused, not ignored.
      for (const char* flag : kRunFlags)
        if (app.count(flag) > 0)
          throw Error(std::string("--attach shows a launched run as its ranks were started, so ") + flag +
                      " cannot apply; give it to 'dtlab-cli train' under dtlab-cli launch, or drop it");
    }
    if (!script_file.empty() && !run_cmds.empty()) throw Error("give --script FILE or --run \"commands\", not both");
    if (!script_file.empty()) {
      std::string text;
      if (const std::string why = not_a_regular_file(script_file); !why.empty()) throw Error("--script " + script_file + " " + why);
      if (!read_text_file(script_file, text))
        throw Error("--script " + script_file + " is larger than 1 MiB; a script is a few lines of commands");
      o.script = parse_script(text, script_file);
      if (o.script.empty())  // otherwise the lab would open interactively and never quit
        throw Error("--script " + script_file + " holds no commands; write one per line, e.g. 'step collective 3' and 'quit'");
    } else if (app.count("--run") > 0) {
      o.script = parse_script(run_cmds, "--run");
      if (o.script.empty()) throw Error("--run holds no commands; give e.g. --run \"step collective 3; quit\"");
    }
    if (!o.screenshot.empty() && !o.script.empty()) throw Error("--screenshot is a one-shot; inside a script use the screenshot command");
    if (o.play && !o.script.empty()) throw Error("--play plays the whole lesson; to stop at a step, drop --play and script `lesson goto N`");
    if (app.count("--screenshot") > 0 && o.screenshot.size() < 5) throw Error("--screenshot needs a PATH.png");
    check_open(app, o);
    c.start_paused = !o.running;
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return -1;
  } catch (const CLI::CallForVersion&) {
    std::printf("dtlab 0.1.0\n");
    return -1;
  } catch (const CLI::ParseError& e) {
    if (error) *error = e.what();
    else std::fprintf(stderr, "dtlab: %s; see dtlab --help\n", tidy_sentence(e.what()).c_str());
    return 2;
  } catch (const Error& e) {
    if (error) *error = e.what();
    else std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace dtlab::app
