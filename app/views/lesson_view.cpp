// The lesson panel. Prose is laid out word by word (ImGui 1.86 wraps only single-style text), so
// emphasis, code and live {{figures}} sit inline and still wrap at the panel's edge.
#include "app/views/lesson_view.h"

#include <imgui.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <map>

namespace dtlab::app {

namespace {

constexpr ImU32 kLessonText = IM_COL32(228, 228, 232, 255);
constexpr ImU32 kLessonDim = IM_COL32(160, 164, 172, 255);
constexpr ImU32 kStrong = IM_COL32(255, 255, 255, 255);
constexpr ImU32 kEm = IM_COL32(150, 200, 255, 255);
constexpr ImU32 kCode = IM_COL32(255, 214, 140, 255);
constexpr ImU32 kCodeBg = IM_COL32(50, 52, 60, 255);
constexpr ImU32 kFigure = IM_COL32(120, 230, 160, 255);
constexpr ImU32 kGood = IM_COL32(98, 200, 110, 255);
constexpr ImU32 kBad = IM_COL32(240, 100, 100, 255);
constexpr ImU32 kWarn = IM_COL32(245, 180, 70, 255);
constexpr ImU32 kQuestionBg = IM_COL32(34, 44, 66, 255);

// Lays spans out from the cursor, wrapping at `right` (screen x); ends on a new line.
void draw_spans(const std::vector<Span>& spans, const LessonRunner* r, const Snapshot& s, float left, float right, ImU32 base) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float line_h = ImGui::GetTextLineHeightWithSpacing();
  const ImVec2 start = ImGui::GetCursorScreenPos();
  float x = left, y = start.y;
  bool line_start = true;
  for (const Span& sp : spans) {
    const std::string text = sp.figure >= 0 ? (r ? r->figure_text(sp.figure, s) : "—") : sp.text;
    const ImU32 col = sp.figure >= 0 ? kFigure : (sp.style & Span::Code) ? kCode : (sp.style & Span::Strong) ? kStrong
                      : (sp.style & (Span::Em | Span::Link)) ? kEm : base;
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] == '\n') {
        x = left, y += line_h, line_start = true, i++;
        continue;
      }
      // A word and the spaces after it.
      size_t j = i;
      while (j < text.size() && text[j] != ' ' && text[j] != '\n') j++;
      size_t k = j;
      while (k < text.size() && text[k] == ' ') k++;
      const std::string word = text.substr(i, j - i);
      const float w = ImGui::CalcTextSize(word.c_str()).x;
      const float ws = ImGui::CalcTextSize(text.substr(i, k - i).c_str()).x;
      if (!line_start && x + w > right) x = left, y += line_h;
      if (!word.empty()) {
        const ImVec2 p(x, y);
        // Code keeps one background across its spaces ("seed + epoch"), up to the line's end.
        const float bg = k < text.size() && x + ws <= right ? ws : w;
        if (sp.style & Span::Code || sp.figure >= 0)
          dl->AddRectFilled(ImVec2(p.x - 2, p.y), ImVec2(p.x + bg + 2, p.y + ImGui::GetTextLineHeight()), kCodeBg, 3);
        dl->AddText(p, col, word.c_str());
        if (sp.style & Span::Strong) dl->AddText(ImVec2(p.x + 1, p.y), col, word.c_str());  // no bold face: overstrike
        if (sp.style & Span::Link) dl->AddLine(ImVec2(p.x, p.y + ImGui::GetTextLineHeight()), ImVec2(p.x + w, p.y + ImGui::GetTextLineHeight()), col);
      }
      x += ws;
      line_start = false;
      i = k;
    }
  }
  ImGui::SetCursorScreenPos(start);
  ImGui::Dummy(ImVec2(std::max(1.0f, right - left), y - start.y + line_h));
}

