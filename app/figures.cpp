#include "app/figures.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <new>
#include <optional>

#include "app/figure_table.h"
#include "cli/validators.h"
#include "engine/core/check.h"

namespace dtlab::app {

namespace {

[[noreturn]] void fail(const std::string& sentence) { throw Error(sentence); }

}  // namespace

// ---- the expression tree ----

struct Figure::Node {
  enum Kind { Num, Str, Path, Neg, Not, Bin, At } kind = Num;
  double num = 0;
  std::string str;                 // Str: the text; Path: its signature; Bin: the operator; At: the mark
  const Entry* entry = nullptr;    // Path
  std::vector<std::shared_ptr<const Node>> kids;  // Path: its arguments; Bin: (l, r); Neg/Not/At: (x)
};

namespace {

using NodeP = std::shared_ptr<const Figure::Node>;

// A live figure is a short expression; these bounds keep the recursive parser, evaluation and the
// tree's destruction far from the stack's limit whatever a lesson file holds.
constexpr size_t kMaxFigureChars = 2000;
constexpr int kMaxFigureDepth = 64;

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}
  NodeP parse() {
    if (t_.size() > kMaxFigureChars)
      fail("the live figure '" + t_.substr(0, 40) + "...' is " + std::to_string(t_.size()) + " characters long; keep it under " +
           std::to_string(kMaxFigureChars));
    NodeP n = binary();
    skip();
    if (p_ < t_.size()) error("unexpected '" + t_.substr(p_, 1) + "'");
    return n;
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    fail(what + " at column " + std::to_string(p_ + 1) + " of '" + t_ + "'");
  }
  void skip() {
    while (p_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[p_]))) p_++;
  }
  bool eat(const char* tok) {
    skip();
    const size_t n = std::char_traits<char>::length(tok);
    if (t_.compare(p_, n, tok) != 0) return false;
    // "<" must not swallow the first half of "<=", "!" not of "!=".
    if (n == 1 && p_ + 1 < t_.size() && t_[p_ + 1] == '=' && std::string("<>!=").find(tok[0]) != std::string::npos) return false;
    p_ += n;
    return true;
  }
  void expect(const char* tok) {
    if (!eat(tok)) error(std::string("expected '") + tok + "'");
  }
  static NodeP bin(const std::string& op, NodeP l, NodeP r) {
    auto n = std::make_shared<Figure::Node>();
    n->kind = Figure::Node::Bin;
    n->str = op;
    n->kids = {std::move(l), std::move(r)};
    return n;
  }
  // Binary operators, loosest first; each level joins operands of the next one, left to right.
  // Counts the nesting of parentheses, arguments and unary operators while they are parsed.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > kMaxFigureDepth) p.error("the expression nests deeper than " + std::to_string(kMaxFigureDepth) + " levels");
    }
    ~Nest() { p.depth_--; }
  };
  NodeP binary(size_t level = 0) {
    std::optional<Nest> nest;
    if (level == 0) nest.emplace(*this);
    static const std::vector<std::vector<const char*>> kLevels = {
        {"||"}, {"&&"}, {"==", "!=", "<=", ">=", "<", ">"}, {"+", "-"}, {"*", "/"}};
    if (level == kLevels.size()) return unary();
    NodeP l = binary(level + 1);
    for (bool more = true; more;) {
      more = false;
      for (const char* op : kLevels[level])
        if (eat(op)) {
          l = bin(op, l, binary(level + 1));
          more = true;
          break;
        }
    }
    return l;
  }
  NodeP unary() {
    Nest nest(*this);
    if (eat("-") || eat("!")) {
      auto n = std::make_shared<Figure::Node>();
      n->kind = t_[p_ - 1] == '-' ? Figure::Node::Neg : Figure::Node::Not;
      n->kids = {unary()};
      return n;
    }
    skip();
    if (p_ >= t_.size()) error("a value is missing");
    const char c = t_[p_];
    if (eat("(")) {
      NodeP n = binary();
      expect(")");
      return n;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') return number();
    if (c == '"' || c == '\'') return string();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return path();
    error("unexpected '" + std::string(1, c) + "'");
  }
  NodeP number() {
    const char* b = t_.c_str() + p_;
    char* e = nullptr;
    const double v = std::strtod(b, &e);
    if (e == b) error("bad number");
    p_ += static_cast<size_t>(e - b);
    auto n = std::make_shared<Figure::Node>();
    n->num = v;
    return n;
  }
  NodeP string() {
    const char q = t_[p_++];
    const size_t end = t_.find(q, p_);
    if (end == std::string::npos) error("the string is not closed");
    auto n = std::make_shared<Figure::Node>();
    n->kind = Figure::Node::Str;
    n->str = t_.substr(p_, end - p_);
    p_ = end + 1;
    return n;
  }
  std::string name() {
    skip();
    const size_t b = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_')) p_++;
    if (b == p_) error("expected a name");
    return t_.substr(b, p_ - b);
  }
  NodeP path() {
    auto n = std::make_shared<Figure::Node>();
    n->kind = Figure::Node::Path;
    std::string sig = name();
    if (sig == "at" && eat("(")) {  // at("mark", expr): expr on the snapshot `mark NAME` kept
      NodeP m = string_arg();
      expect(",");
      n->kind = Figure::Node::At;
      n->str = m->str;
      n->kids = {binary()};
      expect(")");
      return n;
    }
    for (;;) {
      if (eat(".")) {
        sig += "." + name();
      } else if (eat("[")) {
        sig += "[]";
        n->kids.push_back(binary());
        expect("]");
      } else if (eat("(")) {
        sig += "()";
        if (!eat(")")) {
          do n->kids.push_back(arg());
          while (eat(","));
          expect(")");
        }
      } else {
        break;
      }
    }
    n->str = sig;
    n->entry = find_entry(sig);
    if (!n->entry) {
      std::vector<std::string> sigs;
      for (const Entry& e : entries()) sigs.push_back(signature_of(e.name));
      const std::string near = closest_word(sig, sigs);
      const Entry* e = near.empty() ? nullptr : find_entry(near);
      fail("unknown live figure '" + sig + "'" +
           (e ? "; did you mean '" + std::string(e->name) + "'?" : "; lessons/README.md lists the figures"));
    }
    const std::string types = n->entry->types;
    const size_t bar = types.find('|');
    const size_t required = bar == std::string::npos ? types.size() : bar;
    const size_t most = types.size() - (bar == std::string::npos ? 0 : 1);
    if (n->kids.size() < required || n->kids.size() > most)
      fail("'" + sig + "' is written " + n->entry->name);
    for (size_t i = 0, k = 0; i < types.size() && k < n->kids.size(); i++) {
      if (types[i] == '|') continue;
      const bool want_str = types[i] == 's';
      if (want_str != (n->kids[k]->kind == Figure::Node::Str))
        fail(std::string("argument ") + std::to_string(k + 1) + " of " + n->entry->name + (want_str ? " is a \"quoted\" name" : " is a number"));
      k++;
    }
    return n;
  }
  NodeP string_arg() {
    skip();
    if (p_ >= t_.size() || (t_[p_] != '"' && t_[p_] != '\'')) error("expected a \"quoted\" name");
    return string();
  }
  NodeP arg() {
    skip();
    if (p_ < t_.size() && (t_[p_] == '"' || t_[p_] == '\'')) return string();
    return binary();
  }

  const std::string& t_;
  size_t p_ = 0;
  int depth_ = 0;  // Nest levels open now
};

