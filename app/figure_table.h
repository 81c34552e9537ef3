// The live-figure vocabulary behind app/figures.h: a table of entries, each naming its arguments
// and how its value is read. figures.cpp parses expressions against it; figure_table.cpp fills it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "app/figures.h"

namespace dtlab::app {

// An argument: a number, or a "string" (kind names, marks, profiles).
struct Arg {
  double num = 0;
  std::string str;
  bool is_str = false;
};
using Args = std::vector<Arg>;
using Fn = std::function<double(const Snapshot&, const Args&)>;
using ScopeFn = std::function<double(const FigureScope&, const Args&)>;  // for figures that compare with a mark

struct Entry {
  const char* name;   // as documented: "bucket[I].bytes"
  const char* types;  // one letter per argument, indices first: n number, s string; after '|' optional
  const char* help;
  Fn fn;
  ScopeFn scoped = nullptr;  // used instead of fn when set
};

const std::vector<Entry>& entries();
// "memory.rank[R].parameters" -> "memory.rank[].parameters": how a written path is looked up.
std::string signature_of(const std::string& name);
const Entry* find_entry(const std::string& signature);  // null when unknown
// The snapshot `mark NAME` kept; dtlab::Error when no such mark ran.
const Snapshot& marked(const FigureScope& scope, const std::string& name);

}  // namespace dtlab::app
