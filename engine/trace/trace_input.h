// The bytes of an imported trace, read as if the folder were hostile (trace_import.h reads through
// this): which files a trace directory holds, what keeps a path from being read (one sentence, never
// a filesystem exception), gzip inflated within a bound, names cut to a drawable length, and JSON's
// nesting checked against a bound. The lab (dtlab --open) and dtlab-cli trace summarize list the
// files and check the sidecar dtlab.json with the same functions.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <streambuf>
#include <string>
#include <vector>

struct gzFile_s;  // zlib's

namespace dtlab {

// Deeper than this, a JSON file is refused: a profiler's trace nests five levels (root, traceEvents,
// an event, its args, a value) and dtlab.json two; nlohmann's own walks (dump, compare) recurse, so
// a file 200,000 levels deep would otherwise end in a stack overflow.
constexpr int kMaxTraceJsonDepth = 256;
// Names (spans, collectives, threads, dtypes) are kept to this many bytes, cut on a UTF-8 boundary
// with "...": a longer name is a C++ template's expansion whose head says which kernel it is, and
// the lab measures every name it draws each frame.
constexpr size_t kMaxTraceNameBytes = 256;
// "Process Group Ranks" is parsed, not drawn: room for a list of 16,000 ranks.
constexpr size_t kMaxTraceRankListBytes = 128 << 10;
// The JSON of one rank's trace, plain or once decompressed: a profiler writes ~100 MB for a few
// steps of a large model; beyond 4 GiB the events alone would not fit in a desktop's memory.
constexpr int64_t kMaxTraceTextBytes = int64_t{4} << 30;
// A profiler's JSON gzips about 12 times smaller (the committed traces: 11 to 12); deflate's limit
// is ~1000, reached only by repeating a few bytes. Text inflated past this ratio to the compressed
// bytes read so far (once past the floor, so tiny odd files are not refused) is a gzip bomb, refused
// after reading the floor's worth, before it fills memory or minutes.
constexpr int64_t kMaxTraceGzipRatio = 250;
constexpr int64_t kTraceGzipRatioFloor = int64_t{16} << 20;

// A trace file's name: *.json or *.json.gz, but not the sidecar dtlab.json.
bool is_trace_file_name(const std::string& name);

// What keeps `path` from being read (a clause that follows the path: "does not exist; ...",
// "is a symbolic link loop ...", "is a FIFO (a named pipe), not a regular file; ..."), or "" for a
// regular file or a directory that can be reached.
std::string trace_path_problem(const std::string& path);

// The trace files `paths` name: each directory's trace files (is_trace_file_name), sorted, and files
// as given. Throws dtlab::Error with one sentence that starts with the path at fault.
std::vector<std::string> find_trace_files(const std::vector<std::string>& paths);

// `s` cut to at most `max` bytes on a UTF-8 boundary, ending in "..." when cut.
std::string bounded_name(const std::string& s, size_t max = kMaxTraceNameBytes);

// The sentence for a JSON file nested deeper than kMaxTraceJsonDepth.
std::string too_deep_sentence(const std::string& file);

// Checks the sidecar dtlab.json beside the traces (in the directory paths[0] names, or beside the
// file it names), where there is one: reachable, at most 1 MiB (it holds a few settings), and nested
// no deeper than kMaxTraceJsonDepth. Throws dtlab::Error with one sentence; read_trace_meta
// (engine/train/trace_compare.h) runs it before reading the file.
void check_trace_sidecar(const std::vector<std::string>& paths);

// A streambuf over zlib's gzread: gzip and plain files alike. Reports the compressed bytes read,
// throws dtlab::Error("cancelled") when `cancel` is set, and an Error naming `display` when the
// text passes kMaxTraceTextBytes or inflates past kMaxTraceGzipRatio.
class TraceFileBuf : public std::streambuf {
 public:
  TraceFileBuf(const std::string& path, const std::string& display, std::function<void(int64_t)> on_read,
               const std::atomic<bool>* cancel);
  ~TraceFileBuf() override;
  TraceFileBuf(const TraceFileBuf&) = delete;
  TraceFileBuf& operator=(const TraceFileBuf&) = delete;
  bool ok() const { return f_ != nullptr; }
  const std::string& error() const { return error_; }  // zlib's message, when reading failed
  int64_t end_bytes() const { return at_end_ ? inflated_ : -1; }  // the text's size once read to its end

 protected:
  int_type underflow() override;

 private:
  gzFile_s* f_ = nullptr;
  std::string display_;
  std::function<void(int64_t)> on_read_;
  const std::atomic<bool>* cancel_;
  std::vector<char> buf_;
  std::string error_;
  int64_t inflated_ = 0;
  bool gzip_ = false, at_end_ = false;
};

}  // namespace dtlab
