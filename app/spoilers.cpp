#include "app/spoilers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "app/figures.h"
#include "app/text.h"
#include "engine/core/format.h"

namespace dtlab::app {

std::vector<std::string> views_drawing(const std::string& sig) {
  auto starts = [&](const char* p) { return sig.rfind(p, 0) == 0; };
  // What each view prints (see app/views/*.cpp); the planner's formulas (plan.*, algo.*, cost.*,
  // schedule.*) take arguments no view draws, so they cover nothing.
  if (starts("collective") || starts("sent(")) return {"ring", "inspector"};
  if (starts("watchdog")) return {"inspector"};
  if (starts("count.bucket_allreduces")) return {"buckets", "timeline"};
  if (starts("bucket")) return {"buckets"};  // bucket.of, bucket[I].*, bucket.count, buckets.*
  if (starts("history") || starts("loss(") || starts("accuracy(") || starts("iteration.modeled_us")) return {"timeline"};
  if (starts("memory")) return {"memory"};
  // fp16's loss scaler: the timeline marks skipped steps and prints the scale.
  if (starts("scaler.") || starts("count.skipped_steps")) return {"timeline"};
  if (starts("unit")) return {"shards", "memory"};
  if (starts("data")) return {"data"};
  if (starts("pipeline")) return {"pipeline", "timeline"};
  // The tuning model's predictions: the busbw plot prints the crossovers, the inspector the why.
  if (starts("tune.")) return {"sweep", "inspector"};
  // Mixture of experts: the Experts view draws each rank's routing (bars, capacity, drops, aux
  // loss); the rows a rank's experts computed are also the columns of the dispatch's All-to-all
  // matrix, which prints each pair's bytes and what each rank sends.
  if (starts("moe.rows")) return {"experts", "alltoall"};
  if (starts("moe.")) return {"experts"};
  if (starts("alltoall.")) return {"alltoall"};
  // Context parallelism: the Context view draws each rank's ring steps, pairs, blocks and sends.
  if (starts("cp.")) return {"context"};
  // The calculator's figures: the Sizing view prints every one of them for its own settings.
  if (starts("sizing")) return {"sizing"};
  // An imported trace's panels (app/views/trace_view.cpp) print its collectives, arrivals and
  // breakdown everywhere; its counts (ranks, iterations, collectives) are in the toolbar anyway.
  if (starts("trace.") && sig != "trace.ranks" && sig != "trace.iterations" && sig != "trace.collectives")
    return {"timeline", "collectives", "breakdown", "compare"};
  return {};
}

namespace {

void append_utf8(std::string& out, unsigned int c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

struct Glyph {
  float pen, next, line_y, size;  // pen: where its advance starts; next: where the next glyph's would; size: the font's, as drawn
  unsigned int c;
};

}  // namespace

std::vector<ScreenLine> screen_text(const ImDrawData& data) {
  // Each visible glyph is a quad whose corners carry its (U0, V0) and (U1, V1) in the font atlas.
  std::map<std::pair<float, float>, std::pair<const ImFontGlyph*, float>> by_uv;  // glyph, its font's size
  const ImFontAtlas* atlas = ImGui::GetIO().Fonts;
  for (const ImFont* f : atlas->Fonts)
    for (const ImFontGlyph& g : f->Glyphs)
      if (g.Visible) by_uv.emplace(std::make_pair(g.U0, g.V0), std::make_pair(&g, f->FontSize));
  std::map<std::string, std::vector<Glyph>> per_window;
  for (int l = 0; l < data.CmdListsCount; l++) {
    const ImDrawList* dl = data.CmdLists[l];
    std::string window = dl->_OwnerName ? dl->_OwnerName : "";
    window = window.substr(0, window.find('/'));  // "Buckets/##rows_1234" belongs to "Buckets"
    if (const size_t hash = window.find("##"); hash != std::string::npos) window = window.substr(0, hash);
    const ImVector<ImDrawVert>& v = dl->VtxBuffer;
    for (int i = 0; i + 3 < v.Size;) {
      auto it = by_uv.find(std::make_pair(v[i].uv.x, v[i].uv.y));
      if (it == by_uv.end() || v[i + 2].uv.x != it->second.first->U1 || v[i + 2].uv.y != it->second.first->V1) {
        i++;
        continue;
      }
      const ImFontGlyph& g = *it->second.first;
      const float h = v[i + 2].pos.y - v[i].pos.y, gh = g.Y1 - g.Y0;
      const float scale = gh > 0 ? h / gh : 1.0f;
      const float pen = v[i].pos.x - g.X0 * scale;
      per_window[window].push_back({pen, pen + g.AdvanceX * scale, v[i].pos.y - g.Y0 * scale, scale * it->second.second, g.Codepoint});
      i += 4;
    }
  }
  std::vector<ScreenLine> out;
  for (auto& [window, glyphs] : per_window) {
    std::stable_sort(glyphs.begin(), glyphs.end(), [](const Glyph& a, const Glyph& b) { return a.line_y < b.line_y; });
    size_t b = 0;
    while (b < glyphs.size()) {
      size_t e = b + 1;
      while (e < glyphs.size() && glyphs[e].line_y - glyphs[b].line_y < 2.0f) e++;
      std::vector<Glyph> line(glyphs.begin() + static_cast<std::ptrdiff_t>(b), glyphs.begin() + static_cast<std::ptrdiff_t>(e));
      std::stable_sort(line.begin(), line.end(), [](const Glyph& x, const Glyph& y) { return x.pen < y.pen; });
      std::string text;
      for (size_t k = 0; k < line.size(); k++) {
        // Within a word each glyph starts where the last one's advance ended; a space (it has no
        // quad) or a new column leaves a gap.
        if (k > 0 && line[k].pen - line[k - 1].next > 0.15f * line[k].size) text += ' ';
        append_utf8(text, line[k].c);
      }
      out.push_back({window, text});
      b = e;
    }
  }
  return out;
}

std::vector<std::string> answer_spellings(double v, bool exact) {
  std::vector<std::string> s;
  if (!std::isfinite(v)) return s;
  char buf[64];
  const double a = std::fabs(v);
  if (v == std::floor(v)) {
    if (a < 100) return s;  // 4, 12, 64: everywhere on screen for other reasons
    const auto n = static_cast<int64_t>(v);
    s.push_back(std::to_string(n));
    if (a >= 1000) s.push_back(with_commas(n));
    if (a >= 1024 && v > 0 && !exact) s.push_back(human_bytes(n));
    return s;
  }
  // A fraction worth telling apart has three significant digits: 0.273, 1.83, 26.25.
  std::snprintf(buf, sizeof buf, "%.3g", v);
  if (std::string(buf).find_first_not_of("-0.") == std::string::npos) return s;
  size_t sig = 0;
  for (char c : std::string(buf)) sig += std::isdigit(static_cast<unsigned char>(c)) && (sig > 0 || c != '0') ? 1 : 0;
  if (sig < 3) return s;
  for (const char* f : {"%.2f", "%.3f", "%.3g", "%.4g"}) {
    std::snprintf(buf, sizeof buf, f, v);
    if (std::find(s.begin(), s.end(), buf) == s.end()) s.push_back(buf);
  }
  if (a <= 1) {
    for (const char* f : {"%.1f%%", "%.0f%%"}) {
      std::snprintf(buf, sizeof buf, f, 100 * v);
      if (std::find(s.begin(), s.end(), buf) == s.end()) s.push_back(buf);
    }
  }
  return s;
}

namespace {

bool digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// "0.75" in "0.756", "4547" in "14547" or in "1.4547" is another number; "4,547." or "4,547,"
// ending a clause is not.
bool whole_token(const std::string& t, size_t at, size_t len) {
  const bool left = at == 0 || (!digit(t[at - 1]) && !((t[at - 1] == '.' || t[at - 1] == ',') && at >= 2 && digit(t[at - 2])));
  const size_t end = at + len;
  const bool right = end >= t.size() || (!digit(t[end]) && !((t[end] == '.' || t[end] == ',') && end + 1 < t.size() && digit(t[end + 1])));
  return left && right;
}

// Prose names what it counts: "2048 tokens" is not an answer of 2048 bytes. True when the word
// after the number at `end` is a unit of count other than the question's.
bool counts_another_unit(const std::string& t, size_t end, const std::string& unit) {
  static const std::vector<std::string> kUnits = {"byte", "b", "kib", "mib", "gib", "kb", "mb", "gb", "float", "element",
                                                  "parameter", "token", "gpu", "rank", "node", "sample", "row", "feature",
                                                  "layer", "step", "iteration", "batch", "head", "bucket", "chunk", "µs",
                                                  "ms", "s", "second", "minute", "hour", "time", "way", "stage", "replica"};
  auto word_at = [](const std::string& x, size_t i) {
    std::string w;
    while (i < x.size() && x[i] == ' ') i++;
    while (i < x.size() && (std::isalpha(static_cast<unsigned char>(x[i])) || static_cast<unsigned char>(x[i]) >= 0x80))
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(x[i++])));
    if (w.size() > 2 && w.back() == 's' && w != "µs") w.pop_back();  // "tokens" counts as "token"
    return w;
  };
  if (unit.empty()) return false;
  const std::string next = word_at(t, end), own = word_at(unit, 0);
  return !next.empty() && next != own && std::find(kUnits.begin(), kUnits.end(), next) != kUnits.end();
}

}  // namespace

