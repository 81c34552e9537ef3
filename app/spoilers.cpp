#include "app/spoilers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

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

std::string find_spoiler(const std::vector<ScreenLine>& lines, const std::vector<std::string>& spellings) {
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  for (const ScreenLine& l : lines) {
    for (const std::string& sp : spellings) {
      for (size_t at = l.text.find(sp); at != std::string::npos; at = l.text.find(sp, at + 1)) {
        // "0.75" in "0.756", "4547" in "14547" or in "1.4547" is another number; "4,547." or "4,547,"
        // ending a clause is not.
        const std::string& t = l.text;
        const bool left = at == 0 || (!digit(t[at - 1]) && !((t[at - 1] == '.' || t[at - 1] == ',') && at >= 2 && digit(t[at - 2])));
        const size_t end = at + sp.size();
        const bool right = end >= t.size() || (!digit(t[end]) && !((t[end] == '.' || t[end] == ',') && end + 1 < t.size() && digit(t[end + 1])));
        if (left && right) return l.window + ": '" + l.text + "'";
      }
    }
  }
  return "";
}

}  // namespace dtlab::app