double eval_node(const Figure::Node& n, const FigureScope& sc);

// Sizes beyond any machine (and beyond an int64's exact doubles) are refused before a formula sees them.
constexpr double kMaxFigureArgument = 1e15;

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

double eval_path(const Figure::Node& n, const FigureScope& sc) {
  Args args;
  for (const auto& k : n.kids) {
    Arg a;
    if (k->kind == Figure::Node::Str) a.is_str = true, a.str = k->str;
    else a.num = eval_node(*k, sc);
    if (!a.is_str && !(std::fabs(a.num) <= kMaxFigureArgument))
      fail(n.str + ": argument " + std::to_string(args.size() + 1) + " is " + format_number(a.num) +
           "; live figures take finite arguments up to 1e15");
    args.push_back(a);
  }
  // Whatever the engine's formula throws for arguments a lesson chose (a world of 0 breaks an
  // invariant, an index past a schedule's end is out of range) is one sentence in the panel, never an
  // exception that ends the lab.
  try {
    return n.entry->scoped ? n.entry->scoped(sc, args) : n.entry->fn(*sc.now, args);
  } catch (const Error& e) {
    fail(n.str + ": " + e.what());
  } catch (const std::bad_alloc&) {
    fail(n.str + ": these arguments ask for more memory than this machine has; use smaller ones");
  } catch (const std::exception& e) {
    fail(n.str + ": cannot be computed for these arguments (" + e.what() + ")");
  }
}

