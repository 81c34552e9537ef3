#include "cli/plan_sizing.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/format.h"

namespace dtlab::cli {

namespace {

const char* unit_name(SizingUnit u) {
  switch (u) {
    case SizingUnit::Bytes: return "bytes";
    case SizingUnit::Seconds: return "seconds";
    case SizingUnit::Flops: return "FLOP";
    case SizingUnit::Share: return "share";
    case SizingUnit::Count: break;
  }
  return "count";
}

// Ψ and · are two bytes in UTF-8 but one column on screen.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string pad(const std::string& s, size_t w, bool right) {
  const std::string fill(w > columns(s) ? w - columns(s) : 0, ' ');
  return right ? fill + s : s + fill;
}

}  // namespace

void print_sizing(const SizingInput& in, const SizingPlan& p, bool json, Streams& io) {
  if (json) {
    nlohmann::json j = {{"spec", sizing_spec(in)}, {"world", p.world}, {"fits", p.fits}};
    j["figures"] = nlohmann::json::object();
    for (const SizingLine& l : p.lines)
      j["figures"][l.key] = {{"value", l.value}, {"unit", unit_name(l.unit)}, {"label", l.label}, {"formula", l.formula},
                             {"section", l.section}};
    io.out << nlohmann::json{{"sizing", j}}.dump() << "\n";
    return;
  }
  char head[512];
  std::snprintf(head, sizeof head,
                "Sizing: %s parameters (L = %d, h = %lld, a = %d, s = %lld), global batch B = %lld sequences of b = %lld per "
                "micro-batch\nLayout: dp %d x tp %d x pp %d = %d GPUs on %s, %s, ZeRO-%d, %s%s, %s\n",
                param_count_str(in.params).c_str(), in.layers, static_cast<long long>(in.hidden), in.heads,
                static_cast<long long>(in.seq), static_cast<long long>(in.global_batch), static_cast<long long>(in.micro_batch),
                in.dp, in.tp, in.pp, p.world, in.profile.c_str(), plan_dtype_name(in.precision), in.zero,
                in.recompute ? "full recomputation" : "no recomputation",
                in.tp > 1 ? (in.sequence_parallel ? ", sequence parallel" : ", no sequence parallelism") : "",
                in.compute_seconds > 0 ? "compute time given" : ("MFU " + format_sizing_value(in.mfu, SizingUnit::Share) +
                                                                " of " + format_sizing_value(p.peak_flops, SizingUnit::Flops) + "/s per GPU").c_str());
  io.out << head;
  size_t wl = 0, wv = 0;
  for (const SizingLine& l : p.lines) {
    wl = std::max(wl, columns(l.label));
    wv = std::max(wv, columns(format_sizing_value(l.value, l.unit)));
  }
  std::string section;
  for (const SizingLine& l : p.lines) {
    if (l.section != section) {
      section = l.section;
      io.out << "\n" << section << "\n";
    }
    io.out << "  " << pad(l.label, wl, false) << "  " << pad(format_sizing_value(l.value, l.unit), wv, true) << "  " << l.formula << "\n";
  }
  io.out << "\nN = Ψ parameters, B global batch, s sequence, b micro-batch, m micro-batches, L layers, h hidden, a heads, "
            "d = dp, t = tp, p = pp; bytes per GPU, FLOPs of all GPUs together\n";
  if (!p.fits)
    io.out << "Does not fit: " << format_sizing_value(p.total, SizingUnit::Bytes) << " per GPU, the GPU holds "
           << format_sizing_value(in.gpu_memory, SizingUnit::Bytes) << "\n";
}

}  // namespace dtlab::cli