std::string find_spoiler(const std::vector<ScreenLine>& lines, const std::vector<std::string>& spellings, const std::string& unit) {
  for (const ScreenLine& l : lines)
    for (const std::string& sp : spellings)
      for (size_t at = l.text.find(sp); at != std::string::npos; at = l.text.find(sp, at + 1))
        if (whole_token(l.text, at, sp.size()) && !counts_another_unit(l.text, at + sp.size(), unit)) return l.window + ": '" + l.text + "'";
  return "";
}

namespace {

std::string spans_text(const std::vector<Span>& spans) {
  std::string t;
  for (const Span& sp : spans)
    // A {{figure}} is drawn live (the screen check reads it); `code` quotes a command's flags
    // (`--seq 2048`), not a quantity the lesson states.
    if (sp.figure < 0 && !(sp.style & Span::Code)) t += sp.text;
    else t += " ";
  return t;
}

void add_prose(std::vector<ScreenLine>& out, const std::string& where, const Prose& prose) {
  for (const Block& b : prose) {
    if (b.kind == Block::Code) {
      out.push_back({where, b.code});
    } else if (b.kind == Block::TableRow) {
      std::string row;
      for (const std::vector<Span>& cell : b.cells) row += " | " + spans_text(cell);
      out.push_back({where, row});
    } else if (b.kind != Block::Rule) {
      out.push_back({where, spans_text(b.spans)});
    }
  }
}

}  // namespace

