// README.md and docs/*.md stay current: README stays one short page, every lesson count they state
// is the number of lessons in lessons/, every relative link and picture points at a file (and a
// heading, for a link with #anchor), and every dtlab-cli command README shows is one dtlab-cli
// accepts, checked by its own parser without training (cli::Mode, cli/cli.h). The quick start's
// tools/dtlab.sh modes and its headless demo are the script's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "cli_util.h"
#include "test_util.h"

// A named namespace: in a unity batch, this file's names sit beside the other test files'.
namespace dtlab::test::docs_check {

namespace fs = std::filesystem;

namespace {

const std::string kSource = DTLAB_SOURCE_DIR;

// The documentation pages, by path relative to the source root: README.md, docs/*.md and
// lessons/README.md (the lesson format).
std::vector<std::string> doc_pages() {
  std::vector<std::string> pages = {"README.md", "lessons/README.md"};
  for (const auto& e : fs::directory_iterator(kSource + "/docs"))
    if (e.path().extension() == ".md") pages.push_back("docs/" + e.path().filename().string());
  std::sort(pages.begin() + 2, pages.end());
  return pages;
}

int lesson_count() {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kSource + "/lessons"))
    if (e.path().extension() == ".md" && e.path().filename() != "README.md") n++;
  return n;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);) lines.push_back(line);
  return lines;
}

// Fenced code blocks: a run of 3 or more backticks (or tildes) after any indentation (fences in
// list items are indented) opens one, and only a run of the same character at least as long, alone
// on its line, closes it, so a ```` block can show ``` lines.
struct Fences {
  char ch = 0;  // the open block's fence character; 0 outside a block
  size_t len = 0;
  bool in() const { return ch != 0; }
  // Reads a line; true when it is a fence (and so belongs to neither code nor prose).
  bool fence(const std::string& line) {
    const size_t i = line.find_first_not_of(' ');
    if (i == std::string::npos || (line[i] != '`' && line[i] != '~')) return false;
    const size_t run = line.find_first_not_of(line[i], i) == std::string::npos ? line.size() - i
                                                                               : line.find_first_not_of(line[i], i) - i;
    if (run < 3) return false;
    if (!in()) {
      ch = line[i], len = run;
      return true;
    }
    if (line[i] != ch || run < len || line.find_first_not_of(' ', i + run) != std::string::npos) return false;
    ch = 0;
    return true;
  }
};

// The lines inside fenced code blocks, in order.
std::vector<std::string> code_lines(const std::string& text) {
  std::vector<std::string> out;
  Fences f;
  for (const std::string& line : lines_of(text))
    if (!f.fence(line) && f.in()) out.push_back(line);
  return out;
}

// The prose: fenced blocks become empty lines and inline code spans are dropped, so a `[x](y)`
// written as code is not a link.
std::string prose_of(const std::string& text) {
  std::string out;
  Fences f;
  for (const std::string& line : lines_of(text)) out += (f.fence(line) || f.in() ? "" : line) + "\n";
  std::string kept;
  for (size_t i = 0; i < out.size();) {
    if (out[i] != '`') { kept += out[i++]; continue; }
    size_t run = 0;
    while (i + run < out.size() && out[i + run] == '`') run++;
    const size_t close = out.find(std::string(run, '`'), i + run);
    if (close == std::string::npos) { kept += out.substr(i, run); i += run; continue; }
    i = close + run;
  }
  return kept;
}

// ---- lesson counts ----

int number_word(const std::string& w) {
  static const std::map<std::string, int> words = {
      {"zero", 0},     {"one", 1},        {"two", 2},       {"three", 3},    {"four", 4},
      {"five", 5},     {"six", 6},        {"seven", 7},     {"eight", 8},    {"nine", 9},
      {"ten", 10},     {"eleven", 11},    {"twelve", 12},   {"thirteen", 13}, {"fourteen", 14},
      {"fifteen", 15}, {"sixteen", 16},   {"seventeen", 17}, {"eighteen", 18}, {"nineteen", 19},
      {"twenty", 20},  {"thirty", 30},    {"forty", 40},    {"fifty", 50},   {"sixty", 60},
      {"seventy", 70}, {"eighty", 80},    {"ninety", 90}};
  const auto it = words.find(w);
  return it == words.end() ? -1 : it->second;
}

struct CountClaim {
  std::string phrase;
  int value = -1;
};

