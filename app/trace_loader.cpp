#include "app/trace_loader.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>


#include "engine/core/check.h"
#include "engine/trace/trace_input.h"

namespace dtlab::app {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

ComputeHue hue_of(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto has = [&s](const char* w) { return s.find(w) != std::string::npos; };
  // The autograd engine's spans (evaluate_function: AddmmBackward0, AccumulateGrad) are backward.
  if (has("backward") || has("autograd::engine") || has("accumulategrad")) return ComputeHue::Backward;
  if (has("optimizer") || has("sgd") || has("adam")) return ComputeHue::Optimizer;
  if (has("loss") || has("softmax") || has("nll")) return ComputeHue::Loss;
  return ComputeHue::Forward;
}

// The sentence a failed task shows; `doing` says what ran out of memory.
std::string failure_sentence(const std::exception_ptr& ep, const char* doing, const char* fix) {
  try {
    std::rethrow_exception(ep);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::bad_alloc&) {
    return std::string("out of memory while ") + doing + "; " + fix;
  } catch (const std::exception& e) {
    return std::string("internal error: ") + e.what();
  }
}

}  // namespace

TraceFiles list_trace_files(const std::vector<std::string>& paths) {
  std::error_code ec;
  if (paths.size() > 1)
    for (const std::string& p : paths)
      if (fs::is_directory(p, ec))
        throw Error("--open " + p + " is a directory among other paths; give one directory, or only the trace files");
  TraceFiles out;
  try {
    out.files = find_trace_files(paths);  // the importer's own listing: every path problem is one sentence
  } catch (const Error& e) {
    throw Error(std::string("--open ") + e.what());
  }
  for (const std::string& f : out.files) {
    const auto n = fs::file_size(f, ec);
    out.bytes += ec ? 0 : static_cast<int64_t>(n);
  }
  return out;
}

const char* task_state_name(TaskState s) {
  switch (s) {
    case TaskState::Idle: return "idle";
    case TaskState::Running: return "running";
    case TaskState::Done: return "done";
    case TaskState::Failed: return "failed";
    case TaskState::Cancelled: return "cancelled";
  }
  return "?";
}

