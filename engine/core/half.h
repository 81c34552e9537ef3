// 16-bit floating point: bfloat16 and IEEE binary16 (fp16) as bit patterns, and the conversions mixed
// precision training needs. float -> 16 bits rounds to nearest, ties to even, exactly as torch's
// Tensor.to(torch.bfloat16 / torch.float16) does on the CPU (tests/test_half.cpp checks values torch
// computed): overflow goes to infinity (fp16 above 65504 rounds to inf from 65520 on), fp16 keeps
// subnormals (down to 2^-24), and a NaN becomes torch's NaN pattern (bf16: 0xFFFF, the vectorized
// conversion's; fp16: 0x7E00 with the sign). 16 bits -> float is exact. Sources: docs/course_sources.md §6e.
#pragma once
#include <cstdint>
#include <cstring>

// The element conversions below compile for the host and, in engine/cuda's kernels, for the device:
// one definition of every rounding, so a GPU's 16-bit tensors hold the CPU's bits.
#if defined(__CUDACC__)
#define DTLAB_HD __host__ __device__
#else
#define DTLAB_HD
#endif

namespace dtlab {

enum class HalfFormat : uint8_t { BF16, FP16 };

// --precision: what a run trains in. FP32 is every tensor float32; BF16/FP16 are mixed precision
// (16-bit parameters, activations and gradients; fp32 master weights and optimizer state).
enum class Precision : uint8_t { FP32, BF16, FP16 };
inline bool is_mixed(Precision p) { return p != Precision::FP32; }
inline HalfFormat half_format_of(Precision p) { return p == Precision::FP16 ? HalfFormat::FP16 : HalfFormat::BF16; }
const char* precision_name(Precision p);  // "fp32", "bf16", "fp16"
// "fp32" | "bf16" | "fp16"; dtlab::Error with the choices otherwise.
Precision parse_precision(const char* text);

// 16-bit elements as collectives move them (engine/comm): distinct types so a reduction knows the
// format; the sum of two is the float sum rounded once, as NCCL's bf16/fp16 reductions do per step.
struct Bf16Bits {
  uint16_t bits;
};
struct Fp16Bits {
  uint16_t bits;
};

DTLAB_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
DTLAB_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

DTLAB_HD inline uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFF;  // NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
DTLAB_HD inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

DTLAB_HD inline uint16_t fp16_from_float(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;   // NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above (and inf): infinity
  if (a >= 0x38800000u) {                       // a normal half (2^-14 and above)
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);  // ties to even on the 13 dropped bits
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));  // exponent bias 127 -> 15
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  // A subnormal half: k units of 2^-24, k = m * 2^(e - 126) rounded to nearest even.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, s = 126 - e;
  uint32_t k = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u), half = 1u << (s - 1);
  if (rem > half || (rem == half && (k & 1u))) k++;
  return static_cast<uint16_t>(sign | k);  // k = 0x400 is the smallest normal, as it should be
}
DTLAB_HD inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13));  // inf, NaN
  if (e != 0) return bits_float(sign | ((e + 112u) << 23) | (m << 13));
  // zero or subnormal: m * 2^-24, exact in float
  return bits_float(sign | float_bits(static_cast<float>(m) * 5.9604644775390625e-8f));
}

DTLAB_HD inline uint16_t half_from_float(float f, HalfFormat fmt) {
  return fmt == HalfFormat::BF16 ? bf16_from_float(f) : fp16_from_float(f);
}
DTLAB_HD inline float half_to_float(uint16_t h, HalfFormat fmt) {
  return fmt == HalfFormat::BF16 ? bf16_to_float(h) : fp16_to_float(h);
}
// The float nearest a value that 16 bits can hold: what storing `f` in the format keeps.
DTLAB_HD inline float round_to_half(float f, HalfFormat fmt) { return half_to_float(half_from_float(f, fmt), fmt); }
DTLAB_HD inline bool half_is_finite(uint16_t h, HalfFormat fmt) {
  return fmt == HalfFormat::BF16 ? (h & 0x7F80u) != 0x7F80u : (h & 0x7C00u) != 0x7C00u;
}

// Arrays (host memory).
void half_from_floats(uint16_t* dst, const float* src, int64_t n, HalfFormat fmt);
void half_to_floats(float* dst, const uint16_t* src, int64_t n, HalfFormat fmt);
bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat fmt);

const char* half_format_name(HalfFormat fmt);  // "bf16", "fp16"

}  // namespace dtlab