double eval_node(const Figure::Node& n, const FigureScope& sc) {
  switch (n.kind) {
    case Figure::Node::Num: return n.num;
    case Figure::Node::Str: fail("\"" + n.str + "\" is a name, not a number");
    case Figure::Node::Path: return eval_path(n, sc);
    case Figure::Node::Neg: return -eval_node(*n.kids[0], sc);
    case Figure::Node::Not: return eval_node(*n.kids[0], sc) == 0 ? 1 : 0;
    case Figure::Node::At: {
      FigureScope then{&marked(sc, n.str), sc.marks};
      return eval_node(*n.kids[0], then);
    }
    case Figure::Node::Bin: break;
  }
  const double l = eval_node(*n.kids[0], sc);
  if (n.str == "&&" && l == 0) return 0;
  if (n.str == "||" && l != 0) return 1;
  const double r = eval_node(*n.kids[1], sc);
  const std::string& op = n.str;
  if (op == "+") return l + r;
  if (op == "-") return l - r;
  if (op == "*") return l * r;
  if (op == "/") {
    if (r == 0) fail("division by zero in a figure");
    return l / r;
  }
  if (op == "==") return l == r;
  if (op == "!=") return l != r;
  if (op == "<") return l < r;
  if (op == "<=") return l <= r;
  if (op == ">") return l > r;
  if (op == ">=") return l >= r;
  if (op == "||") return r != 0;  // the left side was 0
  return (l != 0) && (r != 0);
}

void explain_node(const Figure::Node& n, const FigureScope& sc, std::string& out) {
  if (n.kind == Figure::Node::Path && n.entry && std::string(n.entry->types).empty()) {
    std::string v;
    try {
      v = format_figure(eval_node(n, sc));
    } catch (const Error&) {
      v = "(none)";
    }
    const std::string item = n.str + " = " + v;
    if (out.find(item) == std::string::npos) out += (out.empty() ? "" : ", ") + item;
  }
  if (n.kind != Figure::Node::At)
    for (const auto& k : n.kids) explain_node(*k, sc, out);
}

}  // namespace

Figure Figure::parse(const std::string& text) {
  Figure f;
  f.text_ = text;
  f.root_ = Parser(text).parse();
  return f;
}

double Figure::eval(const FigureScope& scope) const {
  DTLAB_CHECK(root_ && scope.now, "evaluate a parsed figure on a snapshot");
  return eval_node(*root_, scope);
}

std::vector<std::string> Figure::names() const {
  std::vector<std::string> out;
  std::vector<const Node*> todo;
  if (root_) todo.push_back(root_.get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (n->kind == Node::Path && n->entry && std::find(out.begin(), out.end(), n->str) == out.end()) out.push_back(n->str);
    for (const auto& k : n->kids) todo.push_back(k.get());
  }
  return out;
}

std::string Figure::explain(const FigureScope& scope) const {
  std::string out;
  if (root_) explain_node(*root_, scope, out);
  return out;
}

const std::vector<FigureInfo>& figure_vocabulary() {
  static const std::vector<FigureInfo> v = [] {
    std::vector<FigureInfo> out;
    for (const Entry& e : entries()) out.push_back({e.name, e.help});
    return out;
  }();
  return v;
}

std::string format_figure(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string closest_word(const std::string& word, const std::vector<std::string>& options) {
  return cli::closest_word(word, options);
}

}  // namespace dtlab::app
