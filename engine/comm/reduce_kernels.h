// The element-wise pieces of the collective algorithms (chunk bounds, reduce, average, copy), shared
// by every backend: a collective adds the same numbers in the same order whichever backend moves
// them, so a multi-process socket run equals the in-process threads run bit for bit.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/comm/communicator.h"

namespace dtlab {

inline int ring_mod(int a, int n) { return ((a % n) + n) % n; }

inline int ceil_log2(int n) {
  int l = 0;
  while ((1 << l) < n) l++;
  return l;
}

// Chunk c of an all-reduce buffer: sizes differ by at most one element, empty when count < n.
inline int64_t chunk_begin(int64_t count, int n, int c) { return count * c / n; }

template <class T>
void reduce_into(T* dst, const T* src, int64_t len, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < len; i++) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (int64_t i = 0; i < len; i++) dst[i] += src[i];
  }
}

template <class T>
void reduce_to(T* dst, const T* a, const T* b, int64_t len, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < len; i++) dst[i] = std::max(a[i], b[i]);
  } else {
    for (int64_t i = 0; i < len; i++) dst[i] = a[i] + b[i];
  }
}

// Avg is a sum followed by this, on the rank that holds the final value.
template <class T>
void finish_avg(T* buf, int64_t len, ReduceOp op, int n) {
  if constexpr (std::is_same_v<T, float>) {
    if (op != ReduceOp::Avg || n == 1) return;
    const float inv = 1.0f / static_cast<float>(n);
    for (int64_t i = 0; i < len; i++) buf[i] *= inv;
  }
}

template <class T>
void copy_elems(T* dst, const T* src, int64_t len) {
  if (len > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(len) * sizeof(T));
}

}  // namespace dtlab
