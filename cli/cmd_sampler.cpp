// dtlab-cli sampler: what each rank of torch.utils.data.DistributedSampler would read.
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/core/check.h"
#include "engine/data/sampler.h"

namespace dtlab::cli {

namespace {

struct SamplerArgs {
  int64_t n = 0;
  int world = 1;
  int rank = -1;  // all ranks
  int64_t epoch = 0;
  uint64_t seed = 0;
  bool shuffle = false;
  bool drop_last = false;
  bool json = false;
};

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); i++) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

int run_sampler(const SamplerArgs& a, Streams& io) {
  if (a.rank >= a.world)
    throw Error("--rank " + std::to_string(a.rank) + " is out of range for --world " +
                std::to_string(a.world) + "; ranks are 0.." + std::to_string(a.world - 1));
  std::vector<std::vector<int64_t>> per_rank;
  int64_t num_samples = 0, total = 0;
  for (int r = 0; r < a.world; r++) {
    if (a.rank >= 0 && r != a.rank) continue;
    DistributedSampler s({a.n, a.world, r, a.shuffle, a.seed, a.drop_last});
    s.set_epoch(a.epoch);
    per_rank.push_back(s.indices());
    num_samples = s.num_samples();
    total = s.total_size();
  }
  if (a.json) {
    nlohmann::json j = {{"n", a.n},           {"world", a.world},         {"shuffle", a.shuffle},
                        {"seed", a.seed},     {"epoch", a.epoch},         {"drop_last", a.drop_last},
                        {"num_samples", num_samples}, {"total_size", total}};
    j["ranks"] = nlohmann::json::array();
    size_t k = 0;
    for (int r = 0; r < a.world; r++) {
      if (a.rank >= 0 && r != a.rank) continue;
      j["ranks"].push_back({{"rank", r}, {"indices", per_rank[k++]}});
    }
    io.out << j.dump() << "\n";
    return 0;
  }
  io.out << "DistributedSampler(n=" << a.n << ", world=" << a.world
         << ", shuffle=" << (a.shuffle ? "True" : "False") << ", seed=" << a.seed
         << ", epoch=" << a.epoch << ", drop_last=" << (a.drop_last ? "True" : "False") << ")\n";
  io.out << num_samples << " samples per rank, total " << total;
  if (total > a.n) io.out << " (" << total - a.n << " repeated by wrap-around padding)";
  if (total < a.n) io.out << " (" << a.n - total << " dropped by drop_last)";
  io.out << "\n";
  size_t k = 0;
  for (int r = 0; r < a.world; r++) {
    if (a.rank >= 0 && r != a.rank) continue;
    io.out << "rank " << r << ": " << list_str(per_rank[k++]) << "\n";
  }
  return 0;
}

}  // namespace

Runner add_sampler_command(CLI::App& app) {
  auto a = std::make_shared<SamplerArgs>();
  // 2^27: the sampler lists every index (1 GiB of them), as torch's does.
  app.add_option("--n", a->n, "Dataset length N")->required()->check(whole_number(0, int64_t{1} << 27));
  app.add_option("--world", a->world, "World size W")->check(whole_number(1, 1 << 16));
  app.add_option("--rank", a->rank, "Print only this rank (default: all)")->check(whole_number(0, 1 << 16));
  app.add_option("--epoch", a->epoch, "Value passed to set_epoch()")->check(whole_number(0, int64_t{1} << 40));
  app.add_option("--seed", a->seed, "Sampler seed (torch default 0)")->check(whole_number(0, (int64_t{1} << 32) - 1));
  app.add_flag("--shuffle,!--no-shuffle", a->shuffle, "Shuffle with torch.randperm(seed + epoch)");
  app.add_flag("--drop-last", a->drop_last, "Drop the tail instead of padding by wrap-around");
  app.add_flag("--json", a->json, "Print one JSON object");
  return [a](Streams& io) { return run_sampler(*a, io); };
}

}  // namespace dtlab::cli