void draw_table(const Prose& prose, size_t& i, const LessonRunner* r, const Snapshot& s) {
  size_t cols = 0, end = i;
  while (end < prose.size() && prose[end].kind == Block::TableRow) cols = std::max(cols, prose[end++].cells.size());
  if (cols > 0 && ImGui::BeginTable("##md_table", static_cast<int>(cols), ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg)) {
    for (; i < end; i++) {
      ImGui::TableNextRow(prose[i].level ? ImGuiTableRowFlags_Headers : 0);
      for (size_t c = 0; c < prose[i].cells.size(); c++) {
        ImGui::TableSetColumnIndex(static_cast<int>(c));
        const float left = ImGui::GetCursorScreenPos().x;
        draw_spans(prose[i].cells[c], r, s, left, left + ImGui::GetContentRegionAvail().x, prose[i].level ? kStrong : kLessonText);
      }
    }
    ImGui::EndTable();
  }
  i = end;
}

// `margin`: space kept free at the right (inside a box).
void draw_prose(const Prose& prose, const LessonRunner* r, const Snapshot& s, float margin = 0) {
  const float indent = ImGui::GetFontSize() * 1.2f;
  for (size_t i = 0; i < prose.size();) {
    const Block& b = prose[i];
    const float left = ImGui::GetCursorScreenPos().x, right = left + ImGui::GetContentRegionAvail().x - margin;
    switch (b.kind) {
      case Block::TableRow: draw_table(prose, i, r, s); continue;
      case Block::Paragraph: draw_spans(b.spans, r, s, left, right, kLessonText); break;
      case Block::Heading:
        ImGui::SetWindowFontScale(b.level <= 1 ? 1.3f : 1.12f);
        draw_spans(b.spans, r, s, left, right, kStrong);
        ImGui::SetWindowFontScale(1.0f);
        break;
      case Block::Item: {
        const float at = left + indent * static_cast<float>(b.level - 1);
        ImGui::GetWindowDrawList()->AddText(ImVec2(at, ImGui::GetCursorScreenPos().y), kLessonDim, b.bullet.c_str());
        // (A list's "10." is wider than the indent: its text starts after it.)
        const float mark = std::max(indent, ImGui::CalcTextSize(b.bullet.c_str()).x + ImGui::GetFontSize() * 0.35f);
        draw_spans(b.spans, r, s, at + mark, right, kLessonText);
        break;
      }
      case Block::Quote: {
        const ImVec2 p = ImGui::GetCursorScreenPos();
        draw_spans(b.spans, r, s, left + indent, right, kLessonDim);
        ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x + 2, p.y), ImVec2(p.x + 5, ImGui::GetCursorScreenPos().y - 4), kEm);
        break;
      }
      case Block::Code: {
        std::string code = b.code;
        while (!code.empty() && code.back() == '\n') code.pop_back();
        const ImVec2 p = ImGui::GetCursorScreenPos(), sz = ImGui::CalcTextSize(code.c_str());
        const float pad = ImGui::GetFontSize() * 0.4f;
        ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(right, p.y + sz.y + 2 * pad), kCodeBg, 4);
        if (sz.x + 2 * pad <= right - left) {
          ImGui::GetWindowDrawList()->AddText(ImVec2(p.x + pad, p.y + pad), kCode, code.c_str());
          ImGui::Dummy(ImVec2(right - left, sz.y + 2 * pad));
          break;
        }
        // Wider than the panel: the block scrolls sideways, as a code block on a web page does (a
        // command's flags are not wrapped into another meaning).
        const float bar = ImGui::GetStyle().ScrollbarSize;
        ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(right, p.y + sz.y + 2 * pad + bar), kCodeBg, 4);
        ImGui::PushStyleColor(ImGuiCol_ChildBg, IM_COL32(0, 0, 0, 0));
        ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(pad, pad));
        ImGui::BeginChild(ImGui::GetID(&b), ImVec2(right - left, sz.y + 2 * pad + bar), false,
                          ImGuiWindowFlags_HorizontalScrollbar | ImGuiWindowFlags_AlwaysUseWindowPadding);
        ImGui::PushStyleColor(ImGuiCol_Text, kCode);
        ImGui::TextUnformatted(code.c_str());
        ImGui::PopStyleColor();
        ImGui::EndChild();
        ImGui::PopStyleVar();
        ImGui::PopStyleColor();
        break;
      }
      case Block::Rule: ImGui::Separator(); break;
    }
    if (b.kind != Block::Item || i + 1 >= prose.size() || prose[i + 1].kind != Block::Item) ImGui::Spacing();
    i++;
  }
}

