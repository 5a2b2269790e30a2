// The MinAtar net's torso (a 3x3 convolution, its ReLU, the hidden layer before its ReLU) as
// one op that skips zeros. A MinAtar frame has a few dozen non-zero cells of its 10 x 10 x C,
// and a trained net a few dozen to a hundred and fifty non-zero features of the convolution's
// 1,024 (docs/results.md). Dense kernels multiply all the zeros; this op visits each non-zero
// cell and feature once, reading a feature's 256 hidden-layer weights as one row.
//
// minatar_torso(frames [N, H, W, C] float32, conv_weight [O, C, 3, 3], conv_bias [O],
//               fc_weight [Hd, O * (H - 2) * (W - 2)], fc_bias [Hd]) -> [N, Hd]
// computes fc(relu(conv(frames))), the features flattened in the conv's NCHW order, as
// F.linear(F.relu(F.conv2d(frames.permute(0, 3, 1, 2), ...)).flatten(1), ...) does, to rounding.
// The frames get no gradient. fc_weight is read a feature's column at a time: stored so that
// fc_weight.t() is contiguous it is read in place, and its gradient is returned in that layout;
// otherwise each call transposes it.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// On x86-64 each kernel is compiled for AVX-512, AVX2 and the baseline; the loader picks what
// the CPU has, so one build runs on every node of a cluster.
#if defined(__x86_64__)
#define MULTI_ISA __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MULTI_ISA
#endif

constexpr int64_t kKernel = 3;

struct Dims {
  int64_t frames, height, width, channels;  // the input
  int64_t out_channels, out_height, out_width, positions, features, hidden;
};

// frames [N, H, W, C] through a 3x3 convolution of out_channels into a hidden layer.
Dims dims_of(at::IntArrayRef frames, int64_t out_channels, int64_t hidden) {
  Dims d;
  d.frames = frames[0];
  d.height = frames[1];
  d.width = frames[2];
  d.channels = frames[3];
  d.out_channels = out_channels;
  d.out_height = d.height - kKernel + 1;
  d.out_width = d.width - kKernel + 1;
  d.positions = d.out_height * d.out_width;
  d.features = d.out_channels * d.positions;
  d.hidden = hidden;
  return d;
}

// The conv's loops over a row of channels are vectorized at each clone's own width (8 floats
// with AVX2, 16 with AVX-512): `omp simd` (-fopenmp-simd) tells the compiler the rows do not
// overlap. The hidden layer's rows go through Floats8 below.

