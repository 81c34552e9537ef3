// Feeds the bytes, as a .npz file, to load_npz (engine/data/npz.h): the zip directory, stored and
// deflated members, ZIP64 records and the .npy headers. Finding: anything but dtlab::Error, or an
// accepted data set whose sizes or labels break the Dataset contract.
#include "engine/data/npz.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_temp("d.npz", data, size);
  Dataset ds;
  if (!fuzz::accepts([&] { ds = load_npz(path); })) return 0;
  fuzz::require(ds.n > 0 && ds.d > 0, "an accepted data set is empty");
  fuzz::require(ds.x.size() == static_cast<size_t>(ds.n * ds.d) && ds.y.size() == static_cast<size_t>(ds.n),
                "x or y does not hold n x d values");
  for (int64_t label : ds.y) fuzz::require(label >= 0 && label < ds.num_classes, "a label outside [0, num_classes)");
  return 0;
}
