#include "engine/parallel/context_plan.h"

#include "engine/core/check.h"

namespace dtlab {

void check_context_parallel(const CpShape& s) {
  if (s.cp < 1) throw Error("--cp must be at least 1");
  if (s.cp == 1) return;
  const int64_t chunks = s.layout == CpLayout::Zigzag ? 2 * int64_t(s.cp) : s.cp;
  if (s.seq % chunks != 0)
    throw Error("sequence length " + std::to_string(s.seq) + " does not split into " + std::to_string(chunks) + " equal chunks for --cp " + std::to_string(s.cp) +
                (s.layout == CpLayout::Zigzag ? " with the zigzag layout (2·c chunks)" : "") + "; pick a multiple of " + std::to_string(chunks));
  if (s.layout != CpLayout::Ulysses) return;
  const int64_t split = int64_t(s.tp) * s.cp;
  if (s.heads % split != 0 || s.kv_heads % split != 0) {
    const int64_t h = s.heads % split != 0 ? s.heads : s.kv_heads;
    const std::string what = s.heads % split != 0 ? " heads" : " K/V heads";
    const std::string start = "Ulysses gives each of the --cp " + std::to_string(s.cp) + " ranks whole attention heads, but ";
    // A TP rank's heads are what the CP group divides: name them, and the --cp that would do.
    if (s.tp > 1 && h % s.tp == 0)
      throw Error(start + "the " + std::to_string(h / s.tp) + what + " of a TP rank (" + std::to_string(h) + " over tp " + std::to_string(s.tp) +
                  ") do not divide by " + std::to_string(s.cp) + "; pick a --cp that divides " + std::to_string(h / s.tp) +
                  " or use --cp-layout ring");
    throw Error(start + std::to_string(h) + what + (s.tp > 1 ? " over tp " + std::to_string(s.tp) : "") + " do not divide by " +
                std::to_string(split) + "; pick a --cp that divides the heads or use --cp-layout ring");
  }
}

CpTraffic cp_layer_traffic(const CpShape& s) {
  CpTraffic t;
  if (s.cp < 2) return t;
  const double c = s.cp, rows = double(s.micro_batch) * double(s.seq) / c;  // b·(s/c) tokens on this rank
  const double width = double(s.hidden) / s.tp, kv_width = width * s.kv_heads / s.heads;
  const std::string kv = s.kv_heads == s.heads ? "h" : "h_kv";
  const std::string per_tp = s.tp > 1 ? "/t" : "";
  if (s.layout == CpLayout::Ulysses) {
    // q and the output are h wide, k and v h_kv; each all-to-all keeps 1/c of a rank's buffer at home.
    t.forward = (c - 1) / c * rows * (2 * width + 2 * kv_width) * s.element_bytes;
    t.backward = t.forward;
    t.what = "all-to-alls forward (q, k, v to heads: one all-to-all in dtlab's engine, three in DeepSpeed's; the output back "
             "to the sequence), the same backward";
    t.formula = std::string(s.recompute ? "3" : "2") + "·(c-1)/c · b·(s/c)·(2h + 2" + kv + ")" + per_tp + " · e";
  } else {
    t.forward = 2 * (c - 1) * rows * kv_width * s.element_bytes;
    t.backward = 2 * t.forward;
    t.what = std::string(s.layout == CpLayout::Zigzag ? "zigzag chunks; " : "") +
             "K/V blocks around the ring c-1 times forward; backward passes K/V again and dK/dV back";
    t.formula = std::string(s.recompute ? "4" : "3") + "·2(c-1) · b·(s/c)·" + kv + per_tp + " · e";
  }
  if (s.recompute) t.recompute = t.forward;  // the formula's 4 (ring) or 3 (Ulysses) counts it
  return t;
}

double cp_causal_imbalance(CpLayout layout, int cp) {
  if (cp < 2 || layout != CpLayout::Ring) return 1;
  return 2.0 * cp / (cp + 1);
}

}  // namespace dtlab
