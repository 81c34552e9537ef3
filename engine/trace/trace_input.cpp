// Reading a trace folder's bytes defensively (trace_input.h).
#include "engine/trace/trace_input.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"

namespace dtlab {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxSidecarBytes = int64_t{1} << 20;

// Counts nesting and stops at the bound; every value is ignored (the depth is all it checks).
struct DepthSax {
  int depth = 0;
  bool too_deep = false;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(int64_t) { return true; }
  bool number_unsigned(uint64_t) { return true; }
  bool number_float(double, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool key(std::string&) { return true; }
  bool start_object(size_t) { return open(); }
  bool end_object() { return --depth, true; }
  bool start_array(size_t) { return open(); }
  bool end_array() { return --depth, true; }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  bool open() {
    too_deep = ++depth > kMaxTraceJsonDepth;
    return !too_deep;
  }
};

}  // namespace

bool is_trace_file_name(const std::string& name) {
  const bool json = name.size() > 5 && (name.ends_with(".json") || name.ends_with(".json.gz"));
  return json && name != "dtlab.json";
}

std::string trace_path_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) return "";
    return not_a_regular_file(path);  // a FIFO, a device, a socket: exists, but is no file to read
  }
  const int err = errno;
  struct stat lst {};
  switch (err) {
    case ELOOP:
      return "is a symbolic link loop (or a chain of links too long to resolve); point it at the trace file itself";
    case ENOENT:
      if (::lstat(path.c_str(), &lst) == 0)
        return "is a symbolic link to nothing (its target does not exist); point it at the trace file itself";
      return "does not exist; give a directory of per-rank traces (.json or .json.gz) or the trace files";
    case ENOTDIR:
      return "does not exist (a part of it is a file, not a directory); give a directory of per-rank traces or the trace files";
    case EACCES:
      return "cannot be reached (permission denied); check the permissions of its directories";
    default:
      return "cannot be read (" + os_reason(err) + ")";
  }
}

std::vector<std::string> find_trace_files(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("no trace given: pass a directory of per-rank traces or the files themselves.");
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    if (const std::string why = trace_path_problem(p); !why.empty()) throw Error(p + " " + why);
    std::error_code ec;
    if (!fs::is_directory(p, ec)) {
      out.push_back(p);
      continue;
    }
    // Entries are checked with stat, never with directory_entry's throwing accessors: a link loop
    // named rank3.json is one sentence, not a filesystem_error.
    std::vector<std::string> found;
    fs::directory_iterator it(p, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const fs::path entry = it->path();
      if (!is_trace_file_name(entry.filename().string())) continue;
      const std::string why = trace_path_problem(entry.string());
      std::error_code dir_ec;
      if (why.empty() && fs::is_directory(entry, dir_ec)) continue;  // a directory named x.json is no trace
      if (!why.empty()) throw Error(entry.string() + " " + why + " (or move it out of the trace directory)");
      found.push_back(entry.string());
    }
    if (ec) throw Error(p + " cannot be listed (" + ec.message() + "); check its permissions.");
    if (found.empty())
      throw Error(p + " holds no .json or .json.gz trace; point it at the directory the profiler wrote, one file per rank");
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

std::string bounded_name(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max >= 3 ? max - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) n--;  // not inside a character
  return s.substr(0, n) + "...";
}

std::string too_deep_sentence(const std::string& file) {
  return file + " nests its JSON deeper than " + std::to_string(kMaxTraceJsonDepth) +
         " levels; a profiler's trace is never this deep (it nests five, dtlab.json two): the file is corrupted.";
}

void check_trace_sidecar(const std::vector<std::string>& paths) {
  if (paths.empty()) return;
  std::error_code ec;
  const fs::path first(paths[0]);
  const fs::path p = (fs::is_directory(first, ec) ? first : first.parent_path()) / "dtlab.json";
  struct stat lst {};
  if (::lstat(p.c_str(), &lst) != 0) return;  // no sidecar: nothing to check
  if (const std::string why = trace_path_problem(p.string()); !why.empty()) throw Error(p.string() + " " + why);
  if (fs::is_directory(p, ec)) throw Error(p.string() + " is a directory; dtlab.json is a file of the traced job's settings.");
  const auto size = fs::file_size(p, ec);
  if (ec) throw Error(p.string() + " cannot be read (" + ec.message() + ").");
  if (static_cast<int64_t>(size) > kMaxSidecarBytes)
    throw Error(p.string() + " is " + human_bytes(static_cast<int64_t>(size)) +
                "; dtlab.json holds a few settings of the traced job (at most 1 MiB), e.g. {\"model\": \"mlp:2,512,512,3\", \"batch\": 32}.");
  std::ifstream in(p, std::ios::binary);
  DepthSax sax;
  nlohmann::json::sax_parse(in, &sax, nlohmann::json::input_format_t::json, true);
  if (sax.too_deep) throw Error(too_deep_sentence(p.string()));
}

// ---------------------------------------------------------------------------------------------

TraceFileBuf::TraceFileBuf(const std::string& path, const std::string& display, std::function<void(int64_t)> on_read,
                           const std::atomic<bool>* cancel)
    : display_(display), on_read_(std::move(on_read)), cancel_(cancel), buf_(1 << 16) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  const int64_t file_bytes = ec ? 0 : static_cast<int64_t>(size);
  if (file_bytes > kMaxTraceTextBytes)
    throw Error(display_ + " is " + human_bytes(file_bytes) + "; dtlab reads at most " + human_bytes(kMaxTraceTextBytes) +
                " of JSON per rank's trace: profile fewer steps (torch.profiler's schedule) and export again.");
  f_ = gzopen(path.c_str(), "rb");
  if (!f_) return;
  gzbuffer(f_, 1 << 17);
  gzip_ = !gzdirect(f_);
}

TraceFileBuf::~TraceFileBuf() {
  if (f_) gzclose(f_);
}

TraceFileBuf::int_type TraceFileBuf::underflow() {
  if (cancel_ && cancel_->load(std::memory_order_relaxed)) throw Error("cancelled");
  const int n = gzread(f_, buf_.data(), static_cast<unsigned>(buf_.size()));
  if (n <= 0) {
    int code = 0;
    const char* m = gzerror(f_, &code);
    if (n < 0) error_ = m ? m : "read error";
    else if (code != Z_OK && code != Z_STREAM_END && m) error_ = m;
    at_end_ = error_.empty();
    return traits_type::eof();
  }
  inflated_ += n;
  if (inflated_ > kMaxTraceTextBytes)
    throw Error(display_ + " holds more than " + human_bytes(kMaxTraceTextBytes) + " of JSON" + (gzip_ ? " once decompressed" : "") +
                "; dtlab reads at most that per rank's trace: profile fewer steps (torch.profiler's schedule) and export again.");
  // The ratio so far, not the whole file's: a bomb is refused after the floor, not after 250 times its size.
  const int64_t consumed = std::max<int64_t>(gzoffset(f_), 1);
  if (gzip_ && inflated_ > kTraceGzipRatioFloor && inflated_ > kMaxTraceGzipRatio * consumed)
    throw Error(display_ + " inflates to over " + std::to_string(kMaxTraceGzipRatio) + " times its gzip size (" + human_bytes(inflated_) +
                " from its first " + human_bytes(consumed) + "; a profiler's trace compresses about 12 times): it is a gzip bomb, not a trace.");
  if (on_read_) on_read_(gzoffset(f_));
  setg(buf_.data(), buf_.data(), buf_.data() + n);
  return traits_type::to_int_type(buf_[0]);
}

}  // namespace dtlab