// y += a * x
inline __attribute__((always_inline)) void axpy(float* y, const float* x, float a, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// axpy over a row of conv channels: for the MinAtar net's 16 a constant count, so that the
// compiler makes the short row one or two whole vectors instead of a loop with its remainder.
inline __attribute__((always_inline)) void axpy_channels(float* y, const float* x, float a,
                                                         int64_t n) {
  if (n == 16)
    axpy(y, x, a, 16);
  else
    axpy(y, x, a, n);
}

// Eight floats as one value (GCC's vector extension): a register of each clone's, half of
// one with AVX-512, two with the baseline's SSE. Loaded and stored unaligned.
typedef float Floats8 __attribute__((vector_size(32)));

inline __attribute__((always_inline)) Floats8 load8(const float* p) {
  Floats8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

inline __attribute__((always_inline)) void store8(float* p, Floats8 x) {
  std::memcpy(p, &x, sizeof x);
}

// kGroup kept features of one frame in one pass over the hidden units: their rows share each
// load and store of the frame's output (forward) or each load of its output gradient
// (backward), and each row's dot product has its own accumulator. A feature at a time, the
// backward pass's dot products were chains of dependent multiply-adds, each ending in a sum of
// its lanes through the stack: a SpaceInvaders learner minibatch's torso took 2.6-3.0 ms where
// it takes 2.1-2.2 now, to the same bits (docs/results.md).
constexpr int64_t kGroup = 4;

// For i < count: dot[i] = w[i] . g and gw[i] += v[i] * g, over n floats.
template <int64_t count>
inline __attribute__((always_inline)) void dots_and_axpys(const float* const* w, const float* g,
                                                          float* const* gw, const float* v,
                                                          float* dot, int64_t n) {
  Floats8 sums[count] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const Floats8 gj = load8(g + j);
    for (int64_t i = 0; i < count; ++i) {
      sums[i] += load8(w[i] + j) * gj;
      store8(gw[i] + j, load8(gw[i] + j) + v[i] * gj);
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += sums[i][l];
    for (int64_t r = j; r < n; ++r) {
      total += w[i][r] * g[r];
      gw[i][r] += v[i] * g[r];
    }
    dot[i] = total;
  }
}

// y += the sum of v[i] * x[i] for i < count, adding the rows in order (the same sums, to the
// bit, as one axpy per row), loading and storing y once for all of them.
template <int64_t count>
inline __attribute__((always_inline)) void axpys(float* y, const float* const* x, const float* v,
                                                 int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    Floats8 sum = load8(y + j);
    for (int64_t i = 0; i < count; ++i) sum += v[i] * load8(x[i] + j);
    store8(y + j, sum);
  }
  for (; j < n; ++j)
    for (int64_t i = 0; i < count; ++i) y[j] += v[i] * x[i][j];
}

// Calls visit(v, tap, position) for each non-zero cell v of a frame [H, W, C] and each output
// position [OH * OW] its 3x3 window reaches, tap being the kernel's entry [C, 3, 3] between them.
template <typename Visit>
inline __attribute__((always_inline)) void for_each_tap(const float* frame, const Dims& d,
                                                        Visit visit) {
  for (int64_t y = 0; y < d.height; ++y)
    for (int64_t x = 0; x < d.width; ++x)
      for (int64_t c = 0; c < d.channels; ++c) {
        const float v = frame[(y * d.width + x) * d.channels + c];
        if (v == 0.0f) continue;
        for (int64_t ky = 0; ky < kKernel; ++ky) {
          const int64_t oy = y - ky;
          if (oy < 0 || oy >= d.out_height) continue;
          for (int64_t kx = 0; kx < kKernel; ++kx) {
            const int64_t ox = x - kx;
            if (ox < 0 || ox >= d.out_width) continue;
            visit(v, (c * kKernel + ky) * kKernel + kx, oy * d.out_width + ox);
          }
        }
      }
}

// One frame's convolution, position-major: out[p * O + o] for output position p and channel o,
// from the bias plus each non-zero input cell times the weights it meets ([C, 3, 3, O]).
MULTI_ISA void convolve_frame(const float* __restrict__ frame, const float* __restrict__ weights,
                              const float* __restrict__ bias, const Dims& d,
                              float* __restrict__ out) {
  const int64_t oc = d.out_channels;
  for (int64_t p = 0; p < d.positions; ++p)
    for (int64_t o = 0; o < oc; ++o) out[p * oc + o] = bias[o];
  for_each_tap(frame, d, [&](float v, int64_t tap, int64_t position) {
    axpy_channels(out + position * oc, weights + tap * oc, v, oc);
  });
}

// Each frame's features after the ReLU, kept where not zero: their NCHW index and value, frame
// by frame from ptr[n] to ptr[n + 1] (index and value hold room for every feature). Returns the
// number kept.
MULTI_ISA int64_t active_features(const float* __restrict__ frames,
                                  const float* __restrict__ conv_w,
                                  const float* __restrict__ conv_b, const Dims& d,
                                  int64_t* __restrict__ ptr, int32_t* __restrict__ index,
                                  float* __restrict__ value) {
  std::vector<float> conv(d.positions * d.out_channels);
  const int64_t cells = d.height * d.width * d.channels;
  int64_t kept = 0;
  for (int64_t n = 0; n < d.frames; ++n) {
    convolve_frame(frames + n * cells, conv_w, conv_b, d, conv.data());
    ptr[n] = kept;
    for (int64_t o = 0; o < d.out_channels; ++o)
      for (int64_t p = 0; p < d.positions; ++p) {
        const float v = conv[p * d.out_channels + o];
        // Written always and kept by the count, without a branch: which features fire is
        // not predictable. !(v <= 0) keeps a NaN, which the ReLU passes on as a dense layer
        // would.
        index[kept] = static_cast<int32_t>(o * d.positions + p);
        value[kept] = v;
        kept += !(v <= 0.0f);
      }
  }
  ptr[d.frames] = kept;
  return kept;
}

// The kept features back in place in a zeroed [N, K].
void scatter_features(const int64_t* ptr, const int32_t* index, const float* value,
                      const Dims& d, float* features) {
  for (int64_t n = 0; n < d.frames; ++n)
    for (int64_t i = ptr[n]; i < ptr[n + 1]; ++i) features[n * d.features + index[i]] = value[i];
}

// The hidden layer on the kept features: out[n] = bias + the sum of each kept feature's value
// times its row of the table [K, Hd].
MULTI_ISA void hidden_forward(const int64_t* __restrict__ ptr, const int32_t* __restrict__ index,
                              const float* __restrict__ value, const float* __restrict__ table,
                              const float* __restrict__ bias, const Dims& d,
                              float* __restrict__ out) {
  for (int64_t n = 0; n < d.frames; ++n) {
    float* __restrict__ row = out + n * d.hidden;
    for (int64_t j = 0; j < d.hidden; ++j) row[j] = bias[j];
    const float* rows[kGroup];
    for (int64_t i = ptr[n]; i < ptr[n + 1]; i += kGroup) {
      const int64_t count = std::min(kGroup, ptr[n + 1] - i);
      for (int64_t k = 0; k < count; ++k)
        rows[k] = table + static_cast<int64_t>(index[i + k]) * d.hidden;
      if (count == kGroup)
        axpys<kGroup>(row, rows, value + i, d.hidden);
      else
        for (int64_t k = 0; k < count; ++k) axpys<1>(row, rows + k, value + i + k, d.hidden);
    }
  }
}

// The backward pass: each kept feature's gradient (from the hidden layer's output gradient
// grad [N, Hd] and the table, adding the table's gradient as it goes; or, where the hidden
// layer ran dense, read from grad_features [N, K]), and from those the convolution's.
MULTI_ISA void torso_backward(const float* __restrict__ grad,
                              const float* __restrict__ grad_features,
                              const float* __restrict__ frames, const float* __restrict__ table,
                              const int64_t* __restrict__ ptr, const int32_t* __restrict__ index,
                              const float* __restrict__ value, const Dims& d,
                              float* __restrict__ grad_table, float* __restrict__ grad_conv_w,
                              float* __restrict__ grad_conv_b) {
  const int64_t oc = d.out_channels;
  std::vector<float> grad_conv(d.positions * oc);
  const int64_t cells = d.height * d.width * d.channels;
  for (int64_t n = 0; n < d.frames; ++n) {
    const float* __restrict__ g = grad + n * d.hidden;
    std::fill(grad_conv.begin(), grad_conv.end(), 0.0f);
    const int64_t first = ptr[n], end = ptr[n + 1];
    if (grad_features != nullptr) {
      for (int64_t i = first; i < end; ++i) {
        const int64_t f = index[i];
        grad_conv[(f % d.positions) * oc + f / d.positions] = grad_features[n * d.features + f];
      }
    } else {
      for (int64_t i = first; i < end; i += kGroup) {
        const int64_t count = std::min(kGroup, end - i);
        const float* rows[kGroup];
        float* grad_rows[kGroup];
        float feature_grad[kGroup];
        for (int64_t k = 0; k < count; ++k) {
          rows[k] = table + static_cast<int64_t>(index[i + k]) * d.hidden;
          grad_rows[k] = grad_table + static_cast<int64_t>(index[i + k]) * d.hidden;
        }
        if (count == kGroup)
          dots_and_axpys<kGroup>(rows, g, grad_rows, value + i, feature_grad, d.hidden);
        else
          for (int64_t k = 0; k < count; ++k)
            dots_and_axpys<1>(rows + k, g, grad_rows + k, value + i + k, feature_grad + k,
                              d.hidden);
        for (int64_t k = 0; k < count; ++k) {
          const int64_t f = index[i + k];
          grad_conv[(f % d.positions) * oc + f / d.positions] = feature_grad[k];
        }
      }
    }
    for (int64_t p = 0; p < d.positions; ++p)
      for (int64_t o = 0; o < oc; ++o) grad_conv_b[o] += grad_conv[p * oc + o];
    for_each_tap(frames + n * cells, d, [&](float v, int64_t tap, int64_t position) {
      axpy_channels(grad_conv_w + tap * oc, grad_conv.data() + position * oc, v, oc);
    });
  }
}

void check_inputs(const at::Tensor& frames, const at::Tensor& conv_weight,
                  const at::Tensor& conv_bias, const at::Tensor& fc_weight,
                  const at::Tensor& fc_bias) {
  for (const at::Tensor* t : {&frames, &conv_weight, &conv_bias, &fc_weight, &fc_bias}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat,
                "minatar_torso takes float32 CPU tensors");
  }
  TORCH_CHECK(frames.dim() == 4 && frames.size(1) >= kKernel && frames.size(2) >= kKernel,
              "minatar_torso: frames must be [N, H, W, C] with H, W >= 3");
  TORCH_CHECK(conv_weight.dim() == 4 && conv_weight.size(1) == frames.size(3) &&
                  conv_weight.size(2) == kKernel && conv_weight.size(3) == kKernel,
              "minatar_torso: conv_weight must be [O, C, 3, 3]");
  TORCH_CHECK(conv_bias.dim() == 1 && conv_bias.size(0) == conv_weight.size(0),
              "minatar_torso: conv_bias must be [O]");
  const Dims d = dims_of(frames.sizes(), conv_weight.size(0), fc_weight.size(0));
  TORCH_CHECK(fc_weight.dim() == 2 && fc_weight.size(1) == d.features,
              "minatar_torso: fc_weight must be [Hd, O * (H - 2) * (W - 2)]");
  TORCH_CHECK(fc_bias.dim() == 1 && fc_bias.size(0) == d.hidden,
              "minatar_torso: fc_bias must be [Hd]");
}

