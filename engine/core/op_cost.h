// What one compute op costs: the FLOPs the modeled clock charges and the bytes the op must move at
// least once (each operand read and each result written, in float32). The pair is a span's place on
// the roofline (engine/trace/roofline.h): intensity = flops / bytes, achieved rate = flops / time.
// The formulas are the standard counts (docs/course_sources.md §6j): a Linear's GEMM is 2 B in out
// forward and twice that backward (input and weight gradients); element-wise ops are one per element.
#pragma once
#include <cstdint>

namespace dtlab {

struct OpCost {
  double flops = 0;
  double bytes = 0;
  OpCost() = default;
  OpCost(double f, double b = 0) : flops(f), bytes(b) {}  // implicit: a bare FLOP count is a cost with no bytes
  OpCost operator+(const OpCost& o) const { return {flops + o.flops, bytes + o.bytes}; }
  OpCost operator-(const OpCost& o) const { return {flops - o.flops, bytes - o.bytes}; }
  OpCost operator*(double k) const { return {flops * k, bytes * k}; }
};
inline OpCost operator*(double k, const OpCost& c) { return c * k; }

constexpr double kCostElemBytes = 4;  // float32: the kernels compute in it (16-bit runs widen first)

// y (B, out) = x (B, in) W^T (out, in) + b (out): the GEMM and the bias add.
inline OpCost linear_forward_cost(int64_t B, int64_t in, int64_t out) {
  const double b = static_cast<double>(B), i = static_cast<double>(in), o = static_cast<double>(out);
  return {2 * b * i * o + b * o, kCostElemBytes * (b * i + i * o + o + b * o)};
}
// dW += dy^T x and db += sum dy (read-modify-write), and with `input_grad` dx = dy W.
inline OpCost linear_backward_cost(int64_t B, int64_t in, int64_t out, bool input_grad) {
  const double b = static_cast<double>(B), i = static_cast<double>(in), o = static_cast<double>(out);
  OpCost weight{2 * b * i * o + b * o, kCostElemBytes * (b * o + b * i + 2 * i * o + 2 * o)};
  if (!input_grad) return weight;
  return weight + OpCost{2 * b * i * o, kCostElemBytes * (i * o + b * i)};  // dy is read once for both
}
// out = max(x, 0) over n elements; backward reads dout and out, writes dinp.
inline OpCost relu_forward_cost(int64_t n) { return {static_cast<double>(n), kCostElemBytes * 2 * static_cast<double>(n)}; }
inline OpCost relu_backward_cost(int64_t n) { return {static_cast<double>(n), kCostElemBytes * 3 * static_cast<double>(n)}; }
// Softmax cross-entropy over (rows, C) logits: forward reads logits, writes probs (5 FLOPs an element:
// max, subtract, exp, sum, divide); backward reads probs, writes dlogits.
inline OpCost cross_entropy_forward_cost(int64_t rows, int64_t C) {
  const double n = static_cast<double>(rows) * static_cast<double>(C);
  return {5 * n, kCostElemBytes * 2 * n};
}
inline OpCost cross_entropy_backward_cost(int64_t rows, int64_t C) {
  const double n = static_cast<double>(rows) * static_cast<double>(C);
  return {2 * n, kCostElemBytes * 2 * n};
}
// AdamW over n parameters: reads parameter, gradient and both moments, writes parameter and moments
// (about 10 FLOPs a parameter, what the modeled clock has always charged).
inline OpCost optimizer_step_cost(int64_t n) {
  const double p = static_cast<double>(n);
  return {10 * p, kCostElemBytes * 7 * p};
}
// zero_grad writes every gradient once.
inline OpCost zero_grad_cost(int64_t n) { return {0, kCostElemBytes * static_cast<double>(n)}; }

}  // namespace dtlab