std::vector<ScreenLine> lesson_text_before(const Lesson& lesson, int step) {
  std::vector<ScreenLine> out = {{"title", lesson.title}, {"summary", lesson.summary}};
  for (int k = 0; k <= step && k < static_cast<int>(lesson.steps.size()); k++) {
    const LessonStep& st = lesson.steps[static_cast<size_t>(k)];
    const std::string where = "step " + std::to_string(k + 1) + " '" + st.title + "'";
    out.push_back({where, st.title});
    add_prose(out, where, st.prose);
    if (!st.question) continue;
    add_prose(out, where + ", its question", st.question->ask_prose);
    if (k < step) add_prose(out, where + ", its explanation", st.question->explain);
  }
  return out;
}

std::vector<std::string> text_spellings(double v, bool exact, const std::string& unit) {
  std::vector<std::string> s = answer_spellings(v, exact);
  if (s.empty() && !unit.empty() && std::isfinite(v) && unit != "%") {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    s.push_back(std::string(buf) + " " + unit);
  }
  return s;
}

namespace {

// Units of one measure, by their factor to a base unit (seconds, bytes). Case matters: "Gb" is
// gigabits, a link's speed, not a size.
struct UnitScale {
  const char* name;
  int measure;  // 0: time, 1: size
  double factor;
};
constexpr UnitScale kScales[] = {
    {"µs", 0, 1e-6},   {"us", 0, 1e-6},   {"ms", 0, 1e-3},          {"s", 0, 1},
    {"second", 0, 1},  {"seconds", 0, 1}, {"minute", 0, 60},        {"minutes", 0, 60},
    {"hour", 0, 3600}, {"hours", 0, 3600}, {"B", 1, 1},             {"byte", 1, 1},
    {"bytes", 1, 1},   {"KiB", 1, 1024.0}, {"MiB", 1, 1048576.0},   {"GiB", 1, 1073741824.0},
    {"TiB", 1, 1099511627776.0}, {"KB", 1, 1e3}, {"kB", 1, 1e3},    {"MB", 1, 1e6},
    {"GB", 1, 1e9},    {"TB", 1, 1e12},
};

const UnitScale* unit_scale(const std::string& name) {
  for (const UnitScale& u : kScales)
    if (name == u.name) return &u;
  return nullptr;
}

bool letter(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || static_cast<unsigned char>(c) >= 0x80; }

// The answer stated in another unit of the same measure, converted into the question's unit: "1.5 s"
// where the question asks for milliseconds (the drill once said its straggler came "1.5 s" late and
// asked how many ms the healthy rank's iteration grew). A quantity followed by '/' is a rate
// ("25 GB/s"), not a size. Returns "'1.5 s' is 1500 ms", or "".
std::string other_unit_quantity(const std::string& t, const Question& q, double v) {
  const UnitScale* own = unit_scale(q.unit);
  if (!own || !std::isfinite(v)) return "";
  for (size_t i = 0; i < t.size(); i++) {
    if (!digit(t[i]) || (i > 0 && (digit(t[i - 1]) || letter(t[i - 1]) || t[i - 1] == '.' || t[i - 1] == ','))) continue;
    size_t e = i;
    const std::string number = number_at(t, i, e);
    size_t u = e < t.size() && t[e] == ' ' ? e + 1 : e;
    size_t ue = u;
    while (ue < t.size() && letter(t[ue])) ue++;
    const UnitScale* s = unit_scale(t.substr(u, ue - u));
    if (!s || s->measure != own->measure || s->factor == own->factor || (ue < t.size() && t[ue] == '/')) continue;
    if (const double in_own = std::stod(number) * s->factor / own->factor; q.close(in_own, v))
      return "'" + t.substr(i, ue - i) + "' is " + format_figure(in_own) + " " + q.unit;
  }
  return "";
}

// A choice's words: runs of lowercase letters and digits ("Layer 4's weight" -> layer, 4, s, weight).
std::set<std::string> choice_words(const std::string& t) {
  std::set<std::string> out;
  std::string w;
  for (size_t i = 0; i <= t.size(); i++) {
    const char c = i < t.size() ? t[i] : ' ';
    if (std::isalnum(static_cast<unsigned char>(c))) w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!w.empty()) out.insert(w), w.clear();
  }
  return out;
}