// Above this share of features kept, the hidden layer's three products run dense (BLAS on the
// features scattered back into [N, K]): a fresh net keeps about half of its 1,024 features a
// frame, where the rows cost twice the dense products; trained nets keep 3-150 (docs/results.md).
constexpr double kDenseAbove = 0.2;

class Torso : public torch::autograd::Function<Torso> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& frames,
                            const at::Tensor& conv_weight, const at::Tensor& conv_bias,
                            const at::Tensor& fc_weight, const at::Tensor& fc_bias) {
    check_inputs(frames, conv_weight, conv_bias, fc_weight, fc_bias);
    const Dims d = dims_of(frames.sizes(), conv_weight.size(0), fc_weight.size(0));
    const auto x = frames.contiguous();
    // [C, 3, 3, O]: the O weights an input cell meets at one kernel offset, side by side.
    const auto conv_w = conv_weight.permute({1, 2, 3, 0}).contiguous();
    const auto conv_b = conv_bias.contiguous();
    const bool stored_as_table = fc_weight.t().is_contiguous();
    const auto table = stored_as_table ? fc_weight.t() : fc_weight.t().contiguous();
    const auto fc_b = fc_bias.contiguous();

    auto ptr = at::empty({d.frames + 1}, x.options().dtype(at::kLong));
    auto index = at::empty({d.frames * d.features}, x.options().dtype(at::kInt));
    auto value = at::empty({d.frames * d.features}, x.options());
    const int64_t kept =
        active_features(x.data_ptr<float>(), conv_w.data_ptr<float>(), conv_b.data_ptr<float>(),
                        d, ptr.data_ptr<int64_t>(), index.data_ptr<int32_t>(),
                        value.data_ptr<float>());
    at::Tensor out, features;
    if (kept > kDenseAbove * d.frames * d.features) {
      features = at::zeros({d.frames, d.features}, x.options());
      scatter_features(ptr.data_ptr<int64_t>(), index.data_ptr<int32_t>(),
                       value.data_ptr<float>(), d, features.data_ptr<float>());
      out = at::addmm(fc_b, features, table);
    } else {
      out = at::empty({d.frames, d.hidden}, x.options());
      hidden_forward(ptr.data_ptr<int64_t>(), index.data_ptr<int32_t>(),
                     value.data_ptr<float>(), table.data_ptr<float>(), fc_b.data_ptr<float>(),
                     d, out.data_ptr<float>());
    }
    ctx->save_for_backward({x, table, ptr, index, value, features});
    ctx->saved_data["stored_as_table"] = stored_as_table;
    ctx->saved_data["out_channels"] = d.out_channels;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &table = saved[1], &ptr = saved[2], &index = saved[3],
               &value = saved[4], &features = saved[5];
    const auto grad = grads[0].contiguous();
    const Dims d =
        dims_of(x.sizes(), ctx->saved_data["out_channels"].toInt(), table.size(1));

    at::Tensor grad_table, grad_features;
    if (features.defined()) {
      grad_table = features.t().mm(grad);
      grad_features = grad.mm(table.t());
    } else {
      grad_table = at::zeros({d.features, d.hidden}, grad.options());
    }
    auto grad_conv_w = at::zeros({d.channels, kKernel, kKernel, d.out_channels}, grad.options());
    auto grad_conv_b = at::zeros({d.out_channels}, grad.options());
    torso_backward(grad.data_ptr<float>(),
                   grad_features.defined() ? grad_features.data_ptr<float>() : nullptr,
                   x.data_ptr<float>(), table.data_ptr<float>(), ptr.data_ptr<int64_t>(),
                   index.data_ptr<int32_t>(), value.data_ptr<float>(), d,
                   grad_table.data_ptr<float>(), grad_conv_w.data_ptr<float>(),
                   grad_conv_b.data_ptr<float>());
    const bool stored_as_table = ctx->saved_data["stored_as_table"].toBool();
    return {at::Tensor(), grad_conv_w.permute({3, 0, 1, 2}).contiguous(), grad_conv_b,
            stored_as_table ? grad_table.t() : grad_table.t().contiguous(), grad.sum(0)};
  }
};

at::Tensor minatar_torso(const at::Tensor& frames, const at::Tensor& conv_weight,
                         const at::Tensor& conv_bias, const at::Tensor& fc_weight,
                         const at::Tensor& fc_bias) {
  return Torso::apply(frames, conv_weight, conv_bias, fc_weight, fc_bias);
}

}  // namespace

TORCH_LIBRARY(moolib_examples, m) {
  m.def(
      "minatar_torso(Tensor frames, Tensor conv_weight, Tensor conv_bias, Tensor fc_weight, "
      "Tensor fc_bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(moolib_examples, CompositeImplicitAutograd, m) {
  m.impl("minatar_torso", minatar_torso);
}
