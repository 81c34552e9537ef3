#include "engine/core/half.h"

#include <string>

#include "engine/core/check.h"

namespace dtlab {

void half_from_floats(uint16_t* dst, const float* src, int64_t n, HalfFormat fmt) {
  if (fmt == HalfFormat::BF16) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_from_float(src[i]);
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_from_float(src[i]);
  }
}

void half_to_floats(float* dst, const uint16_t* src, int64_t n, HalfFormat fmt) {
  if (fmt == HalfFormat::BF16) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_float(src[i]);
  }
}

bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat fmt) {
  const uint16_t mask = fmt == HalfFormat::BF16 ? 0x7F80u : 0x7C00u;
  uint16_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= static_cast<uint16_t>((x[i] & mask) == mask);
  return bad == 0;
}

const char* half_format_name(HalfFormat fmt) { return fmt == HalfFormat::BF16 ? "bf16" : "fp16"; }

const char* precision_name(Precision p) {
  return p == Precision::FP32 ? "fp32" : p == Precision::BF16 ? "bf16" : "fp16";
}

Precision parse_precision(const char* text) {
  const std::string t = text;
  if (t == "fp32") return Precision::FP32;
  if (t == "bf16") return Precision::BF16;
  if (t == "fp16") return Precision::FP16;
  throw Error("precision '" + t + "' is not known; use fp32, bf16 or fp16");
}

}  // namespace dtlab
