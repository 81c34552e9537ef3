// Plain-text tables and figures the subcommands print (plan, schedule, trace, the pipeline summary).
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace dtlab::cli {

// Columns padded to their widest cell (counted in UTF-8 characters: Ψ and × are one column on
// screen), two spaces apart, each row after `indent`; right[c] right-aligns column c (a row may be
// shorter than `right`; columns past it are left-aligned). Trailing spaces are dropped.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                 const std::string& indent = "");

// "12.5%" for 0.125.
std::string percent(double x);

}  // namespace dtlab::cli
