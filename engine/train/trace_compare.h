// An imported trace beside the same model run in dtlab: dtlab trains the model with DDP (threads
// backend, the trace's world size) for a few iterations under a hardware profile, and each imported
// all-reduce is put beside the one dtlab ran for the same bucket: modeled vs measured time. Where the
// trace records no sizes (the legacy format), dtlab's bucket sizes are the ones shown.
#pragma once
#include <string>
#include <vector>

#include "engine/trace/trace_import.h"

namespace dtlab {

struct TraceCompareOptions {
  std::string model;            // dtlab's spec of the traced model ("mlp:2,512,512,3")
  std::string profile = "this"; // hardware profile (cost_model.h): nvlink8, pcie8, ib2x4, eth2x4, this, ideal
  int64_t batch = 32;           // per rank
  double bucket_cap_mb = 25;    // torch's default
  // The first bucket's cap after the rebuild: torch's 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), or
  // the cap itself where the job gave bucket_cap_mb and its torch makes that the first bucket's too
  // (docs/course_sources.md section 2; dtlab.json's "first_bucket_mb" says which the job used).
  double first_bucket_mb = 1;
};

struct CompareRow {
  int collective = -1;          // index into ImportedTrace::collectives
  int iteration = -1, bucket = -1;
  std::string name;
  int64_t trace_bytes = -1;     // what the trace recorded (-1: nothing)
  int64_t dtlab_bytes = -1;     // the bucket dtlab built for the same model (-1: no such bucket)
  double measured_us = 0;       // the trace's busy time (end - last arrival)
  double modeled_us = -1;       // dtlab's cost model for that bucket's all-reduce on the profile
  double ratio = -1;            // measured / modeled
};

struct TraceComparison {
  std::string model, profile;
  int world = 0;
  std::vector<std::string> dtlab_buckets;  // "bucket 0: 4.weight, 4.bias, 2.bias, 2.weight (1.0 MiB)"
  std::vector<CompareRow> rows;            // the trace's all-reduces that fall in iterations
  bool sizes_agree = true;                 // every recorded size equals dtlab's bucket
  std::string summary;                     // one line: "measured/modeled median 3.2x over 6 all-reduces"
};

// What a trace directory's dtlab.json says about the traced job; every field is optional.
struct TraceMeta {
  std::string path;             // the dtlab.json read, or "" when there was none
  std::string model;            // "mlp:2,512,512,3"
  int64_t batch = 32;           // per rank
  int world = -1;
  double bucket_cap_mb = 25;    // torch's default
  double first_bucket_mb = 1;   // torch's first bucket after the rebuild (TraceCompareOptions)
};
// Reads dtlab.json in the directory of the traces (or beside its first file); a TraceMeta with an
// empty path when there is none. Throws dtlab::Error (one sentence) for a file that is not JSON
// or holds a field of the wrong type.
TraceMeta read_trace_meta(const std::vector<std::string>& paths);
// The options of a comparison for the job dtlab.json describes (its defaults where it says nothing).
TraceCompareOptions compare_options(const TraceMeta& meta);

// Throws dtlab::Error (one sentence) for a bad model or profile, or a trace without iterations.
TraceComparison compare_trace(const ImportedTrace& trace, const TraceCompareOptions& opt);

}  // namespace dtlab
