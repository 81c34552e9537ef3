// Gradient checks: every layer kernel and the loss against central finite differences of a
// double-precision reference, plus the whole model's backward against the same.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.h"
#include "engine/core/model.h"
#include "engine/core/ops.h"

using namespace dtlab;

namespace {

using Vec = std::vector<double>;

using test::random_floats;

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// Double references (plain loops).
Vec linear_ref(const Vec& x, const Vec& w, const Vec& b, int64_t B, int64_t C, int64_t OC) {
  Vec out(B * OC);
  for (int64_t i = 0; i < B; i++)
    for (int64_t o = 0; o < OC; o++) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t c = 0; c < C; c++) s += x[i * C + c] * w[o * C + c];
      out[i * OC + o] = s;
    }
  return out;
}

double ce_ref(const Vec& z, const std::vector<int64_t>& y, int64_t B, int64_t C) {
  double total = 0;
  for (int64_t i = 0; i < B; i++) {
    double m = z[i * C];
    for (int64_t c = 1; c < C; c++) m = std::max(m, z[i * C + c]);
    double s = 0;
    for (int64_t c = 0; c < C; c++) s += std::exp(z[i * C + c] - m);
    total += std::log(s) + m - z[i * C + y[i]];
  }
  return total / B;
}

double dot(const Vec& a, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * r[i];
  return s;
}

// Numerical d f / d v[i] for every i, central differences in double.
template <class F>
Vec numeric_grad(Vec& v, F f, double h = 1e-6) {
  Vec g(v.size());
  for (size_t i = 0; i < v.size(); i++) {
    double keep = v[i];
    v[i] = keep + h;
    double fp = f();
    v[i] = keep - h;
    double fm = f();
    v[i] = keep;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

// Max |a-b| / max(1, |b|); printed like llm.c's checkers.
double max_rel_diff(const float* a, const Vec& b, const char* what) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); i++)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(b[i])));
  char num[32];
  std::snprintf(num, sizeof num, "%.3g", worst);
  std::string msg = std::string(what) + ": max difference " + num;
  MESSAGE(msg);
  return worst;
}

}  // namespace

TEST_SUITE("ops") {

TEST_CASE("linear forward and backward match finite differences") {
  const int64_t B = 5, C = 7, OC = 4;
  auto x = random_floats(B * C, 1), w = random_floats(OC * C, 2), b = random_floats(OC, 3);
  auto r = random_floats(B * OC, 4);  // objective: sum(out * r), so dout = r
  std::vector<float> out(B * OC), dx(B * C), dw(OC * C, 0.25f), db(OC, -0.5f);
  linear_forward(out.data(), x.data(), w.data(), b.data(), B, C, OC);
  Vec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  CHECK(max_rel_diff(out.data(), linear_ref(xd, wd, bd, B, C, OC), "linear forward") < 1e-5);

  linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), B, C, OC);
  auto f = [&] { return dot(linear_ref(xd, wd, bd, B, C, OC), r); };
  Vec gx = numeric_grad(xd, f), gw = numeric_grad(wd, f), gb = numeric_grad(bd, f);
  for (auto& g : gw) g += 0.25;  // parameter gradients accumulate into what was there
  for (auto& g : gb) g += -0.5;
  CHECK(max_rel_diff(dx.data(), gx, "linear d input") < 1e-4);
  CHECK(max_rel_diff(dw.data(), gw, "linear d weight") < 1e-4);
  CHECK(max_rel_diff(db.data(), gb, "linear d bias") < 1e-4);

  // Without bias the output is the bare product.
  linear_forward(out.data(), x.data(), w.data(), nullptr, B, C, OC);
  CHECK(max_rel_diff(out.data(), linear_ref(xd, wd, {}, B, C, OC), "linear forward, no bias") < 1e-5);
}

TEST_CASE("relu propagates NaN and keeps -0.0, as torch.relu and its threshold_backward do") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-0.0f, nan, -1.0f, 2.0f}, dout = {1, 2, 3, 4};
  std::vector<float> out(4), dx(4);
  relu_forward(out.data(), x.data(), 4);
  CHECK(out[0] == 0.0f);
  CHECK(std::signbit(out[0]));  // torch.relu(tensor(-0.)) is -0.
  CHECK(std::isnan(out[1]));
  CHECK(out[2] == 0.0f);
  CHECK(out[3] == 2.0f);
  relu_backward(dx.data(), dout.data(), out.data(), 4);
  CHECK(dx == std::vector<float>{0, 2, 0, 4});  // out <= 0 ? 0 : grad: NaN is not <= 0
}