std::vector<std::string> draw_catalog(const LessonPanel& panel, const LessonCatalog& cat) {
  std::vector<std::string> out;
  ImGui::TextUnformatted("Lessons");
  ImGui::TextDisabled("%s", lessons_dir().c_str());
  if (!panel.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, kBad);
    ImGui::TextWrapped("%s", panel.error.c_str());
    ImGui::PopStyleColor();
  }
  ImGui::Separator();
  for (const LessonCatalog::Entry& e : cat.lessons) {
    ImGui::PushID(e.name.c_str());
    const auto it = cat.progress.find(e.name);
    char status[64] = "";
    if (it != cat.progress.end())
      std::snprintf(status, sizeof status, it->second.completed ? "  ✓ done" : "  step %d of %d", it->second.step, it->second.steps);
    if (ImGui::Button("Open")) out.push_back("open " + e.name);
    if (it != cat.progress.end() && !it->second.completed && it->second.step > 1) {
      ImGui::SameLine();
      if (ImGui::Button("Resume")) out.push_back("open " + e.name), out.push_back("goto " + std::to_string(it->second.step));
    }
    ImGui::SameLine();
    ImGui::Text("%s", e.title.c_str());
    ImGui::SameLine();
    ImGui::TextDisabled("%d min%s", e.minutes, status);
    if (!e.error.empty()) {
      ImGui::PushStyleColor(ImGuiCol_Text, kBad);
      ImGui::TextWrapped("%s", e.error.c_str());
      ImGui::PopStyleColor();
    } else if (!e.summary.empty()) {
      ImGui::Indent();
      ImGui::PushStyleColor(ImGuiCol_Text, kLessonDim);
      ImGui::TextWrapped("%s", e.summary.c_str());
      ImGui::PopStyleColor();
      ImGui::Unindent();
    }
    ImGui::PopID();
  }
  return out;
}

