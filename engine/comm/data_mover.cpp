#include "engine/comm/data_mover.h"

#include "engine/comm/reduce_kernels.h"

namespace dtlab {

void DataMover::reduce_copy(int rank, void* dst, const void* src, int64_t count, DType dt, ReduceOp op, bool reduce,
                            int finish_n) {
  if (reduce) reduce_into(rank, dst, src, count, dt, op);
  else if (count > 0 && dst != src) copy(rank, dst, src, count * static_cast<int64_t>(dtype_size(dt)));
  if (finish_n > 0) finish_avg(rank, dst, count, dt, op, finish_n);
}

namespace {

class HostScratch : public CommScratch {
 public:
  HostScratch(int64_t bytes, MemoryTracker* tracker)
      : t_({(bytes + 3) / 4}, MemCategory::CommBuffers, tracker) {}
  void* data() override { return t_.raw(); }

 private:
  Tensor t_;
};

template <class F>
void with_type(DType dt, F f) {
  if (dt == DType::F32) f(float{});
  else if (dt == DType::BF16) f(Bf16Bits{});
  else if (dt == DType::F16) f(Fp16Bits{});
  else f(int64_t{});
}

class HostMover : public DataMover {
 public:
  const char* device_name() const override { return "cpu"; }
  void copy(int, void* dst, const void* src, int64_t bytes) override {
    copy_elems(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
  }
  void reduce_into(int, void* dst, const void* src, int64_t count, DType dt, ReduceOp op) override {
    with_type(dt, [&](auto t) {
      using T = decltype(t);
      dtlab::reduce_into(static_cast<T*>(dst), static_cast<const T*>(src), count, op);
    });
  }
  void reduce_to(int, void* dst, const void* a, const void* b, int64_t count, DType dt, ReduceOp op) override {
    with_type(dt, [&](auto t) {
      using T = decltype(t);
      dtlab::reduce_to(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, op);
    });
  }
  void finish_avg(int, void* buf, int64_t count, DType dt, ReduceOp op, int n) override {
    if (dt == DType::F32) dtlab::finish_avg(static_cast<float*>(buf), count, op, n);
  }
  std::unique_ptr<CommScratch> scratch(int, int64_t bytes, MemoryTracker* tracker) override {
    return std::make_unique<HostScratch>(bytes, tracker);
  }
};

}  // namespace

std::shared_ptr<DataMover> host_mover() {
  static const std::shared_ptr<DataMover> mover = std::make_shared<HostMover>();
  return mover;
}

}  // namespace dtlab
