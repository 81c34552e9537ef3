// Elementwise float functions in plain arithmetic that GCC vectorizes (a libm call per element does
// not vectorize: expf and erff took a third of gpt-tiny's step), for the GPT's GELU and softmax.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace dtlab {

// exp(x) for float x in plain arithmetic the compiler vectorizes (libm's expf is a call per
// element: with erff below it took a third of gpt-tiny's step). Cephes' expf: x = n ln2 + r with
// |r| <= ln2 / 2, a degree-6 polynomial in r, and 2^n put into the exponent bits; within about one
// ulp of expf, as Sleef's expf_u10 (what torch's vectorized CPU kernels call) is. x is clamped to
// [-87.3, 88.3], where 2^n stays a normal float (the GPT only takes exp of x <= 0); NaN gives NaN.
inline float exp_vec(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  // round(x / ln 2); nearbyint, not floor(+0.5), whose conversion to int GCC 12 fuses into an
  // lfloor it cannot vectorize.
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;                               // ln 2 in two parts (Cephes C1, C2)
  r = r + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  // 2^n from its exponent bits (std::bit_cast: GCC 12 vectorizes it, not a memcpy). A NaN x stays NaN
  // through y; it must not reach the conversion to int (undefined behaviour).
  const float whole = n == n ? n : 0.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(whole) + 127) << 23);
}

// erf(x) as torch's vectorized CPU kernels compute it (Vectorized<float>::erf in ATen's cpu/vec;
// docs/course_sources.md §6g): Abramowitz and Stegun 7.1.26, erf|x| = 1 - t (a1 + a2 t + ... + a5 t^4)
// exp(-x^2) with t = 1 / (1 + p|x|), absolute error at most 1.5e-7, the sign put back.
inline float erf_vec(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (0.3275911f * ax + 1.0f);
  float r = 1.061405429f;
  r = r * t - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  return std::copysign(1.0f - r * t * exp_vec(-ax * ax), x);
}

}  // namespace dtlab