TraceIndex index_trace(const ImportedTrace& t) {
  TraceIndex ix;
  ix.hue.reserve(t.names.size());
  for (const std::string& n : t.names) ix.hue.push_back(hue_of(n));
  ix.ranks.resize(t.ranks.size());
  for (size_t r = 0; r < t.ranks.size(); r++) {
    const RankTrace& rt = t.ranks[r];
    RankIndex& ri = ix.ranks[r];
    // The outermost spans of each lane on each thread: depth counts every span of a thread, so a
    // kernel or an op under ProfilerStep#N is deeper than 0 though nothing of its own lane holds it.
    // Issue spans are drawn as arrival marks, not bars.
    // Kineto repeats ProfilerStep#N on each GPU stream (gpu_user_annotation): the steps row shows
    // the host's, once. A device thread is named so, or in a Kineto trace runs kernels or copies
    // (the host's ops are not kept there).
    std::vector<char> device(rt.threads.size(), 0);
    for (size_t th = 0; th < rt.threads.size(); th++) device[th] = rt.threads[th].rfind("GPU ", 0) == 0;
    if (rt.format == TraceFormat::Kineto)
      for (const TraceSpan& s : rt.spans)
        if (s.cls == SpanClass::Compute || s.cls == SpanClass::Comm || s.cls == SpanClass::Memcpy)
          if (static_cast<size_t>(s.thread) < device.size()) device[static_cast<size_t>(s.thread)] = 1;
    std::map<std::pair<int, int32_t>, TraceRow> rows;
    std::map<std::pair<int, int32_t>, double> open_end;
    for (size_t i = 0; i < rt.spans.size(); i++) {
      const TraceSpan& s = rt.spans[i];
      if (s.cls == SpanClass::Issue) continue;
      if (s.lane == TraceLane::Annotation && static_cast<size_t>(s.thread) < device.size() && device[static_cast<size_t>(s.thread)]) continue;
      const std::pair<int, int32_t> key(static_cast<int>(s.lane), s.thread);
      auto [it, fresh] = open_end.try_emplace(key, -1e300);
      if (s.begin_us < it->second && s.end_us <= it->second) continue;  // inside an outer span of its lane
      it->second = std::max(it->second, s.end_us);
      TraceRow& row = rows[key];
      row.lane = s.lane, row.thread = s.thread;
      row.reach.push_back(row.reach.empty() ? s.end_us : std::max(row.reach.back(), s.end_us));
      row.spans.push_back(static_cast<int32_t>(i));
    }
    std::vector<std::pair<double, double>> compute, comm;
    for (auto& [key, row] : rows) {
      for (int32_t i : row.spans) {
        const TraceSpan& s = rt.spans[static_cast<size_t>(i)];
        if (s.cls == SpanClass::Compute) compute.emplace_back(s.begin_us, s.end_us);
        else if (s.cls == SpanClass::Comm) comm.emplace_back(s.begin_us, s.end_us);
      }
      ri.rows.push_back(std::move(row));
    }
    // Overlap: communication intersected with the union of compute (two sorted lists, one pass).
    compute = merge_intervals(std::move(compute));
    comm = merge_intervals(std::move(comm));
    for (size_t a = 0, b = 0; a < comm.size() && b < compute.size();) {
      const double lo = std::max(comm[a].first, compute[b].first), hi = std::min(comm[a].second, compute[b].second);
      if (hi > lo) ri.overlap.emplace_back(lo, hi);
      if (comm[a].second < compute[b].second) a++;
      else b++;
    }
    ri.collective_of.assign(rt.collectives.size(), -1);
  }
  for (size_t k = 0; k < t.collectives.size(); k++) {
    const std::vector<int>& idx = t.collectives[k].rank_index;
    for (size_t r = 0; r < idx.size() && r < ix.ranks.size(); r++)
      if (idx[r] >= 0 && static_cast<size_t>(idx[r]) < ix.ranks[r].collective_of.size())
        ix.ranks[r].collective_of[static_cast<size_t>(idx[r])] = static_cast<int32_t>(k);
  }
  return ix;
}

// ---- the loader: one job per open (a reopen cancels the last), one per comparison.

struct TraceLoader::Job {
  std::atomic<bool> cancel{false};
  std::atomic<double> fraction{0};
  std::atomic<TaskState> state{TaskState::Running};
  Clock::time_point start = Clock::now();
  std::atomic<double> done_s{0};
  TraceFiles files;  // set before the thread starts
  std::mutex mu;     // guards the two below, written once before `state` leaves Running
  std::shared_ptr<const LoadedTrace> result;
  std::string error;
};

struct TraceLoader::CompareJob {
  TraceCompareOptions options;
  std::atomic<TaskState> state{TaskState::Running};
  Clock::time_point start = Clock::now();
  std::atomic<double> done_s{0};
  std::mutex mu;
  std::shared_ptr<const TraceComparison> result;
  std::string error;
};

TraceLoader::~TraceLoader() {
  if (job_) job_->cancel = true;
  if (thread_.joinable()) thread_.join();
  if (compare_thread_.joinable()) compare_thread_.join();  // compare_trace takes no cancel flag; it runs a second or two
}

void TraceLoader::cancel() {
  if (job_) job_->cancel = true;
}

