// Feeds the bytes, as one flag value, to the small spec parsers behind dtlab's flags:
// ModelSpec::parse (--model), make_dataset (--data; synthetic specs only, see below), parse_fault
// (--fault), parse_action (schedule cells) and parse_monitor_address (--attach). Finding: anything
// but dtlab::Error, a model spec that does not round-trip through str(), or a data set whose sizes
// break the Dataset contract.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <string_view>

#include "engine/comm/threads_backend.h"
#include "engine/core/model.h"
#include "engine/data/dataset.h"
#include "engine/monitor/monitor.h"
#include "engine/parallel/pipeline_schedule.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

namespace {

// The values a synthetic data spec generates (classes x points x dim), with make_dataset's defaults
// for what it leaves out; an unreadable value counts as 1 (the parser refuses it anyway).
int64_t synthetic_values(std::string_view spec) {
  const size_t colon = spec.find(':');
  const bool spiral = spec.substr(0, colon).find("spiral") != std::string_view::npos;
  int64_t classes = 3, points = spiral ? 1000 : 500, dim = 2;
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  for (std::string_view rest = colon == std::string_view::npos ? "" : spec.substr(colon + 1); !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    int64_t v = 1;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size() || v < 1) v = 1;
    if (key == "classes") classes = v;
    else if (key == "points") points = v;
    else if (key == "dim" && !spiral) dim = v;
  }
  int64_t n = 0;
  if (__builtin_mul_overflow(classes, points, &n) || __builtin_mul_overflow(n, dim, &n)) return INT64_MAX;
  return n;
}

bool is_npz_path(std::string_view s) {
  if (s.size() < 4) return false;
  std::string tail(s.substr(s.size() - 4));
  for (char& c : tail) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return tail == ".npz";
}

// make_dataset's own limit (2^28 values) is a GiB of floats: beyond a fuzzer's time and memory.
// Specs that it would accept above this size are skipped; larger ones are still fed (refused before
// anything is allocated).
constexpr int64_t kMaxFuzzValues = int64_t{1} << 18, kEngineMaxValues = int64_t{1} << 28;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  ModelSpec spec;
  if (fuzz::accepts([&] { spec = ModelSpec::parse(text); })) {
    fuzz::require((spec.is_gpt() ? spec.gpt.layers >= 1 && spec.gpt.embd % spec.gpt.heads == 0 : spec.dims.size() >= 2) &&
                      spec.num_params() <= kMaxModelParams,
                  "an accepted model spec is too small or too large");
    fuzz::require(ModelSpec::parse(spec.str()).str() == spec.str(), "a model spec does not round-trip through str()");
  }

  // A path (anything ending in .npz, or text[:PATH]) would open a file: the npz fuzzer and the hostile
  // corpus's text cases cover those.
  const int64_t values = synthetic_values(text);
  const bool reads_text = text == "text" || text.rfind("text:", 0) == 0;
  if (!is_npz_path(text) && !reads_text && (values <= kMaxFuzzValues || values > kEngineMaxValues)) {
    Dataset ds;
    if (fuzz::accepts([&] { ds = make_dataset(text, 2, 3); })) {
      fuzz::require(ds.n > 0 && ds.d > 0 && ds.x.size() == static_cast<size_t>(ds.n * ds.d) && ds.y.size() == static_cast<size_t>(ds.n),
                    "a synthetic data set's sizes do not add up");
      fuzz::require(std::all_of(ds.y.begin(), ds.y.end(), [&](int64_t y) { return y >= 0 && y < ds.num_classes; }),
                    "a synthetic label outside [0, num_classes)");
    }
  }

  fuzz::accepts([&] { parse_fault(text); });
  fuzz::accepts([&] { parse_action(text); });
  std::string host;
  int port = 0;
  if (fuzz::accepts([&] { parse_monitor_address(text, host, port); }))
    fuzz::require(!host.empty() && port >= 1 && port <= 65535, "an accepted monitor address without a host or port");
  return 0;
}