// A choice question that asks what comes first or last ("the bucket that launches last"), when the
// text before spells out an order, "A, then B, then C", whose first or last item names the right
// choice: a word or number of the right choice that no other choice has ("0" in "Layer 0's weight
// and bias"). The order was the answer; the question only asked to read it back. Returns which end
// and the item ("last: '0'"), or "". The order need not be about the question's subject: a lesson
// that lists an unrelated order beside such a question gets a false alarm, none of today's does.
std::string order_names_choice(const std::string& text, const Question& q, size_t right) {
  std::set<std::string> own = choice_words(q.choices[right].text);
  for (size_t c = 0; c < q.choices.size(); c++)
    if (c != right)
      for (const std::string& w : choice_words(q.choices[c].text)) own.erase(w);
  std::string t = text;
  std::replace(t.begin(), t.end(), '\n', ' ');
  const std::set<std::string> ask = choice_words(q.ask);
  const bool first = ask.count("first") > 0, last = ask.count("last") > 0;
  if (own.empty() || (!first && !last)) return "";
  // Sentences end at ". ", "; " or ": " (a decimal point has a digit after it).
  size_t b = 0;
  for (size_t i = 0; i <= t.size(); i++) {
    if (i < t.size() && !((t[i] == '.' || t[i] == ';' || t[i] == ':') && (i + 1 == t.size() || t[i + 1] == ' '))) continue;
    const std::string sentence = t.substr(b, i - b);
    b = i + 1;
    const std::string then = ", then ";
    const size_t first_then = sentence.find(then);
    if (first_then == std::string::npos) continue;
    // The first item is the clause before the first ", then" ("so layer 4 comes first"); the last
    // is what follows the last one.
    const size_t comma = first_then > 0 ? sentence.rfind(',', first_then - 1) : std::string::npos;
    const size_t hb = comma == std::string::npos ? 0 : comma + 1;
    const std::string head = sentence.substr(hb, first_then - hb);
    const std::string tail = sentence.substr(sentence.rfind(then) + then.size());
    for (const auto& [wanted, item, label] : {std::tuple{first, head, "first"}, std::tuple{last, tail, "last"}}) {
      if (!wanted) continue;
      for (const std::string& w : choice_words(item))
        if (own.count(w)) return std::string(label) + ": '" + trim_blanks(item) + "'";
    }
  }
  return "";
}

}  // namespace

