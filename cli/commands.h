// Registration of dtlab-cli's subcommands; each lives in its own cmd_<name>.cpp and adds its flags
// to the CLI11 app, returning the function that runs it once parsing succeeded.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

#include "cli/cli.h"
#include "cli/validators.h"

namespace dtlab::cli {

using Runner = std::function<int(Streams&)>;

Runner add_train_command(CLI::App& app);
Runner add_sampler_command(CLI::App& app);
Runner add_eval_command(CLI::App& app);
Runner add_generate_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);
Runner add_schedule_command(CLI::App& app);
Runner add_trace_command(CLI::App& app);

}  // namespace dtlab::cli