void draw_question(const LessonRunner& r, int j, const Snapshot& s, bool busy, LessonViewState& view, std::vector<std::string>& out) {
  const Question& q = *r.lesson().steps[static_cast<size_t>(j)].question;
  const LessonRunner::Answer& a = r.answer(j);
  const ImVec2 top = ImGui::GetCursorScreenPos();
  const float pad = ImGui::GetFontSize() * 0.5f;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->ChannelsSplit(2);  // the box behind, drawn once its height is known
  dl->ChannelsSetCurrent(1);
  ImGui::SetCursorScreenPos(ImVec2(top.x + pad, top.y + pad));
  ImGui::BeginGroup();
  const float left = top.x + pad, right = top.x + ImGui::GetContentRegionAvail().x - pad;
  ImGui::PushStyleColor(ImGuiCol_Text, kEm);
  ImGui::TextUnformatted("Question");
  ImGui::PopStyleColor();
  for (const Block& b : q.ask_prose) draw_spans(b.spans, &r, s, left, right, kStrong);
  ImGui::BeginDisabled(a.revealed || busy);
  if (!q.choices.empty()) {
    int pick = a.given ? a.choice : -1;
    for (size_t i = 0; i < q.choices.size(); i++) {
      const bool right_one = a.revealed && a.live_choice == static_cast<int>(i);
      if (right_one) ImGui::PushStyleColor(ImGuiCol_Text, kGood);
      // The button, then its text wrapped at the box's edge (a long choice on a narrow panel), which
      // picks it too.
      ImGui::PushID(static_cast<int>(i));
      bool picked = ImGui::RadioButton("##choice", &pick, static_cast<int>(i));
      ImGui::SameLine(0, ImGui::GetStyle().ItemInnerSpacing.x);
      ImGui::PushTextWrapPos(right - ImGui::GetWindowPos().x);
      ImGui::TextUnformatted(q.choices[i].text.c_str());
      ImGui::PopTextWrapPos();
      picked = picked || (ImGui::IsItemClicked() && !a.revealed && !busy);
      ImGui::PopID();
      if (picked) out.push_back("answer " + std::to_string(i + 1));
      if (right_one) ImGui::PopStyleColor();
    }
  } else {
    // The answer being typed, per lesson step, until Check sends it: a number, a fraction (1/4) or a
    // percentage (25%), as a learner would write a share.
    std::array<char, 64>& buf = view.typed[r.lesson().path + "#" + std::to_string(j)];
    if (a.given && buf[0] == '\0') std::snprintf(buf.data(), buf.size(), "%s", format_figure(a.number).c_str());
    double parsed = 0;
    const bool valid = q.parse_answer(buf.data(), parsed);
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 10);
    ImGui::InputTextWithHint(q.unit.empty() ? "##answer" : q.unit.c_str(), q.answer_hint().c_str(), buf.data(), buf.size());
    if (ImGui::IsItemDeactivatedAfterEdit() && valid) out.push_back(std::string("answer ") + buf.data());
    ImGui::BeginDisabled(!valid);
    if (!a.revealed && ImGui::Button("Check")) out.push_back(std::string("answer ") + buf.data()), out.push_back("check");
    ImGui::EndDisabled();
    ImGui::SameLine();
  }
  if (!a.revealed) {
    if (!q.choices.empty()) {
      ImGui::BeginDisabled(!a.given);
      if (ImGui::Button("Check")) out.push_back("check");
      ImGui::EndDisabled();
    }
    ImGui::SameLine();
    if (ImGui::Button("Reveal")) out.push_back("demo");
  }
  ImGui::EndDisabled();
  if (a.revealed) {
    ImGui::Spacing();
    const std::string live = r.answer_text(j);
    const std::string line = !a.checked ? "The engine says: " + live
                             : a.correct ? "✓ Correct. The engine says: " + live
                                         : "✗ Not quite. The engine says: " + live;
    draw_spans({Span{line, Span::Plain, -1}}, &r, s, left, right, !a.checked ? kFigure : a.correct ? kGood : kBad);
    // Name the figure the engine revealed, when it is one (not a constant) and short enough to read.
    const std::string& f = q.answer.text();
    const bool named = std::any_of(f.begin(), f.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
    if (named) {
      ImGui::PushStyleColor(ImGuiCol_Text, kLessonDim);
      const char* from = f.rfind("trace.", 0) == 0 ? "the opened trace" : "the live run";
      if (f.size() <= 48) ImGui::TextWrapped("(%s, read from %s)", f.c_str(), from);
      else ImGui::TextWrapped("(read from %s)", from);
      ImGui::PopStyleColor();
    }
    if (!a.note.empty()) {
      ImGui::PushStyleColor(ImGuiCol_Text, kWarn);
      ImGui::TextWrapped("%s", a.note.c_str());
      ImGui::PopStyleColor();
    }
    if (!q.explain.empty()) {
      ImGui::Spacing();
      draw_prose(q.explain, &r, s, pad);
    }
  }
  ImGui::EndGroup();
  const ImVec2 bottom(top.x + ImGui::GetContentRegionAvail().x, ImGui::GetItemRectMax().y + pad);
  dl->ChannelsSetCurrent(0);
  dl->AddRectFilled(top, bottom, kQuestionBg, 6);
  dl->ChannelsMerge();
  ImGui::SetCursorScreenPos(ImVec2(top.x, bottom.y));
  ImGui::Dummy(ImVec2(1, pad));
}

