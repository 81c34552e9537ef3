#include "engine/data/dataset.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <numbers>
#include <random>
#include <string_view>
#include <utility>

#include "engine/core/check.h"
#include "engine/data/npz.h"

namespace dtlab {
namespace {

constexpr int64_t kDefaultSpiralPoints = 1000;
constexpr float kDefaultSpiralNoise = 0.1f;
constexpr int64_t kDefaultBlobPoints = 500;
constexpr float kDefaultBlobSpread = 1.0f;
constexpr double kBlobCenterScale = 4.0;
constexpr int64_t kMaxElements = int64_t{1} << 28;  // 1 GiB of floats: far beyond a teaching set

// std::normal_distribution is implementation-defined, so draws are converted by hand: a seed then
// gives the same dataset with libstdc++, libc++ and MSVC.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                           // Box-Muller
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    const double rad = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    spare_ = rad * std::sin(theta);
    has_spare_ = true;
    return rad * std::cos(theta);
  }

 private:
  std::mt19937_64 g_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

std::string format_float(float v) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

bool ends_with_npz(const std::string& s) {
  if (s.size() < 4) return false;
  std::string tail = s.substr(s.size() - 4);
  for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == ".npz";
}

void check_size(const std::string& what, int64_t classes, int64_t points, int64_t dim) {
  if (classes > kMaxElements / points || classes * points > kMaxElements / dim)
    throw Error(what + " would hold " + std::to_string(classes) + " x " + std::to_string(points) +
                " points of dimension " + std::to_string(dim) + ", more than dtlab's limit of " +
                std::to_string(kMaxElements) + " values; use fewer points or classes.");
}

// Key=value options of a synthetic spec; each value is read once by the typed getters below.
struct SpecOptions {
  std::string spec, kind, valid;  // valid: "classes, points, noise, seed"
  std::vector<std::pair<std::string, std::string>> kv;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("data spec '" + spec + "': " + what + "; valid keys for " + kind + " are " + valid + ".");
  }
  const std::string* find(const char* key) const {
    for (auto& [k, v] : kv)
      if (k == key) return &v;
    return nullptr;
  }
  // The value of `key` parsed as T, `fallback` when absent; fail(...) unless it parses whole and
  // passes `ok`.
  template <class T, class Ok>
  T get(const char* key, T fallback, Ok ok, const char* expected) const {
    const std::string* v = find(key);
    if (!v) return fallback;
    T out{};
    auto res = std::from_chars(v->data(), v->data() + v->size(), out);
    if (res.ec != std::errc() || res.ptr != v->data() + v->size() || !ok(out))
      fail(std::string(key) + " must be " + expected + ", got '" + *v + "'");
    return out;
  }
  int64_t get_int(const char* key, int64_t fallback) const {
    return get(key, fallback, [](int64_t v) { return v >= 1; }, "a positive integer");
  }
  uint64_t get_seed(uint64_t fallback) const {
    return get("seed", fallback, [](uint64_t) { return true; }, "a non-negative integer");
  }
  float get_float(const char* key, float fallback) const {
    return get(key, fallback, [](float v) { return std::isfinite(v) && v >= 0; }, "a number >= 0");
  }
};

SpecOptions parse_options(const std::string& spec, std::string_view kind, std::string_view rest,
                          std::initializer_list<const char*> keys) {
  SpecOptions o;
  o.spec = spec;
  o.kind = std::string(kind);
  for (const char* k : keys) o.valid += (o.valid.empty() ? "" : ", ") + std::string(k);
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) o.fail("'" + std::string(item) + "' is not key=value");
    std::string key(trim(item.substr(0, eq))), value(trim(item.substr(eq + 1)));
    bool known = false;
    for (const char* k : keys) known = known || key == k;
    if (!known) o.fail("unknown key '" + key + "'");
    if (o.find(key.c_str())) o.fail("key '" + key + "' is given twice");
    if (value.empty()) o.fail("key '" + key + "' has no value");
    o.kv.emplace_back(std::move(key), std::move(value));
  }
  return o;
}

}  // namespace

