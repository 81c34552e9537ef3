// The lesson host (app/lesson_host.h): the catalog the lesson panel lists follows the files on disk,
// reading again only those that changed, outside any drawing.
#include <doctest/doctest.h>

#ifdef DTLAB_HAVE_GUI
#include <cstdlib>
#include <fstream>
#include <string>

#include "app/lesson_host.h"
#include "tests/test_util.h"

using namespace dtlab::app;

namespace {

void write_lesson(const std::string& path, const std::string& title) {
  std::ofstream(path) << "---\ntitle: " << title << "\nminutes: 5\nstrategy: ddp\nworld: 4\nmodel: small\nprofile: nvlink8\n---\n"
                      << "## First\nSome prose.\n";
}

// Points the catalog at a directory of its own (and a progress file nobody has) for one test.
struct LessonsDirFor {
  std::string saved_lessons, saved_state;
  bool had_lessons, had_state;
  LessonsDirFor(const std::string& lessons, const std::string& state) {
    const char* l = std::getenv("DTLAB_LESSONS");
    const char* s = std::getenv("XDG_STATE_HOME");
    had_lessons = l != nullptr, had_state = s != nullptr;
    if (l) saved_lessons = l;
    if (s) saved_state = s;
    ::setenv("DTLAB_LESSONS", lessons.c_str(), 1);
    ::setenv("XDG_STATE_HOME", state.c_str(), 1);
  }
  ~LessonsDirFor() {
    if (had_lessons) ::setenv("DTLAB_LESSONS", saved_lessons.c_str(), 1);
    else ::unsetenv("DTLAB_LESSONS");
    if (had_state) ::setenv("XDG_STATE_HOME", saved_state.c_str(), 1);
    else ::unsetenv("XDG_STATE_HOME");
  }
};

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("lesson host: the catalog lists the lessons on disk and follows a file that changed, one that came and one that went") {
    dtlab::test::TempDir dir("dtlab_lesson_host"), state("dtlab_lesson_host_state");
    const LessonsDirFor env(dir.path.string(), state.path.string());
    write_lesson(dir.file("01_first.md"), "First lesson");
    write_lesson(dir.file("02_second.md"), "Second lesson");
    LessonHost host(false, "");
    host.update(false);  // the list is not shown: nothing is read
    CHECK(host.catalog().lessons.empty());
    host.update(true);
    REQUIRE(host.catalog().lessons.size() == 2);
    CHECK(host.catalog().lessons[0].name == "first");
    CHECK(host.catalog().lessons[0].title == "First lesson");
    CHECK(host.catalog().lessons[1].steps == 1);

    write_lesson(dir.file("02_second.md"), "The second lesson, renamed");  // another size: read again
    write_lesson(dir.file("03_third.md"), "Third lesson");
    std::filesystem::remove(dir.file("01_first.md"));
    host.update(true);
    REQUIRE(host.catalog().lessons.size() == 2);
    CHECK(host.catalog().lessons[0].title == "The second lesson, renamed");
    CHECK(host.catalog().lessons[1].title == "Third lesson");

    std::ofstream(dir.file("03_third.md")) << "---\ntitle: broken\n";  // a file that no longer parses shows its error
    host.update(true);
    REQUIRE(host.catalog().lessons.size() == 2);
    CHECK_FALSE(host.catalog().lessons[1].error.empty());
  }
}
#endif  // DTLAB_HAVE_GUI
