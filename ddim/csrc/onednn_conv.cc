// Stride-1 'SAME' convolutions (1x1 and 3x3) of NHWC float32 activations with HWIO weights on oneDNN's CPU kernels,
// exposed to XLA as three FFI custom calls: the forward pass, the input gradient and the weight gradient.
//
// Why: XLA:CPU runs convolutions on Eigen, whose weight gradient unfolds the input into patches as large as
// the image (the contraction runs over batch x height x width) and needs the activations transposed to
// [C, H, W, N] first; on AVX-512 processors that is 3-4x slower than oneDNN's direct kernels, which read
// NHWC directly. See docs/research/cpu-speed.md.
//
// Each call looks up (or creates once) the primitive for its shape, reorders the HWIO weights (or their
// gradient) to and from the layout oneDNN chose, and runs the primitive on the NHWC buffers XLA hands over.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using dnnl::memory;
using Tag = dnnl::memory::format_tag;

namespace {

enum Kind { kForward = 0, kInputGradient = 1, kWeightGradient = 2 };

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One shape's primitive and the scratch buffers of its reorders.
struct Entry {
  dnnl::primitive primitive;
  memory::desc user_a, user_b, user_out;  // what XLA passes: activations NHWC, weights HWIO
  memory a, b, out;                       // the primitive's own layouts (allocated when they differ)
  bool reorder_a = false, reorder_b = false, reorder_out = false;
  int arg_a = 0, arg_b = 0, arg_out = 0;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;  // kind, N, H, W, C_in, C_out, k

memory::desc Any(const memory::dims& dims) { return memory::desc(dims, memory::data_type::f32, Tag::any); }

void Bind(Entry& e, const memory::desc& chosen_a, const memory::desc& chosen_b, const memory::desc& chosen_out) {
  auto& engine = Engine();
  e.reorder_a = chosen_a != e.user_a;
  e.reorder_b = chosen_b != e.user_b;
  e.reorder_out = chosen_out != e.user_out;
  if (e.reorder_a) e.a = memory(chosen_a, engine);
  if (e.reorder_b) e.b = memory(chosen_b, engine);
  if (e.reorder_out) e.out = memory(chosen_out, engine);
}

std::unique_ptr<Entry> Create(const Key& key) {
  auto [kind, n, h, w, c, o, k] = key;
  auto& engine = Engine();
  const int64_t pad = (k - 1) / 2;
  const memory::dims src{n, c, h, w}, weights{o, c, k, k}, dst{n, o, h, w}, strides{1, 1}, padding{pad, pad};
  const auto f32 = memory::data_type::f32;
  // Activations stay NHWC (oneDNN's brgemm kernels read it directly: no reorders of the large tensors); the
  // weights go to the blocked layout oneDNN picks ('any'), a reorder of a few kilobytes. On a 2-core AVX-512
  // Xeon, a 64x64, 32-channel layer's forward, input and weight gradients take 12.0, 12.2 and 11.1 ms so,
  // against 16.2, 18.9 and 20.4 ms with every tensor in 'any' (blocked, reordered each call), and the weights
  // fixed to HWIO make oneDNN fall back to slower GEMM-based kernels.
  const memory::desc nhwc_src(src, f32, Tag::nhwc), nhwc_dst(dst, f32, Tag::nhwc), hwio(weights, f32, Tag::hwio);
  auto forward = dnnl::convolution_forward::primitive_desc(
      engine, dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, nhwc_src, Any(weights),
      nhwc_dst, strides, padding, padding);
  auto e = std::make_unique<Entry>();
  if (kind == kForward) {
    e->user_a = nhwc_src, e->user_b = hwio, e->user_out = nhwc_dst;
    e->arg_a = DNNL_ARG_SRC, e->arg_b = DNNL_ARG_WEIGHTS, e->arg_out = DNNL_ARG_DST;
    Bind(*e, forward.src_desc(), forward.weights_desc(), forward.dst_desc());
    e->primitive = dnnl::convolution_forward(forward);
  } else if (kind == kInputGradient) {
    auto pd = dnnl::convolution_backward_data::primitive_desc(engine, dnnl::algorithm::convolution_direct, nhwc_src,
                                                              Any(weights), nhwc_dst, strides, padding, padding,
                                                              forward);
    e->user_a = nhwc_dst, e->user_b = hwio, e->user_out = nhwc_src;
    e->arg_a = DNNL_ARG_DIFF_DST, e->arg_b = DNNL_ARG_WEIGHTS, e->arg_out = DNNL_ARG_DIFF_SRC;
    Bind(*e, pd.diff_dst_desc(), pd.weights_desc(), pd.diff_src_desc());
    e->primitive = dnnl::convolution_backward_data(pd);
  } else {
    auto pd = dnnl::convolution_backward_weights::primitive_desc(engine, dnnl::algorithm::convolution_direct,
                                                                 nhwc_src, Any(weights), nhwc_dst, strides, padding,
                                                                 padding, forward);
    e->user_a = nhwc_src, e->user_b = nhwc_dst, e->user_out = hwio;
    e->arg_a = DNNL_ARG_SRC, e->arg_b = DNNL_ARG_DIFF_DST, e->arg_out = DNNL_ARG_DIFF_WEIGHTS;
    Bind(*e, pd.src_desc(), pd.diff_dst_desc(), pd.diff_weights_desc());
    e->primitive = dnnl::convolution_backward_weights(pd);
  }
  return e;
}

// Called only under Run's lock, which guards the cache too.
Entry& Lookup(const Key& key) {
  static std::map<Key, std::unique_ptr<Entry>> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, Create(key)).first;
  return *it->second;
}

ffi::Error Run(Kind kind, int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t k, void* a, void* b,
               void* out) {
  try {
    // One call at a time: each already runs on every core (oneDNN's OpenMP team), XLA may start two
    // independent ones at once (the input and weight gradients), and two teams on the same cores spin
    // against each other. It also keeps the cache and each entry's scratch buffers to one user.
    static std::mutex one_at_a_time;
    std::lock_guard<std::mutex> lock(one_at_a_time);
    Entry& e = Lookup(Key{kind, n, h, w, c, o, k});
    auto& engine = Engine();
    dnnl::stream stream(engine);
    memory user_a(e.user_a, engine, a), user_b(e.user_b, engine, b), user_out(e.user_out, engine, out);
    if (e.reorder_a) dnnl::reorder(user_a, e.a).execute(stream, user_a, e.a);
    if (e.reorder_b) dnnl::reorder(user_b, e.b).execute(stream, user_b, e.b);
    e.primitive.execute(stream, {{e.arg_a, e.reorder_a ? e.a : user_a},
                                 {e.arg_b, e.reorder_b ? e.b : user_b},
                                 {e.arg_out, e.reorder_out ? e.out : user_out}});
    if (e.reorder_out) dnnl::reorder(e.out, user_out).execute(stream, e.out, user_out);
    stream.wait();
  } catch (const dnnl::error& error) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("oneDNN: ") + error.what());
  }
  return ffi::Error::Success();
}