// Every "N lessons" a text states: digits ("24 lessons") or words ("twenty-four lessons",
// "twenty four guided lessons"). A statement about some of the lessons is written another way
// ("lessons 12 and 13").
std::vector<CountClaim> lesson_counts(const std::string& text) {
  static const std::regex claim(R"(\b([0-9]+|[a-z]+(?:[- ][a-z]+)?)\s+(?:guided\s+)?lessons\b)", std::regex::icase);
  std::vector<CountClaim> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), claim); it != std::sregex_iterator(); ++it) {
    std::string n = (*it)[1];
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
    int value = -1;
    if (std::isdigit(static_cast<unsigned char>(n[0]))) {
      value = std::stoi(n);
    } else {
      const size_t sep = n.find_first_of("- ");
      if (sep == std::string::npos) {
        value = number_word(n);
      } else {  // "twenty-four"; or "these two": only the last word is a number
        const int tens = number_word(n.substr(0, sep)), units = number_word(n.substr(sep + 1));
        value = tens >= 20 && tens % 10 == 0 && units >= 1 && units <= 9 ? tens + units : units;
      }
    }
    if (value >= 0) out.push_back({it->str(), value});
  }
  return out;
}

// ---- links ----

// A heading's anchor as GitHub makes it: lower case, spaces to '-', punctuation dropped (letters,
// digits, '-' and '_' stay; so do non-ASCII letters, approximated here as U+00C0 to U+024F).
std::string anchor_of(const std::string& heading) {
  std::string out;
  for (size_t i = 0; i < heading.size();) {
    const unsigned char c = static_cast<unsigned char>(heading[i]);
    if (c < 0x80) {
      if (std::isalnum(c) || c == '-' || c == '_') out += static_cast<char>(std::tolower(c));
      else if (c == ' ') out += '-';
      i++;
      continue;
    }
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    len = std::min(len, heading.size() - i);
    unsigned cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; k++) cp = (cp << 6) | (static_cast<unsigned char>(heading[i + k]) & 0x3F);
    if (cp >= 0xC0 && cp <= 0x24F && cp != 0xD7 && cp != 0xF7) out += heading.substr(i, len);
    i += len;
  }
  return out;
}

// The anchors of a Markdown page's headings (outside code blocks), numbered like GitHub's when
// two headings give the same one ("x", "x-1").
std::set<std::string> anchors(const std::string& text) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  Fences f;
  for (const std::string& line : lines_of(text)) {
    if (f.fence(line) || f.in() || line.empty() || line[0] != '#') continue;
    const size_t hashes = line.find_first_not_of('#');
    if (hashes == std::string::npos || hashes > 6 || line[hashes] != ' ') continue;
    std::string title = line.substr(hashes + 1);
    while (!title.empty() && (title.back() == ' ' || title.back() == '#')) title.pop_back();
    const std::string a = anchor_of(title);
    const int n = seen[a]++;
    out.insert(n == 0 ? a : a + "-" + std::to_string(n));
  }
  return out;
}

// What is wrong with each relative link and picture of `page` (a path under `root`): a target
// that does not exist, or an #anchor that names no heading of the page it points into.
std::vector<std::string> broken_links(const fs::path& root, const std::string& page, const std::string& text) {
  static const std::regex link(R"(\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\))");
  std::vector<std::string> out;
  const std::string prose = prose_of(text);
  const fs::path dir = (root / page).parent_path();
  for (auto it = std::sregex_iterator(prose.begin(), prose.end(), link); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1];
    if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 || target.rfind("mailto:", 0) == 0) continue;
    const size_t hash = target.find('#');
    const std::string path = target.substr(0, hash);
    const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
    const fs::path file = path.empty() ? root / page : dir / path;
    if (!fs::exists(file)) {
      out.push_back(page + ": (" + target + ") points at " + path + ", which does not exist");
      continue;
    }
    if (!anchor.empty() && file.extension() == ".md" && !anchors(read_file(file.string())).count(anchor))
      out.push_back(page + ": (" + target + ") names #" + anchor + ", which is no heading of " +
                    (path.empty() ? page : path));
  }
  return out;
}

// ---- commands ----

// A command line cut into words as the shell would (quotes; no expansions), without its comment.
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool have = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); i++) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
      else word += c;
    } else if (c == '\'' || c == '"') {
      quote = c, have = true;
    } else if (c == '#' && !have) {
      break;  // a comment starts a word
    } else if (c == ' ' || c == '\t') {
      if (have) words.push_back(word), word.clear(), have = false;
    } else {
      word += c, have = true;
    }
  }
  if (have) words.push_back(word);
  return words;
}

// The commands of a page's code blocks, each as its words (a line ending in '\' continues).
std::vector<std::vector<std::string>> commands(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::string joined;
  for (const std::string& line : code_lines(text)) {
    joined += line;
    if (!joined.empty() && joined.back() == '\\') {
      joined.pop_back();
      joined += ' ';
      continue;
    }
    std::vector<std::string> words = shell_words(joined);
    joined.clear();
    if (!words.empty()) out.push_back(words);
  }
  return out;
}

bool is_cli(const std::string& word) { return word == "dtlab-cli" || word == "build/bin/dtlab-cli"; }

