// The devices this machine has, for suites that run a case per device (cpu always, cuda when a GPU
// is there), and why one is absent in the words CTest's SKIP_REGULAR_EXPRESSION matches.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#if DTLAB_HAVE_CUDA
#include "engine/cuda/platform.h"
#endif

namespace dtlab::test {

// In the order the suites run them; the CPU is the reference.
inline std::vector<std::string> devices_present() {
  std::vector<std::string> d{"cpu"};
#if DTLAB_HAVE_CUDA
  if (cuda::available()) d.push_back("cuda");
#endif
  return d;
}

inline std::string why_absent(const std::string& device) {
#if DTLAB_HAVE_CUDA
  if (device == "cuda") return cuda::unavailable_reason();
#endif
  return "built without CUDA";
}

inline bool present(const std::string& device) {
  const std::vector<std::string> d = devices_present();
  return std::find(d.begin(), d.end(), device) != d.end();
}

}  // namespace dtlab::test
