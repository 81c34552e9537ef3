// Small text helpers shared by diagnoses, CLI output and views, so a size reads the same everywhere.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtlab {

// "780 B", "16.0 KiB", "4.0 MiB", "1.25 GiB" (binary units, as torch and nvidia-smi print them).
std::string human_bytes(int64_t bytes);
// "1,048,576"
std::string with_commas(int64_t v);
// A rate or amount with an SI prefix and three significant figures: "45.2 GFLOP/s", "3.35 TB/s", "812 FLOP".
std::string si_text(double v, const char* unit);
// "0.5 s", "30 s": a timeout as diagnoses print it.
std::string seconds_text(double s);
// "a", "a or b", "a, b or c": the choices a message offers.
std::string choice_list(const std::vector<std::string>& choices);
// "a, b, c": the items with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep);
// "0-1" for the indices [0, 2), "3" for [3, 4): a rank's heads, columns or positions.
std::string index_span(int64_t begin, int64_t end);
// "rank 2" or "ranks 1, 3": the ranks a diagnosis names.
std::string ranks_text(const std::vector<int>& ranks);
// "rank 2", "ranks 2, 3", "ranks 4-7", "ranks 0-3, 8-11": ranks_text with each run of three or more
// consecutive ranks as "first-last", for the groups of a mesh (a replica's ranks, a stage's).
std::string rank_runs_text(const std::vector<int>& ranks);

// An error sentence made fit to print, whatever input it quotes: control bytes (but newlines, which
// a message may use for a grid of its own) and bytes that are not UTF-8 become \xNN, a run of more than 120 characters without a space (a
// 100 KB flag, a binary cell, a model spec of 20000 layers) keeps its first 80 and last 20 around
// "...", and the whole keeps at most 2000 bytes. Front ends pass every message they print through it.
std::string tidy_sentence(const std::string& msg);
// TEXT without leading and trailing spaces and tabs.
std::string trim_blanks(std::string_view text);

}  // namespace dtlab
