#include <CLI/CLI.hpp>
#include <map>
#include <new>
#include <system_error>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/validators.h"
#include "engine/core/format.h"
#include "engine/comm/communicator.h"
#include "engine/core/check.h"

namespace dtlab::cli {

namespace {

std::string explain(const CLI::ParseError& e, const std::string& command) {
  return parse_error_sentence(e, command.empty() ? "dtlab-cli --help" : "dtlab-cli " + command + " --help");
}

// An unknown flag of the innermost command parsed (bench collectives) when the arguments hold one, with
// its nearest flag; else explain()'s sentence.
std::string explain_typo(const CLI::ParseError& e, const std::vector<std::string>& args, const CLI::App& app, const std::string& command) {
  const CLI::App* sub = &app;
  while (!sub->get_subcommands().empty()) sub = sub->get_subcommands().front();
  if (sub != &app)
    if (const std::string typo = unknown_flag(args, *sub); !typo.empty())
      return typo + "; run 'dtlab-cli " + command + " --help' for the list of flags";
  return explain(e, command);
}

}  // namespace

int run_cli(const std::vector<std::string>& args, Streams io) {
  CLI::App app{"dtlab-cli: train, inspect and benchmark dtlab's engine without the GUI.",
               "dtlab-cli"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dtlab 0.1.0");
  std::map<CLI::App*, Runner> runners;
  auto add = [&](Runner (*fn)(CLI::App&), const char* name, const char* desc) {
    CLI::App* sub = app.add_subcommand(name, desc);
    runners[sub] = fn(*sub);
  };
  add(add_train_command, "train", "Train a model and print one line per logged step");
  add(add_eval_command, "eval", "Evaluate a checkpoint on a data set (loss, accuracy, logits)");
  add(add_generate_command, "generate", "Sample text from a trained GPT checkpoint (nanoGPT's sample.py)");
  add(add_bench_command, "bench", "Benchmark collectives (nccl-tests style)");
  add(add_sampler_command, "sampler", "Print each rank's indices from PyTorch's DistributedSampler");
  add(add_plan_command, "plan", "Per-rank memory and traffic of DDP, ZeRO and FSDP sharding (ZeRO paper formulas)");
  add(add_launch_command, "launch", "Start one process per rank, torchrun style: launch --nproc-per-node N -- train ...");
  add(add_trace_command, "trace", "Read a multi-rank PyTorch profiler trace: trace summarize DIR|FILES");
  add(add_schedule_command, "schedule", "Pipeline schedules (GPipe, 1F1B, interleaved, ZB-H1) as a grid, with bubbles and in-flight micro-batches");

  // CLI11 wants argv order reversed when given a vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  std::string command;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a == "train" || a == "eval" || a == "generate" || a == "sampler" || a == "bench" || a == "plan" || a == "launch" ||
        a == "schedule" || a == "trace") {
      command = a;
      if (a == "bench" && i + 1 < args.size() && args[i + 1] == "collectives") command += " collectives";
      break;
    }
  }
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    CLI::App* target = &app;
    std::string prefix = "dtlab-cli";
    while (!target->get_subcommands().empty()) {
      if (target != &app) prefix += " " + target->get_name();
      target = target->get_subcommands().front();
    }
    io.out << (target == &app ? app.help() : target->help(prefix));
    return 0;
  } catch (const CLI::CallForVersion& e) {
    io.out << e.what() << "\n";
    return 0;
  } catch (const CLI::RequiredError& e) {
    if (args.empty() || std::string(e.what()).find("subcommand") != std::string::npos) {
      if (command == "bench")
        io.err << "dtlab-cli: bench needs to know what to measure; use 'dtlab-cli bench collectives' (see 'dtlab-cli bench --help')\n";
      else if (command == "trace")
        io.err << "dtlab-cli: trace needs a verb; use 'dtlab-cli trace summarize DIR|FILES' (see 'dtlab-cli trace --help')\n";
      else if (command.empty() && !args.empty())
        io.err << "dtlab-cli: '" << tidy_sentence(args[0]) << "' is not a subcommand; use train, eval, generate, bench, sampler, plan, schedule, launch or trace (see 'dtlab-cli --help')\n";
      else
        io.err << "dtlab-cli: give a subcommand (train, eval, generate, bench, sampler, plan, schedule, launch or trace); run 'dtlab-cli --help' for usage\n";
      return 2;
    }
    // CLI11 checks the required flags before the stray ones: a mistyped required flag ('plan --param
    // 7e9') is the unknown one, which is what to name.
    io.err << "dtlab-cli: " << tidy_sentence(explain_typo(e, args, app, command)) << "\n";
    return 2;
  } catch (const CLI::ExtrasError& e) {
    io.err << "dtlab-cli: " << tidy_sentence(explain_typo(e, args, app, command)) << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    io.err << "dtlab-cli: " << tidy_sentence(explain(e, command)) << "\n";
    return 2;
  }
  try {
    for (auto* sub : app.get_subcommands()) {
      const bool checks_config = sub->get_name() == "train" || sub->get_name() == "launch";
      if (io.mode == Mode::CheckFlags || (io.mode == Mode::CheckConfig && !checks_config)) return 0;
      return runners.at(sub)(io);
    }
    return 2;
  } catch (const CommError& e) {  // a collective failed: the watchdog's or desync diagnosis
    // One write per line: a launched rank 0 shares stderr with the launcher's relayed lines.
    io.err << "dtlab-cli: " + tidy_sentence(e.what()) + "\n" << std::flush;
    return 3;
  } catch (const Error& e) {  // bad input found after parsing (files, specs, combinations)
    std::string msg = e.what();
    if (!msg.empty() && msg.back() == '.') msg.pop_back();  // one style: no final period
    io.err << "dtlab-cli: " + tidy_sentence(msg) + "\n" << std::flush;
    return 2;
  } catch (const std::bad_alloc&) {  // a model, batch, adapter or input file larger than this machine's memory
    mark_out_of_memory();
    io.err << "dtlab-cli: out of memory: the run, or a file it read, needs more than this machine has; use a smaller --model, "
              "--batch, --world or --lora-rank, or check the size of the input files\n";
    return 2;
  } catch (const std::system_error& e) {  // a thread that found no memory for its stack
    if (e.code() != std::errc::resource_unavailable_try_again) {
      io.err << "dtlab-cli: internal error: " << tidy_sentence(e.what()) << "\n";
      return 1;
    }
    mark_out_of_memory();
    io.err << "dtlab-cli: out of memory: no room for another thread's stack; use a smaller --world or --model\n";
    return 2;
  } catch (const std::exception& e) {
    io.err << "dtlab-cli: internal error: " << tidy_sentence(e.what()) << "\n";
    return 1;
  }
}

}  // namespace dtlab::cli