// On the last step of a lesson whose questions name topics (the interview drill): the learner's
// answers scored per topic, to see what to practise.
void draw_topic_scores(const LessonRunner& r) {
  const std::vector<LessonRunner::TopicScore> scores = r.topic_scores();
  if (scores.empty()) return;
  ImGui::Spacing();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kStrong), "Your answers by topic");
  if (!ImGui::BeginTable("##topic_scores", 3, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerH | ImGuiTableFlags_SizingStretchProp))
    return;
  ImGui::TableSetupColumn("topic");
  ImGui::TableSetupColumn("right / checked");
  ImGui::TableSetupColumn("questions");
  ImGui::TableHeadersRow();
  int right = 0, total = 0;
  for (const LessonRunner::TopicScore& t : scores) {
    ImGui::TableNextRow();
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(t.topic.c_str());
    ImGui::TableNextColumn();
    ImGui::Text("%d / %d", t.correct, t.checked);
    ImGui::TableNextColumn();
    ImGui::Text("%d", t.questions);
    right += t.correct, total += t.questions;
  }
  ImGui::EndTable();
  ImGui::TextDisabled("%d right of %d questions", right, total);
}

}  // namespace

std::vector<std::string> draw_lesson_view(const LessonPanel& panel, LessonViewState& view, const Snapshot& s, ViewContext& ctx) {
  if (!panel.runner) return draw_catalog(panel, *panel.catalog);
  std::vector<std::string> out;
  const LessonRunner& r = *panel.runner;
  const Lesson& l = r.lesson();
  const int j = std::max(0, r.step());
  const LessonStep& st = l.steps[static_cast<size_t>(j)];
  ImGui::SetWindowFontScale(1.15f);
  ImGui::PushTextWrapPos(0.0f);  // a long title wraps at the panel's edge (1280 x 720: "...not the batch")
  ImGui::TextUnformatted(l.title.c_str());
  ImGui::PopTextWrapPos();
  ImGui::SetWindowFontScale(1.0f);
  char progress[128];
  std::snprintf(progress, sizeof progress, "step %d of %d%s", j + 1, r.steps(), r.finished() ? " — done" : "");
  ImGui::ProgressBar(static_cast<float>(j + (r.finished() ? 1 : 0)) / static_cast<float>(r.steps()), ImVec2(-1, 0), progress);
  if (!panel.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, kBad);
    ImGui::TextWrapped("%s", panel.error.c_str());
    ImGui::PopStyleColor();
  }
  const float footer = ImGui::GetFrameHeightWithSpacing() * 2.0f;
  ImGui::BeginChild("##lesson_body", ImVec2(0, -footer), false);
  {
    const float left = ImGui::GetCursorScreenPos().x;
    ImGui::SetWindowFontScale(1.12f);
    draw_spans({Span{st.title, Span::Strong, -1}}, &r, s, left, left + ImGui::GetContentRegionAvail().x, kStrong);
    ImGui::SetWindowFontScale(1.0f);
    ImGui::Spacing();
    draw_prose(st.prose, &r, s);
    if (st.question) draw_question(r, j, s, panel.busy, view, out);
    if (j + 1 == r.steps()) draw_topic_scores(r);
  }
  ImGui::EndChild();
  ImGui::Separator();
  ImGui::BeginDisabled(panel.busy);
  ImGui::BeginDisabled(j == 0);
  if (ImGui::Button("< Back")) out.push_back("back");
  ImGui::EndDisabled();
  ImGui::SameLine();
  const bool last = j + 1 >= r.steps();
  ImGui::BeginDisabled(last && r.finished());
  if (ImGui::Button(last ? "Finish" : "Next >")) out.push_back("next");
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::Button("Restart")) out.push_back("goto 1");
  ImGui::EndDisabled();
  ImGui::SameLine();
  if (ImGui::Button("Close")) out.push_back("close");
  // The key's hint, the longest form that fits the row (a narrow panel: none).
  const char* hint = panel.busy ? "running…" : "N: next demo step";
  ImGui::SameLine();
  const float room = ImGui::GetContentRegionAvail().x;
  if (!panel.busy && (ctx.presentation || ImGui::CalcTextSize(hint).x > room)) hint = "N: next";
  if (ImGui::CalcTextSize(hint).x <= room) ImGui::TextDisabled("%s", hint);
  return out;
}

}  // namespace dtlab::app