// Runs on a GPU only: checked as flags, not as a run here.
bool names_gpu(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 1 < args.size(); i++)
    if ((args[i] == "--device" && args[i + 1] == "cuda") ||
        (args[i] == "--backend" && (args[i + 1] == "cuda" || args[i + 1] == "nccl")))
      return true;
  return false;
}

struct Checked {
  int code = -1;
  std::string out, err;
};

Checked check_cli(const std::vector<std::string>& args, cli::Mode mode) {
  std::ostringstream out, err;
  Checked r;
  r.code = cli::run_cli(args, {out, err, false, mode});
  r.out = out.str();
  r.err = err.str();
  return r;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// README's commands run from the source root (build/bin/..., tests/data/...).
struct InSourceRoot {
  fs::path before = fs::current_path();
  InSourceRoot() { fs::current_path(kSource); }
  ~InSourceRoot() { fs::current_path(before); }
};

}  // namespace

TEST_SUITE("docs") {
  TEST_CASE("README.md is shorter than 250 lines") {
    const std::string readme = read_file(kSource + "/README.md");
    REQUIRE(!readme.empty());
    const auto lines = std::count(readme.begin(), readme.end(), '\n');
    CHECK_MESSAGE(lines < 250, "README.md has " << lines << " lines; move detail to a page in docs/");
  }

  TEST_CASE("the lesson-count finder reads digits and number words") {
    const auto claims = lesson_counts("a course of 13 lessons; twenty-one lessons, Twenty four guided\nlessons; "
                                      "these two lessons; lessons 12 and 13; one lesson");
    REQUIRE(claims.size() == 4);
    CHECK(claims[0].value == 13);
    CHECK(claims[1].value == 21);
    CHECK(claims[2].value == 24);
    CHECK(claims[3].value == 2);
  }

  TEST_CASE("every lesson count in README.md and the docs is the number of lessons in lessons/") {
    const int lessons = lesson_count();
    REQUIRE(lessons > 0);
    int claims = 0;
    for (const std::string& page : doc_pages()) {
      for (const CountClaim& c : lesson_counts(read_file(kSource + "/" + page))) {
        claims++;
        CHECK_MESSAGE(c.value == lessons, page << " says '" << c.phrase << "', but lessons/ holds " << lessons
                                               << " lessons (its .md files other than README.md)");
      }
    }
    CHECK_MESSAGE(claims > 0, "README.md no longer says how many lessons the course has");
  }

  TEST_CASE("the link check finds a missing file and a missing heading") {
    const std::string page = "# Top\n\n## Two words\n\n[ok](#two-words) [self](#top) ![pic](assets/lab.png)\n"
                             "[gone](assets/no_such.png) [bad](#three-words) [web](https://example.org/x)\n"
                             "`[code](not/a/link.md)`\n```\n[block](not/a/link.md)\n```\n"
                             "````markdown\n```\n[inner](not/a/link.md)\n```\n## Not a heading\n````\n";
    const TempDir tmp("dtlab_links");
    const fs::path& dir = tmp.path;
    fs::create_directories(dir / "assets");
    { std::ofstream(dir / "assets" / "lab.png") << "x"; }
    { std::ofstream(dir / "page.md") << page; }
    const std::vector<std::string> broken = broken_links(dir, "page.md", page);
    REQUIRE(broken.size() == 2);
    CHECK(contains(broken[0], "assets/no_such.png"));
    CHECK(contains(broken[1], "#three-words"));
    CHECK(anchors(page) == std::set<std::string>{"top", "two-words"});
    CHECK(anchor_of("GPUs (CUDA and NCCL)") == "gpus-cuda-and-nccl");
    CHECK(anchor_of("17 Profiler traces of a multi-rank job") == "17-profiler-traces-of-a-multi-rank-job");
  }

  TEST_CASE("every relative link and picture in README.md and the docs points at a file that exists") {
    int links = 0;
    for (const std::string& page : doc_pages()) {
      const std::string text = read_file(kSource + "/" + page);
      REQUIRE_MESSAGE(!text.empty(), page);
      links += static_cast<int>(std::count(text.begin(), text.end(), ']'));
      for (const std::string& b : broken_links(kSource, page, text)) FAIL_CHECK(b);
    }
    CHECK(links > 0);
  }

  TEST_CASE("README.md links every page in docs/") {
    const std::string prose = prose_of(read_file(kSource + "/README.md"));
    for (const std::string& page : doc_pages())
      if (page.rfind("docs/", 0) == 0) CHECK_MESSAGE(contains(prose, "](" + page + ")"), "README.md does not link " << page);
  }

  TEST_CASE("the command check accepts a good command and refuses bad ones without training") {
    using cli::Mode;
    const Checked good = check_cli({"train", "--strategy", "ddp", "--world", "2", "--steps", "100000"}, Mode::CheckConfig);
    CHECK_MESSAGE(good.code == 0, good.err);
    CHECK_MESSAGE(!contains(good.out, "step "), "a checked command trained: " << good.out);
    // A flag CLI11 does not know; a combination only the run's own checks refuse.
    CHECK(check_cli({"train", "--no-such-flag"}, Mode::CheckFlags).code == 2);
    const std::vector<std::string> single4 = {"train", "--strategy", "single", "--world", "4"};
    CHECK(check_cli(single4, Mode::CheckFlags).code == 0);
    const Checked refused = check_cli(single4, Mode::CheckConfig);
    CHECK(refused.code == 2);
    CHECK(contains(refused.err, "--strategy single runs one rank"));
    // launch checks the flags of the command it would start.
    CHECK(check_cli({"launch", "--nproc-per-node", "2", "--", "train", "--strategy", "ddp"}, Mode::CheckConfig).code == 0);
    CHECK(check_cli({"launch", "--nproc-per-node", "2", "--", "train", "--no-such-flag"}, Mode::CheckConfig).code == 2);
  }

  TEST_CASE("every dtlab-cli command README.md shows is accepted by dtlab-cli") {
    const InSourceRoot here;
    int checked = 0;
    std::vector<std::string> saved;  // what earlier commands write (--save): a later --init reads it
    for (const std::vector<std::string>& words : commands(read_file(kSource + "/README.md"))) {
      if (!is_cli(words[0])) continue;
      const std::vector<std::string> args(words.begin() + 1, words.end());
      auto value_of = [&](const char* flag) {
        auto it = std::find(args.begin(), args.end(), flag);
        return it != args.end() && it + 1 != args.end() ? *(it + 1) : std::string();
      };
      if (const std::string out = value_of("--save"); !out.empty()) saved.push_back(out);
      // `generate --init gpt.safetensors` after the line that trains and saves it: the file does not
      // exist until that run, so only the order is checked.
      if (const std::string in = value_of("--init"); !in.empty() && std::find(saved.begin(), saved.end(), in) != saved.end()) {
        MESSAGE("'" << joined(words) << "' reads " << in << ", which an earlier command saves");
        continue;
      }
      // Every check a run makes before its first step; a GPU command's flags alone (it runs on a GPU).
      const cli::Mode mode = names_gpu(args) ? cli::Mode::CheckFlags : cli::Mode::CheckConfig;
      const Checked r = check_cli(args, mode);
      CHECK_MESSAGE(r.code == 0, "README.md shows '" << joined(words) << "', which dtlab-cli refuses: " << r.err);
      checked++;
    }
    CHECK(checked >= 5);
  }

  TEST_CASE("README.md's quick start is tools/dtlab.sh's modes, its headless demo and .ci/run") {
    const std::string readme = read_file(kSource + "/README.md");
    const std::string script = read_file(kSource + "/tools/dtlab.sh");
    // The modes the script takes: the pattern after `case "$mode" in` ("run|test) ;;").
    const size_t at = script.find("case \"$mode\" in");
    REQUIRE(at != std::string::npos);
    const size_t begin = script.find_first_not_of(" \n", script.find('\n', at));
    const std::string pattern = script.substr(begin, script.find(')', begin) - begin);
    std::set<std::string> modes;
    std::istringstream ps(pattern);
    for (std::string m; std::getline(ps, m, '|');) modes.insert(m);
    std::set<std::string> shown;
    for (const std::vector<std::string>& words : commands(readme))
      if (words.size() >= 2 && words[0] == "bash" && words[1] == "tools/dtlab.sh") {
        REQUIRE(words.size() >= 3);
        CHECK_MESSAGE(modes.count(words[2]), "README.md shows 'bash tools/dtlab.sh " << words[2] << "', a mode the script refuses");
        shown.insert(words[2]);
      }
    CHECK(shown == std::set<std::string>{"run", "test"});
    // CI runs exactly the test command.
    std::vector<std::string> ci;
    for (const std::string& line : lines_of(read_file(kSource + "/.ci/run")))
      if (!line.empty() && line[0] != '#') ci.push_back(line);
    CHECK(ci == std::vector<std::string>{"exec bash tools/dtlab.sh test"});
    CHECK(contains(readme, ".ci/run"));
    // The demo the run mode prints without a display is the one README shows.
    const std::vector<std::string> demo = quick_start_demo_args();
    REQUIRE(demo.size() > 4);
    bool found = false;
    for (const std::vector<std::string>& words : commands(readme))
      found = found || (is_cli(words[0]) && std::vector<std::string>(words.begin() + 1, words.end()) == demo);
    CHECK_MESSAGE(found, "README.md does not show tools/dtlab.sh's demo: dtlab-cli " << joined(demo));
  }
}

}  // namespace dtlab::test::docs_check