double value_without_run(const Figure& f) {
  for (const std::string& n : f.names()) {
    bool formula = false;
    for (const char* p : {"plan.", "algo.", "tune.", "cost.", "schedule.", "link."}) formula |= n.rfind(p, 0) == 0;
    if (!formula) return std::numeric_limits<double>::quiet_NaN();
  }
  try {
    Snapshot empty;
    return f.eval(FigureScope{&empty, nullptr});
  } catch (const std::exception&) {
    return std::numeric_limits<double>::quiet_NaN();
  }
}

std::string bare_guess(const Question& q, double v) {
  if (!q.choices.empty() || !std::isfinite(v)) return "";
  const auto takes = [&](double guess) { return guess == v || q.close(guess, v); };
  if (takes(0)) return "'none' (0)";
  // A share or a ratio: no unit (or %), and an ask that says so.
  std::string ask = q.ask;
  std::transform(ask.begin(), ask.end(), ask.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  bool ratio = false;
  for (const std::string w : {"share", "fraction", "how many times", "ratio", "(0 to 1)"})
    for (size_t at = ask.find(w); at != std::string::npos; at = ask.find(w, at + 1))
      ratio |= at == 0 || !std::isalpha(static_cast<unsigned char>(ask[at - 1]));  // "iteration" is no ratio
  if (!ratio) return "";
  if (q.unit.empty() && takes(1)) return "'all' or 'the same' (1)";
  if (q.unit == "%" && takes(100)) return "'all' (100%)";
  return "";
}

std::string find_text_spoiler(const Lesson& lesson, int step, double v, const std::vector<double>& earlier) {
  if (step < 0 || step >= static_cast<int>(lesson.steps.size())) return "";
  const std::optional<Question>& q = lesson.steps[static_cast<size_t>(step)].question;
  if (!q) return "";
  if (!q->choices.empty()) {
    // The right choice, where its value needs no run (a choice's value may be a live figure).
    for (size_t c = 0; c < q->choices.size(); c++) {
      const double cv = value_without_run(q->choices[c].value);
      if (!std::isfinite(cv) || !q->close(cv, v)) continue;
      for (const ScreenLine& l : lesson_text_before(lesson, step))
        if (const std::string item = order_names_choice(l.text, *q, c); !item.empty())
          return l.window + ": '" + l.text + "' names the right choice ('" + q->choices[c].text + "') " + item;
      break;
    }
    return "";
  }
  const bool exact = v == std::floor(v) && q->tol_abs < 0 && q->tol_rel < 0;
  for (const ScreenLine& l : lesson_text_before(lesson, step)) {
    for (const std::string& sp : text_spellings(v, exact, q->unit))
      for (size_t at = l.text.find(sp); at != std::string::npos; at = l.text.find(sp, at + 1))
        // "4 GB/s" is a rate, not 4 GB.
        if (whole_token(l.text, at, sp.size()) && !counts_another_unit(l.text, at + sp.size(), q->unit) &&
            l.text.compare(at + sp.size(), 1, "/") != 0)
          return l.window + ": '" + l.text + "'";
    if (const std::string other = other_unit_quantity(l.text, *q, v); !other.empty())
      return l.window + ": '" + l.text + "' (" + other + ")";
  }
  if (answer_spellings(v).empty()) return "";  // too plain: an earlier 4 says nothing about this 4
  for (int k = 0; k < step && k < static_cast<int>(earlier.size()); k++) {
    const LessonStep& st = lesson.steps[static_cast<size_t>(k)];
    // An earlier answer in another unit (7.85 s against 8.27 ms) is another quantity.
    if (!st.question || !st.question->choices.empty() || st.question->unit != q->unit || !std::isfinite(earlier[static_cast<size_t>(k)]))
      continue;
    if (q->close(earlier[static_cast<size_t>(k)], v))
      return "step " + std::to_string(k + 1) + " '" + st.title + "''s answer (" + format_figure(earlier[static_cast<size_t>(k)]) +
             "), which this question takes as right";
  }
  return "";
}

}  // namespace dtlab::app
