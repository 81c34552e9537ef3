// cuBLAS, loaded the first time a GPU rank needs it instead of linked into every binary.
//
// Linking libcublas makes each start of dtlab and dtlab-cli pay about 0.45 s of CPU before main
// (the loader maps libcublas and libcublasLt, some 700 MB, and runs their constructors), even for
// `dtlab-cli --help` or a CPU run; the tests start these binaries hundreds of times, which cost CI
// minutes. So the engine calls the few cuBLAS functions it uses (cublas_v2.h's names, which map to
// the *_v2 symbols defined here) through pointers resolved with dlopen on first use. A cuBLAS that
// cannot be loaded is reported by the call that needed it, in one sentence (fail_library).
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

namespace {

struct Cublas {
  void* lib = nullptr;
  std::string error;  // why it did not load
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float*, int,
                          const float*, int, const float*, float*, int) = nullptr;
  cublasStatus_t (*sgemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                                          const float*, int, long long, const float*, int, long long, const float*, float*, int,
                                          long long, int) = nullptr;
};

template <class F>
void bind(Cublas& c, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(c.lib, name));
  if (!fn && c.error.empty()) c.error = std::string(name) + " is missing from " + DTLAB_CUBLAS_LIBRARY;
}

// The library this build compiled against (CMake's CUDA::cublas), else the soname on the search path.
const Cublas& cublas() {
  static Cublas c;
  static std::once_flag once;
  std::call_once(once, [] {
    c.lib = dlopen(DTLAB_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!c.lib) c.lib = dlopen(("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR)).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!c.lib) {
      const char* why = dlerror();
      c.error = std::string("cuBLAS could not be loaded (") + (why ? why : DTLAB_CUBLAS_LIBRARY) +
                "); install the CUDA toolkit's cuBLAS, or use --device cpu";
      return;
    }
    bind(c, c.create, "cublasCreate_v2");
    bind(c, c.destroy, "cublasDestroy_v2");
    bind(c, c.set_stream, "cublasSetStream_v2");
    bind(c, c.set_math_mode, "cublasSetMathMode");
    bind(c, c.status_string, "cublasGetStatusString");
    bind(c, c.sgemm, "cublasSgemm_v2");
    bind(c, c.sgemm_strided_batched, "cublasSgemmStridedBatched");  // the attention's per-head products
  });
  return c;
}

}  // namespace

namespace dtlab::cuda {

// Empty when cuBLAS is loaded (loading it now if it was not), else the sentence saying why not.
std::string cublas_load_error() { return cublas().error; }

}  // namespace dtlab::cuda

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  const Cublas& c = cublas();
  return c.create ? c.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  const Cublas& c = cublas();
  return c.destroy ? c.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  const Cublas& c = cublas();
  return c.set_stream ? c.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  const Cublas& c = cublas();
  return c.set_math_mode ? c.set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  const Cublas& c = cublas();
  return c.status_string ? c.status_string(status) : c.error.c_str();
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                                           const float* beta, float* C, int ldc) {
  const Cublas& c = cublas();
  return c.sgemm ? c.sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                                      int m, int n, int k, const float* alpha, const float* A, int lda,
                                                      long long int strideA, const float* B, int ldb, long long int strideB,
                                                      const float* beta, float* C, int ldc, long long int strideC,
                                                      int batchCount) {
  const Cublas& c = cublas();
  return c.sgemm_strided_batched ? c.sgemm_strided_batched(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
                                                           beta, C, ldc, strideC, batchCount)
                                 : CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // extern "C"
