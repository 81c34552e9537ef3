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
  char layout[96];
  if (in.cp > 1) std::snprintf(layout, sizeof layout, "dp %d x tp %d x cp %d x pp %d", in.dp, in.tp, in.cp, in.pp);
  else std::snprintf(layout, sizeof layout, "dp %d x tp %d x pp %d", in.dp, in.tp, in.pp);
  char head[640];
  std::snprintf(head, sizeof head,
                "Sizing: %s parameters (L = %d, h = %lld, a = %d, s = %lld), global batch B = %lld sequences of b = %lld per "
                "micro-batch\nLayout: %s = %d GPUs on %s, %s, ZeRO-%d, %s%s, %s\n",
                param_count_str(in.params).c_str(), in.layers, static_cast<long long>(in.hidden), in.heads,
                static_cast<long long>(in.seq), static_cast<long long>(in.global_batch), static_cast<long long>(in.micro_batch),
                layout, p.world, in.profile.c_str(), plan_dtype_name(in.precision), in.zero,
                in.recompute ? "full recomputation" : "no recomputation",
                in.tp > 1 ? (in.sequence_parallel ? ", sequence parallel" : ", no sequence parallelism") : "",
                in.compute_seconds > 0 ? "compute time given" : ("MFU " + format_sizing_value(in.mfu, SizingUnit::Share) +
                                                                " of " + format_sizing_value(p.peak_flops, SizingUnit::Flops) + "/s per GPU").c_str());
  io.out << head;
  if (in.cp > 1)
    io.out << "Context parallel: c = " << in.cp << ", " << cp_layout_name(in.cp_layout) << " layout, " << in.seq / in.cp
           << " tokens per rank; parameters, gradients and optimizer states stay replicated over the CP group (ZeRO shards them "
              "over dp x cp), activations split by c\n";
  if (in.moe.experts > 0) {
    char moe[320];
    std::snprintf(moe, sizeof moe,
                  "Mixture of experts: E = %d experts (8·h² each) in %s, top-%d, capacity factor %g; ep %d: %d expert%s "
                  "per GPU, expert-data-parallel size d·c/ep = %d; %s of %s parameters active per token\n",
                  in.moe.experts, in.moe.moe_every > 1 ? ("one layer in every " + std::to_string(in.moe.moe_every)).c_str() : "every layer", in.moe.top_k,
                  in.moe.capacity_factor, in.moe.ep, in.moe.experts / in.moe.ep, in.moe.experts / in.moe.ep == 1 ? "" : "s", p.expert_dp, param_count_str(p.moe.active).c_str(),
                  param_count_str(p.moe.total).c_str());
    io.out << moe;
  }
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
            "d = dp, t = tp, p = pp" << (in.cp > 1 || in.moe.experts > 0 ? ", c = cp, e bytes per activation element" : "")
         << (in.moe.experts > 0 ? ", E experts, k top-k, F capacity factor, M = --moe-every, Ψ_n non-expert and Ψ_x expert parameters" : "")
         << "; bytes per GPU, FLOPs of all GPUs together\n";
  if (!p.fits)
    io.out << "Does not fit: " << format_sizing_value(p.total, SizingUnit::Bytes) << " per GPU, the GPU holds "
           << format_sizing_value(in.gpu_memory, SizingUnit::Bytes) << "\n";
}

}  // namespace dtlab::cli
