// Dropout whose mask comes from a counter-based random stream, on all of torch's threads.
//
// torch's CPU dropout draws its mask with bernoulli_ from one sequential generator, on
// one thread; in a training step of a 2-core machine that is a third of the time spent
// outside attention. Here element i of the mask is a pure function of (seed, i): a
// 32-bit hash of the index, mixed with the 64-bit seed. Any thread can compute any
// element, so the mask is the same for any number of threads, and the loop vectorises
// (16 lanes of 32-bit integer multiplies with AVX-512). fastasr.kernels.dropout.keep_mask
// computes the same stream in PyTorch; the tests compare the two bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <tuple>

#include "common.h"

namespace fastasr_cpu {
namespace {

// lowbias32 (Wellons, hash-prospector): a bijection of 32-bit integers whose output
// bits each flip with probability ~0.5 when any input bit flips.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// Element i's uniform integer in [0, 2^24) for the seed (lo, hi): the index is spread by
// the golden-ratio multiplier, offset by the seed's low word, mixed, then mixed again
// with the high word (two seeds differing in either word give unrelated streams).
inline uint32_t uniform24(uint32_t i, uint32_t lo, uint32_t hi) {
  return mix32(mix32(i * 0x9e3779b9U + lo) ^ hi) >> 8;
}

// Elements per task: large enough that a task amortises the thread hand-off.
constexpr int64_t kGrain = int64_t(1) << 15;

void check_p(double p, const char* op) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "fastasr_cpu.", op, ": p must be in [0, 1), got ", p);
}

}  // namespace

// x -> (x * keep / (1 - p), keep): keep[i] is true with probability 1 - p (to 2^-24).
// A dropped element is x * 0, so NaN and inf propagate as they do through torch's dropout.
std::tuple<at::Tensor, at::Tensor> dropout_forward(const at::Tensor& x, double p, int64_t seed) {
  check_cpu(x, "dropout_forward", "x");
  check_p(p, "dropout_forward");
  TORCH_CHECK(x.numel() <= (int64_t(1) << 32), "fastasr_cpu.dropout_forward: ", x.numel(),
              " elements; the counter-based stream has 2^32 (split the tensor)");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  at::Tensor keep = at::empty(xc.sizes(), xc.options().dtype(at::kBool));
  const auto threshold = static_cast<uint32_t>(std::llround(p * 16777216.0));
  const auto lo = static_cast<uint32_t>(static_cast<uint64_t>(seed));
  const auto hi = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
  bool* keep_p = keep.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), "dropout_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t scale = static_cast<acc_t>(1.0 / (1.0 - p));
    const scalar_t* x_p = xc.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, xc.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const bool k = uniform24(static_cast<uint32_t>(i), lo, hi) >= threshold;
        keep_p[i] = k;
        out_p[i] = static_cast<scalar_t>(static_cast<acc_t>(x_p[i]) * (k ? scale : acc_t(0)));
      }
    });
  });
  return {out, keep};
}

// grad -> grad * keep / (1 - p): the backward of dropout_forward.
at::Tensor dropout_backward(const at::Tensor& grad, const at::Tensor& keep, double p) {
  check_cpu(grad, "dropout_backward", "grad");
  check_p(p, "dropout_backward");
  TORCH_CHECK(keep.scalar_type() == at::kBool && keep.sizes() == grad.sizes(),
              "fastasr_cpu.dropout_backward: keep must be a bool tensor of grad's shape ",
              grad.sizes(), ", got ", keep.scalar_type(), " ", keep.sizes());
  const at::Tensor gc = grad.contiguous();
  const at::Tensor kc = keep.contiguous();
  at::Tensor out = at::empty_like(gc);
  const bool* keep_p = kc.data_ptr<bool>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gc.scalar_type(), "dropout_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t scale = static_cast<acc_t>(1.0 / (1.0 - p));
    const scalar_t* g_p = gc.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    at::parallel_for(0, gc.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        out_p[i] = static_cast<scalar_t>(static_cast<acc_t>(g_p[i]) * (keep_p[i] ? scale : acc_t(0)));
    });
  });
  return out;
}

}  // namespace fastasr_cpu

TORCH_LIBRARY_FRAGMENT(fastasr_cpu, m) {
  m.def("dropout_forward(Tensor x, float p, int seed) -> (Tensor, Tensor)", &fastasr_cpu::dropout_forward);
  m.def("dropout_backward(Tensor grad, Tensor keep, float p) -> Tensor", &fastasr_cpu::dropout_backward);
}
