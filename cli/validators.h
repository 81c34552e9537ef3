// Flag validators whose failures read as a sentence ("--batch: 'abc' is not a whole number"), unlike
// CLI11's stock Range on text, and the sentence a parse error becomes. Shared by dtlab-cli's
// subcommands and the dtlab window (through dtlab_train_flags, which neither the engine nor the
// GUI code depends on).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace dtlab::cli {

CLI::Validator whole_number(int64_t lo, int64_t hi);
CLI::Validator real_number(double lo, double hi);
CLI::Validator existing_file();
// A file or a directory that exists (a checkpoint: safetensors, or a sharded checkpoint's directory).
CLI::Validator existing_path();
// An output path: an empty one would run and write nothing.
CLI::Validator output_path();

// CLI11's message, accurate but terse, as one sentence ending with where to look:
// "--world: 0 is out of range; use 1 to 64; run 'dtlab --help' for the list of flags".
std::string parse_error_sentence(const CLI::ParseError& e, const std::string& help_command);

// An argument CLI11 did not expect (its ExtrasError), as the words before "; run '... --help'": the first
// flag among `args` that `cmd` (the command parsed: dtlab-cli's subcommand, or the dtlab window's app)
// does not have, with its nearest flag when that is close enough to be a typo ("--stpes is not a flag
// (did you mean --steps?)"). Stray values, not flags: CLI11's own words.
// The option nearest `word` when it is close enough to be a typo of it (edit distance, a swap counted
// once, or one inside the other, within a third of the letters), else "". Flags, script commands, lesson
// words and figure names all suggest with it.
std::string closest_word(const std::string& word, const std::vector<std::string>& options);

std::string unknown_flag_text(const CLI::ParseError& e, const std::vector<std::string>& args, const CLI::App& cmd);
// The same words for the first unknown flag among `args`, or "" when every flag is `cmd`'s.
std::string unknown_flag(const std::vector<std::string>& args, const CLI::App& cmd);

}  // namespace dtlab::cli
