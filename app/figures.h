// Live figures: a small expression language over the Snapshot. A lesson's answers, its `run until`
// conditions and the {{...}} numbers in its text are figures, so what a lesson reveals is what the
// engine did (collective.bytes_per_rank, bucket[1].ready, memory.rank[0].parameters), and the
// course's formulas sit beside them as pure functions of the engine's own code
// (plan.total(7e9, 8, "full"), schedule.bubble("1f1b", 4, 8), algo.sent("naive", 4, 1e6, 0)).
//
//   expr    := or ; or := and ('||' and)* ; and := cmp ('&&' cmp)*
//   cmp     := sum (('=='|'!='|'<'|'<='|'>'|'>=') sum)?
//   sum     := product (('+'|'-') product)* ; product := unary (('*'|'/') unary)*
//   unary   := ('-'|'!') unary | NUMBER | '(' expr ')' | at("MARK", expr) | path
//   path    := NAME ('.' NAME | '[' expr ']' | '(' args ')')*     args: exprs or "strings"
//
// Comparisons and logic give 1 or 0. The vocabulary (figure_vocabulary()) is listed, with what each
// figure means, in lessons/README.md.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "app/snapshot.h"

namespace dtlab::app {

// Where a figure is evaluated: the live snapshot, and the copies a lesson's `mark NAME` kept.
struct FigureScope {
  const Snapshot* now = nullptr;
  const std::map<std::string, Snapshot>* marks = nullptr;
};

class Figure {
 public:
  Figure() = default;
  // Throws dtlab::Error with one sentence: "unknown live figure 'collective.byte'; did you mean
  // 'collective.bytes'?", "bucket[] takes 1 index", "unexpected ')' at column 7".
  static Figure parse(const std::string& text);
  // Throws dtlab::Error when the figure has no value now: "collective.bytes: no collective has run yet".
  double eval(const FigureScope& scope) const;
  // The value of each live figure in it, for messages: "collective.steps = 6, world = 4".
  std::string explain(const FigureScope& scope) const;
  const std::string& text() const { return text_; }
  // The live figures it reads, by signature ("collective.steps", "bucket[I].bytes"), each once.
  std::vector<std::string> names() const;
  bool empty() const { return !root_; }

  struct Node;

 private:
  std::string text_;
  std::shared_ptr<const Node> root_;
};

struct FigureInfo {
  std::string name;  // as written, with its arguments: "memory.rank[R].parameters", "plan.total(P, N, SHARDING)"
  std::string help;  // one line
};
const std::vector<FigureInfo>& figure_vocabulary();

// 6, 0.75, 4547, 1.2e+10: integers in full, others with 4 significant digits.
std::string format_figure(double v);

// The option closest to `word` when it is close enough to be a typo of it, or "" (cli::closest_word).
std::string closest_word(const std::string& word, const std::vector<std::string>& options);

}  // namespace dtlab::app
