// The lessons beside the lab: the open lesson (its LessonRunner, app/lesson_runner.h) and the
// sentence of the last thing that went wrong with it, and the catalog the lesson panel lists when
// none is open. Files are read here, in update() before a frame is drawn, never by the panel: a
// lesson file is read again only when its modification time or size changed.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/lesson_runner.h"

namespace dtlab::app {

// The lessons on disk, with what this user reached in each.
struct LessonCatalog {
  struct Entry {
    std::string name, title, summary, error;
    int minutes = 0, steps = 0;
  };
  std::vector<Entry> lessons;
  std::map<std::string, LessonProgress> progress;
  // Lists the lessons directory and stats each file; re-reads those that changed, and the progress
  // file when it changed.
  void refresh();

 private:
  struct Stamp {
    std::filesystem::file_time_type time{};
    uintmax_t size = 0;
    bool operator==(const Stamp&) const = default;
  };
  static Stamp stamp_of(const std::string& path);
  std::map<std::string, std::pair<Stamp, Entry>> files_;  // by path
  std::string progress_file_;
  Stamp progress_stamp_;
  bool progress_read_ = false;
};

class LessonHost {
 public:
  // play: --play (answers every question with the live figure); progress_file: where progress is
  // kept ("" for scripted runs, which leave the user's progress alone).
  // seed: --seed given with --lesson; a lesson that draws its numbers (`draw:`) draws them from it,
  // else from a fresh seed each time it is opened (app/lesson.h).
  LessonHost(bool play, std::string progress_file, std::optional<uint64_t> seed = std::nullopt)
      : play_(play), progress_file_(std::move(progress_file)), seed_(seed) {}

  // Opens a lesson by name or path; false with the sentence in error() when it does not load.
  bool open(const std::string& name);
  void close() { runner_.reset(); }
  LessonRunner* runner() { return runner_.get(); }
  const LessonRunner* runner() const { return runner_.get(); }

  // A lesson file that does not parse, or the step that failed ("" when none); the panel shows it.
  const std::string& error() const { return error_; }
  void set_error(std::string why) { error_ = std::move(why); }

  // The live figures the current question asks about while it waits for Check: the views drawing
  // them stay covered (app/spoilers.h).
  std::vector<std::string> pending_figures() const;

  // Once a frame, before drawing: while the panel lists the lessons (`listing`), the catalog
  // follows the files on disk.
  void update(bool listing);
  const LessonCatalog& catalog() const { return catalog_; }

 private:
  bool play_ = false;
  std::string progress_file_;
  std::optional<uint64_t> seed_;
  std::unique_ptr<LessonRunner> runner_;
  std::string error_;
  LessonCatalog catalog_;
};

}  // namespace dtlab::app