void TraceLoader::open(const std::vector<std::string>& paths, const std::vector<int>& ranks) {
  cancel();
  if (thread_.joinable()) thread_.join();  // the importer checks the flag as it reads, so this is short
  if (compare_thread_.joinable()) compare_thread_.join();
  compare_job_.reset();  // a comparison belongs to the trace it was made from
  paths_ = paths, ranks_ = ranks;
  auto job = std::make_shared<Job>();
  job_ = job;
  try {
    job->files = list_trace_files(paths);
  } catch (const Error& e) {
    job->error = e.what();
    job->state = TaskState::Failed;
    return;
  }
  thread_ = std::thread([job, ranks] {
    TraceImportOptions opt;
    opt.ranks = ranks;
    opt.cancel = &job->cancel;
    opt.progress = [j = job.get()](double f) { j->fraction.store(std::clamp(f, 0.0, 1.0), std::memory_order_relaxed); };
    std::shared_ptr<LoadedTrace> out;
    std::string error;
    try {
      out = std::make_shared<LoadedTrace>();
      out->trace = import_traces(job->files.files, opt);
      if (job->cancel) throw Error("cancelled");
      out->index = index_trace(out->trace);
      out->files = job->files;
      out->load_s = seconds_since(job->start);
    } catch (...) {
      out.reset();
      error = failure_sentence(std::current_exception(), "reading the traces", "open fewer ranks or a shorter recording");
    }
    job->done_s = seconds_since(job->start);
    TaskState s = out ? TaskState::Done : job->cancel ? TaskState::Cancelled : TaskState::Failed;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->result = std::move(out);
      job->error = std::move(error);
    }
    job->state.store(s, std::memory_order_release);
  });
}

void TraceLoader::compare(const TraceCompareOptions& opt) {
  if (!snap_.trace || (compare_job_ && compare_job_->state == TaskState::Running)) return;
  if (compare_thread_.joinable()) compare_thread_.join();
  auto job = std::make_shared<CompareJob>();
  job->options = opt;
  compare_job_ = job;
  std::shared_ptr<const LoadedTrace> trace = snap_.trace;
  compare_thread_ = std::thread([job, trace] {
    std::shared_ptr<TraceComparison> out;
    std::string error;
    try {
      out = std::make_shared<TraceComparison>(compare_trace(trace->trace, job->options));
    } catch (...) {
      error = failure_sentence(std::current_exception(), "training the model to compare", "compare a smaller model (--trace-model, or \"model\" in the traces' dtlab.json)");
    }
    job->done_s = seconds_since(job->start);
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->result = std::move(out);
      job->error = std::move(error);
    }
    job->state.store(job->result ? TaskState::Done : TaskState::Failed, std::memory_order_release);
  });
}

const TraceSnapshot& TraceLoader::poll() {
  TraceSnapshot& s = snap_;
  if (const std::shared_ptr<Job> j = job_) {
    s.load = j->state.load(std::memory_order_acquire);
    s.files = static_cast<int>(j->files.files.size());
    s.bytes = j->files.bytes;
    s.fraction = s.load == TaskState::Done ? 1.0 : j->fraction.load(std::memory_order_relaxed);
    s.elapsed_s = s.load == TaskState::Running ? seconds_since(j->start) : j->done_s.load();
    if (s.load != TaskState::Running) {
      std::lock_guard<std::mutex> lock(j->mu);
      s.trace = s.load == TaskState::Done ? j->result : nullptr;
      s.error = j->error;
    } else {
      s.trace.reset();
      s.error.clear();
    }
  } else {
    s = TraceSnapshot{};
  }
  s.paths = paths_;
  if (const std::shared_ptr<CompareJob> c = compare_job_) {
    s.compare = c->state.load(std::memory_order_acquire);
    s.compare_options = c->options;
    s.compare_elapsed_s = s.compare == TaskState::Running ? seconds_since(c->start) : c->done_s.load();
    if (s.compare != TaskState::Running) {
      std::lock_guard<std::mutex> lock(c->mu);
      s.comparison = c->result;
      s.compare_error = c->error;
    } else {
      s.comparison.reset();
      s.compare_error.clear();
    }
  } else {
    s.compare = TaskState::Idle;
    s.comparison.reset();
    s.compare_error.clear();
  }
  return s;
}

}  // namespace dtlab::app