TEST_CASE("relu forward and backward match finite differences") {
  const int64_t N = 64;
  auto x = random_floats(N, 5), r = random_floats(N, 6);
  for (auto& v : x)
    if (std::fabs(v) < 1e-3f) v = 0.5f;  // stay away from the kink
  std::vector<float> out(N), dx(N);
  relu_forward(out.data(), x.data(), N);
  relu_backward(dx.data(), r.data(), out.data(), N);
  Vec xd = to_double(x);
  auto f = [&] {
    double s = 0;
    for (int64_t i = 0; i < N; i++) s += std::max(xd[i], 0.0) * r[i];
    return s;
  };
  Vec g = numeric_grad(xd, f);
  CHECK(max_rel_diff(dx.data(), g, "relu d input") < 1e-6);
  for (int64_t i = 0; i < N; i++) CHECK(out[i] == std::max(x[i], 0.0f));
}

TEST_CASE("softmax cross-entropy (mean) matches finite differences") {
  const int64_t B = 6, C = 5;
  auto z = random_floats(B * C, 7, 3.0f);
  std::vector<int64_t> y = {0, 4, 2, 2, 1, 3};
  std::vector<float> probs(B * C), dz(B * C);
  float loss = cross_entropy_forward(probs.data(), z.data(), y.data(), B, C);
  Vec zd = to_double(z);
  CHECK(loss == doctest::Approx(ce_ref(zd, y, B, C)).epsilon(1e-6));
  cross_entropy_backward(dz.data(), probs.data(), y.data(), B, C, 1.0f / B);
  Vec g = numeric_grad(zd, [&] { return ce_ref(zd, y, B, C); });
  CHECK(max_rel_diff(dz.data(), g, "cross-entropy d logits") < 1e-5);

  // Large logits do not overflow (log-sum-exp with the max subtracted).
  std::vector<float> big = {1000.f, 0.f, -1000.f};
  std::vector<int64_t> t = {0};
  CHECK(cross_entropy_forward(probs.data(), big.data(), t.data(), 1, 3) == doctest::Approx(0.0));
  t[0] = 2;
  CHECK(cross_entropy_forward(probs.data(), big.data(), t.data(), 1, 3) == doctest::Approx(2000.0));
}

TEST_CASE("count_correct breaks ties toward the lower class, like torch.argmax") {
  std::vector<float> z = {1, 3, 3, 0, 5, 2, 7, 7, 7};
  std::vector<int64_t> y = {1, 1, 2};  // rows 0 and 2 tie; only the lowest index counts
  CHECK(count_correct(z.data(), y.data(), 3, 3) == 2);
}

TEST_CASE("whole-model backward matches finite differences of a double reference") {
  const int64_t B = 4;
  Model m(ModelSpec::parse("mlp:3,6,5,4"), nullptr, 11);
  auto x = random_floats(B * 3, 8);
  std::vector<int64_t> y = {3, 0, 1, 3};
  std::vector<float> probs(B * 4), dz(B * 4);
  const float* logits = m.forward(x.data(), B);
  cross_entropy_forward(probs.data(), logits, y.data(), B, 4);
  cross_entropy_backward(dz.data(), probs.data(), y.data(), B, 4, 1.0f / B);
  m.zero_grad();
  std::vector<int> ready;
  m.backward(dz.data(), [&](int p) { ready.push_back(p); });
  CHECK(ready == std::vector<int>{5, 4, 3, 2, 1, 0});  // last layer first, bias before weight (torch)

  Vec theta(m.params(), m.params() + m.num_params());
  Vec xd = to_double(x);
  auto loss = [&] {
    Vec h = xd;
    int64_t in = 3;
    const auto& ps = m.parameters();
    for (int l = 0; l < m.num_layers(); l++) {
      const Layer& L = m.layer(l);
      if (L.kind == LayerKind::ReLU) {
        for (auto& v : h) v = std::max(v, 0.0);
        continue;
      }
      Vec w(theta.begin() + ps[L.weight].offset, theta.begin() + ps[L.weight].offset + ps[L.weight].numel);
      Vec b(theta.begin() + ps[L.bias].offset, theta.begin() + ps[L.bias].offset + ps[L.bias].numel);
      h = linear_ref(h, w, b, B, in, L.out_features);
      in = L.out_features;
    }
    return ce_ref(h, y, B, 4);
  };
  Vec g = numeric_grad(theta, loss);
  CHECK(max_rel_diff(m.grads(), g, "mlp:3,6,5,4 parameter gradients") < 1e-4);
}

}  // TEST_SUITE