// A square kernel of size 1 or 3 (odd, so 'SAME' pads (k - 1) / 2 on each side).
bool Supported(ffi::Span<const int64_t> weights) {
  return weights.size() == 4 && weights[0] == weights[1] && (weights[0] == 1 || weights[0] == 3);
}

ffi::Error Forward(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> kernel, ffi::ResultBuffer<ffi::F32> y) {
  auto d = x.dimensions(), k = kernel.dimensions();
  if (d.size() != 4 || !Supported(k) || k[2] != d[3])
    return ffi::Error::InvalidArgument("expected NHWC x, 1x1 or 3x3 HWIO kernel");
  return Run(kForward, d[0], d[1], d[2], d[3], k[3], k[0], x.untyped_data(), kernel.untyped_data(), y->untyped_data());
}

ffi::Error InputGradient(ffi::Buffer<ffi::F32> dy, ffi::Buffer<ffi::F32> kernel, ffi::ResultBuffer<ffi::F32> dx) {
  auto d = dy.dimensions(), k = kernel.dimensions();
  if (d.size() != 4 || !Supported(k) || k[3] != d[3])
    return ffi::Error::InvalidArgument("expected NHWC dy, 1x1 or 3x3 HWIO kernel");
  return Run(kInputGradient, d[0], d[1], d[2], k[2], k[3], k[0], dy.untyped_data(), kernel.untyped_data(),
             dx->untyped_data());
}

ffi::Error WeightGradient(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy, ffi::ResultBuffer<ffi::F32> dkernel) {
  auto d = x.dimensions(), g = dy.dimensions(), k = dkernel->dimensions();
  if (d.size() != 4 || g.size() != 4 || d[0] != g[0] || d[1] != g[1] || d[2] != g[2] || !Supported(k))
    return ffi::Error::InvalidArgument("expected NHWC x and dy of the same batch and size, 1x1 or 3x3 HWIO kernel");
  return Run(kWeightGradient, d[0], d[1], d[2], d[3], g[3], k[0], x.untyped_data(), dy.untyped_data(),
             dkernel->untyped_data());
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(DdimConvForward, Forward,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(DdimConvInputGradient, InputGradient,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(DdimConvWeightGradient, WeightGradient,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
