// Lesson prose: Markdown parsed by md4c into the blocks and styled spans the lesson panel lays
// out, with each {{figure}} parsed and left as a span of its own.
#include <md4c.h>

#include <cstdlib>
#include <string>

#include "app/lesson.h"
#include "app/text.h"

namespace dtlab::app {

namespace {

// {{expr}} becomes this marker around the figure's index, which md4c passes through as text.
const std::string kFigOpen = "\xEE\x80\x80", kFigClose = "\xEE\x80\x81";

struct ProseBuilder {
  Prose out;
  std::vector<int> lists;   // open lists: 0 = bullets, else the next number
  uint8_t style = 0;
  int quote = 0;
  bool in_item = false;     // an item block is open and takes the text of its first paragraph
  bool in_cell = false;
  Block* cur = nullptr;

  Block& open(Block::Kind k) {
    out.push_back(Block{});
    out.back().kind = k;
    cur = &out.back();
    return *cur;
  }
  void add_text(const std::string& t) {
    if (!cur) open(quote ? Block::Quote : Block::Paragraph);
    if (cur->kind == Block::Code) {
      cur->code += t;
      return;
    }
    std::vector<Span>& spans = in_cell ? cur->cells.back() : cur->spans;
    if (!spans.empty() && spans.back().style == style && spans.back().figure < 0) spans.back().text += t;
    else spans.push_back(Span{t, style, -1});
  }
};

int on_enter_block(MD_BLOCKTYPE type, void* detail, void* user) {
  auto& b = *static_cast<ProseBuilder*>(user);
  switch (type) {
    case MD_BLOCK_UL: b.lists.push_back(0); break;
    case MD_BLOCK_OL: b.lists.push_back(static_cast<int>(static_cast<MD_BLOCK_OL_DETAIL*>(detail)->start)); break;
    case MD_BLOCK_LI: {
      Block& blk = b.open(Block::Item);
      blk.level = static_cast<int>(b.lists.size());
      if (b.lists.empty() || b.lists.back() == 0) blk.bullet = "•";
      else blk.bullet = std::to_string(b.lists.back()++) + ".";
      b.in_item = true;
      break;
    }
    case MD_BLOCK_P:
      if (!b.in_item) b.open(b.quote ? Block::Quote : Block::Paragraph);
      b.in_item = false;
      break;
    case MD_BLOCK_H: b.open(Block::Heading).level = static_cast<int>(static_cast<MD_BLOCK_H_DETAIL*>(detail)->level); break;
    case MD_BLOCK_CODE: b.open(Block::Code); break;
    case MD_BLOCK_QUOTE: b.quote++; break;
    case MD_BLOCK_HR: b.open(Block::Rule), b.cur = nullptr; break;
    case MD_BLOCK_TR: b.open(Block::TableRow); break;
    case MD_BLOCK_TH:
    case MD_BLOCK_TD:
      if (b.cur && b.cur->kind == Block::TableRow) {
        b.cur->cells.emplace_back();
        b.cur->level = type == MD_BLOCK_TH ? 1 : 0;
        b.in_cell = true;
      }
      break;
    default: break;
  }
  return 0;
}

int on_leave_block(MD_BLOCKTYPE type, void*, void* user) {
  auto& b = *static_cast<ProseBuilder*>(user);
  switch (type) {
    case MD_BLOCK_UL:
    case MD_BLOCK_OL: b.lists.pop_back(); break;
    case MD_BLOCK_QUOTE: b.quote--; break;
    case MD_BLOCK_TH:
    case MD_BLOCK_TD: b.in_cell = false; break;
    case MD_BLOCK_TR:
    case MD_BLOCK_LI:
    case MD_BLOCK_P:
    case MD_BLOCK_H:
    case MD_BLOCK_CODE: b.cur = nullptr, b.in_item = false; break;
    default: break;
  }
  return 0;
}

uint8_t span_style(MD_SPANTYPE t) {
  switch (t) {
    case MD_SPAN_EM: return Span::Em;
    case MD_SPAN_STRONG: return Span::Strong;
    case MD_SPAN_CODE: return Span::Code;
    case MD_SPAN_A: return Span::Link;
    default: return 0;
  }
}

int on_enter_span(MD_SPANTYPE t, void*, void* user) {
  static_cast<ProseBuilder*>(user)->style |= span_style(t);
  return 0;
}

int on_leave_span(MD_SPANTYPE t, void*, void* user) {
  static_cast<ProseBuilder*>(user)->style &= static_cast<uint8_t>(~span_style(t));
  return 0;
}

int on_text(MD_TEXTTYPE type, const MD_CHAR* text, MD_SIZE size, void* user) {
  auto& b = *static_cast<ProseBuilder*>(user);
  std::string t(text, size);
  if (type == MD_TEXT_SOFTBR) t = " ";
  else if (type == MD_TEXT_BR) t = "\n";
  else if (type == MD_TEXT_NULLCHAR) t = "";
  else if (type == MD_TEXT_ENTITY)
    t = t == "&amp;" ? "&" : t == "&lt;" ? "<" : t == "&gt;" ? ">" : t == "&quot;" ? "\"" : t == "&nbsp;" ? " " : t;
  b.add_text(t);
  return 0;
}

// Splits spans at the {{figure}} markers: the marker becomes a span of its own.
void split_figures(std::vector<Span>& spans) {
  std::vector<Span> out;
  for (const Span& s : spans) {
    size_t at = 0;
    while (true) {
      const size_t o = s.text.find(kFigOpen, at);
      if (o == std::string::npos) break;
      const size_t c = s.text.find(kFigClose, o);
      if (c == std::string::npos) break;  // parse_prose refuses the markers in a lesson's own text
      if (o > at) out.push_back(Span{s.text.substr(at, o - at), s.style, -1});
      const size_t num = o + kFigOpen.size();
      out.push_back(Span{"", s.style, std::atoi(s.text.substr(num, c - num).c_str())});
      at = c + kFigClose.size();
    }
    if (at < s.text.size()) out.push_back(Span{s.text.substr(at), s.style, -1});
  }
  spans = std::move(out);
}

}  // namespace

Prose parse_prose(const std::vector<std::pair<int, std::string>>& lines, Lesson& lesson) {
  std::string text;
  for (const auto& [line, raw] : lines) {
    // The two private-use characters mark where a figure goes in the text md4c sees: a lesson's own
    // text may not contain them.
    for (const std::string& mark : {kFigOpen, kFigClose})
      if (raw.find(mark) != std::string::npos)
        throw LessonError(lesson.path, line, std::string("the private-use character U+") + (mark == kFigOpen ? "E000" : "E001") +
                                                 " is reserved for live figures; delete it from the text");
    std::string l = raw;
    for (size_t o = l.find("{{"); o != std::string::npos; o = l.find("{{", o)) {
      const size_t c = l.find("}}", o);
      if (c == std::string::npos) throw LessonError(lesson.path, line, "'{{' without its closing '}}'");
      const std::string expr = trim(l.substr(o + 2, c - o - 2));
      try {
        lesson.figures.push_back(Figure::parse(expr));
      } catch (const Error& e) {
        throw LessonError(lesson.path, line, e.what());
      }
      const std::string marker = kFigOpen + std::to_string(lesson.figures.size() - 1) + kFigClose;
      l.replace(o, c + 2 - o, marker);
      o += marker.size();
    }
    text += l + "\n";
  }
  ProseBuilder b;
  MD_PARSER p{};
  p.flags = MD_FLAG_TABLES | MD_FLAG_STRIKETHROUGH | MD_FLAG_NOHTML | MD_FLAG_PERMISSIVEAUTOLINKS;
  p.enter_block = on_enter_block;
  p.leave_block = on_leave_block;
  p.enter_span = on_enter_span;
  p.leave_span = on_leave_span;
  p.text = on_text;
  // md4c fails only when it runs out of memory.
  DTLAB_CHECK(md_parse(text.data(), static_cast<MD_SIZE>(text.size()), &p, &b) == 0, "md4c could not parse a lesson's prose");
  for (Block& blk : b.out) {
    split_figures(blk.spans);
    for (auto& cell : blk.cells) split_figures(cell);
  }
  return std::move(b.out);
}

}  // namespace dtlab::app
