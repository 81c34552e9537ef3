#include "engine/cuda/device_model.h"

#include <algorithm>

#include "engine/cuda/device.h"
#include "engine/cuda/ops.h"

namespace dtlab::cuda {

DeviceModel::DeviceModel(const Model& host, MemoryTracker* tracker, const RankDevice& dev)
    : host_(host), tracker_(tracker), dev_(dev),
      params_({host.num_params()}, MemCategory::Parameters, tracker, dev.device()),
      grads_({host.num_params()}, MemCategory::Gradients, tracker, dev.device()) {
  DTLAB_CHECK(host.owns_parameters(), "a DeviceModel copies a host model that holds its parameters");
  upload(params_, host.params(), dev_.compute());
}

void DeviceModel::zero_grad() { grads_.zero(dev_.compute()); }

void DeviceModel::ensure_activations(int64_t B) {
  batch_ = B;
  if (B <= capacity_ && !acts_.empty()) return;  // a smaller (last) batch reuses the buffers
  acts_.clear();
  int64_t widest = 0;
  for (int i = 0; i < host_.num_layers(); i++) {
    const Layer& L = host_.layer(i);
    acts_.emplace_back(Shape{B, L.out_features}, MemCategory::Activations, tracker_, dev_.device());
    widest = std::max({widest, L.in_features, L.out_features});
  }
  for (auto& d : dbuf_) d = DeviceTensor({B, widest}, MemCategory::Activations, tracker_, dev_.device());
  capacity_ = B;
}

const float* DeviceModel::forward(const float* x, int64_t B) {
  ensure_activations(B);
  input_ = x;
  const float* in = x;
  for (int i = 0; i < host_.num_layers(); i++) {
    const Layer& L = host_.layer(i);
    float* out = acts_[static_cast<size_t>(i)].f32();
    ComputeScope scope(observer_, ComputeKind::LayerForward, L.seq_index, host_.layer_forward_flops(i, B));
    if (L.kind == LayerKind::Linear) {
      const Parameter& w = host_.parameters()[static_cast<size_t>(L.weight)];
      const Parameter& b = host_.parameters()[static_cast<size_t>(L.bias)];
      linear_forward(dev_, out, in, params() + w.offset, params() + b.offset, B, L.in_features, L.out_features);
    } else {
      relu_forward(dev_, out, in, B * L.out_features);
    }
    in = out;
  }
  return in;
}

void DeviceModel::backward(const float* dlogits) {
  DTLAB_CHECK(input_ != nullptr, "backward() called before forward()");
  const float* dout = dlogits;
  for (int i = host_.num_layers() - 1; i >= 0; i--) {
    const Layer& L = host_.layer(i);
    const float* in = i > 0 ? acts_[static_cast<size_t>(i - 1)].f32() : input_;
    // Ping-pong between the two buffers, never writing the one `dout` points into.
    float* dinp = i > 0 ? (dout == dbuf_[0].f32() ? dbuf_[1].f32() : dbuf_[0].f32()) : nullptr;
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                       host_.layer_backward_flops(i, batch_, dinp != nullptr));
    if (L.kind == LayerKind::Linear) {
      const Parameter& w = host_.parameters()[static_cast<size_t>(L.weight)];
      const Parameter& b = host_.parameters()[static_cast<size_t>(L.bias)];
      linear_backward(dev_, dinp, grads() + w.offset, grads() + b.offset, dout, in, params() + w.offset,
                      batch_, L.in_features, L.out_features);
    } else if (dinp) {
      relu_backward(dev_, dinp, dout, acts_[static_cast<size_t>(i)].f32(), batch_ * L.out_features);
    }
    dout = dinp;
  }
}

void DeviceModel::download_params(Model& host) const {
  DTLAB_CHECK(host.num_params() == num_params() && host.owns_parameters(),
              "download_params needs a host model of the same spec that holds its parameters");
  download(host.params(), params_, dev_.compute());
}

}  // namespace dtlab::cuda