Dataset make_spiral(int64_t classes, int64_t points_per_class, float noise, uint64_t seed) {
  if (classes < 1 || points_per_class < 1 || !(noise >= 0) || !std::isfinite(noise))
    throw Error("spiral needs classes >= 1, points >= 1 and noise >= 0.");
  check_size("spiral", classes, points_per_class, 2);
  Dataset ds;
  ds.name = "spiral:classes=" + std::to_string(classes) + ",points=" + std::to_string(points_per_class) +
            ",noise=" + format_float(noise) + ",seed=" + std::to_string(seed);
  ds.n = classes * points_per_class;
  ds.d = 2;
  ds.num_classes = classes;
  ds.x.resize(static_cast<size_t>(ds.n * 2));
  ds.y.resize(static_cast<size_t>(ds.n));
  Rng rng(seed);
  const double span = points_per_class > 1 ? static_cast<double>(points_per_class - 1) : 1.0;
  for (int64_t j = 0; j < classes; ++j) {
    for (int64_t i = 0; i < points_per_class; ++i) {
      const size_t k = static_cast<size_t>(j * points_per_class + i);
      const double r = static_cast<double>(i) / span;
      const double t = 4.0 * static_cast<double>(j) + 4.0 * static_cast<double>(i) / span +
                       static_cast<double>(noise) * rng.normal();
      ds.x[2 * k] = static_cast<float>(r * std::sin(t));
      ds.x[2 * k + 1] = static_cast<float>(r * std::cos(t));
      ds.y[k] = j;
    }
  }
  return ds;
}

Dataset make_blobs(int64_t dim, int64_t classes, int64_t points_per_class, float spread, uint64_t seed) {
  if (dim < 1 || classes < 1 || points_per_class < 1 || !(spread >= 0) || !std::isfinite(spread))
    throw Error("blobs needs dim >= 1, classes >= 1, points >= 1 and spread >= 0.");
  check_size("blobs", classes, points_per_class, dim);
  Dataset ds;
  ds.name = "blobs:dim=" + std::to_string(dim) + ",classes=" + std::to_string(classes) +
            ",points=" + std::to_string(points_per_class) + ",spread=" + format_float(spread) +
            ",seed=" + std::to_string(seed);
  ds.n = classes * points_per_class;
  ds.d = dim;
  ds.num_classes = classes;
  ds.x.resize(static_cast<size_t>(ds.n * dim));
  ds.y.resize(static_cast<size_t>(ds.n));
  Rng rng(seed);
  std::vector<double> centers(static_cast<size_t>(classes * dim));  // (classes, dim)
  for (double& c : centers) c = kBlobCenterScale * (2.0 * rng.uniform() - 1.0);
  for (int64_t j = 0; j < classes; ++j) {
    for (int64_t i = 0; i < points_per_class; ++i) {
      const size_t k = static_cast<size_t>(j * points_per_class + i);
      for (int64_t c = 0; c < dim; ++c)
        ds.x[k * static_cast<size_t>(dim) + static_cast<size_t>(c)] = static_cast<float>(
            centers[static_cast<size_t>(j * dim + c)] + static_cast<double>(spread) * rng.normal());
      ds.y[k] = j;
    }
  }
  return ds;
}

Dataset make_dataset(const std::string& spec, int64_t default_dim, int64_t default_classes) {
  // text:PATH is a text file whatever its name ends with.
  if (spec == "text" || spec.starts_with("text:")) return make_text_dataset(spec, default_dim > 0 ? default_dim : 64);
  if (ends_with_npz(spec)) return load_npz(spec, default_dim);
  const int64_t dim = default_dim > 0 ? default_dim : 2;
  const int64_t classes = default_classes > 0 ? default_classes : 3;
  const size_t colon = spec.find(':');
  const std::string_view kind = trim(std::string_view(spec).substr(0, colon));
  const std::string_view rest =
      colon == std::string::npos ? std::string_view() : std::string_view(spec).substr(colon + 1);
  if (kind == "spiral") {
    SpecOptions o = parse_options(spec, kind, rest, {"classes", "points", "noise", "seed"});
    return make_spiral(o.get_int("classes", classes), o.get_int("points", kDefaultSpiralPoints),
                       o.get_float("noise", kDefaultSpiralNoise), o.get_seed(0));
  }
  if (kind == "blobs") {
    SpecOptions o = parse_options(spec, kind, rest, {"dim", "classes", "points", "spread", "seed"});
    return make_blobs(o.get_int("dim", dim), o.get_int("classes", classes),
                      o.get_int("points", kDefaultBlobPoints), o.get_float("spread", kDefaultBlobSpread),
                      o.get_seed(0));
  }
  throw Error("unknown data spec '" + spec +
              "'; use spiral, blobs (optionally with :key=value,... e.g. blobs:dim=8,classes=4), text[:PATH] "
              "(for a --model gpt) or a path to a .npz file.");
}

}  // namespace dtlab
