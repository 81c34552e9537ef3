#include "app/lesson_host.h"

namespace dtlab::app {

LessonCatalog::Stamp LessonCatalog::stamp_of(const std::string& path) {
  std::error_code ec;
  Stamp s;
  s.time = std::filesystem::last_write_time(path, ec);
  s.size = ec ? 0 : std::filesystem::file_size(path, ec);
  return s;
}

void LessonCatalog::refresh() {
  std::map<std::string, std::pair<Stamp, Entry>> files;
  lessons.clear();
  for (const std::string& p : lesson_paths(lessons_dir())) {
    const Stamp st = stamp_of(p);
    auto it = files_.find(p);
    if (it == files_.end() || !(it->second.first == st)) {
      Entry e;
      e.name = lesson_name(p);
      try {
        Lesson l = load_lesson(p);
        e.title = l.title, e.summary = l.summary, e.minutes = l.minutes, e.steps = static_cast<int>(l.steps.size());
      } catch (const Error& err) {
        e.title = e.name, e.error = err.what();
      }
      files[p] = {st, e};
    } else {
      files[p] = it->second;
    }
    lessons.push_back(files[p].second);
  }
  files_ = std::move(files);
  // progress_path() follows the environment: read it again when it names another file.
  const std::string path = progress_path();
  const Stamp st = stamp_of(path);
  if (!progress_read_ || path != progress_file_ || !(st == progress_stamp_)) {
    progress = load_progress(path);
    progress_file_ = path, progress_stamp_ = st, progress_read_ = true;
  }
}

bool LessonHost::open(const std::string& name) {
  runner_.reset();
  try {
    runner_ = std::make_unique<LessonRunner>(load_lesson(name, seed_), play_, progress_file_);
    error_.clear();
  } catch (const Error& e) {  // the panel shows the sentence; the app goes on
    error_ = e.what();
    return false;
  }
  return true;
}

std::vector<std::string> LessonHost::pending_figures() const {
  return runner_ ? runner_->pending_figures() : std::vector<std::string>{};
}

void LessonHost::update(bool listing) {
  if (listing && !runner_) catalog_.refresh();
}

}  // namespace dtlab::app
