// Matrix products through Intel MKL, as XLA CPU custom calls (jax.ffi).
//
// Compiled on first use by rlinf_jax/kernels/mkl.py (actor.model.matmul=mkl). Row-major,
// float32 or (rounded once) bfloat16 out; the handlers MklGemmF32 / MklGemmBf16 take
//   2-D operands:  y[M, N]    = op(a) @ op(b)
//   3-D operands:  y[L, M, N] = op(a[l]) @ op(b[l])   (one product per leading index)
// op() transposes when the attribute trans_a / trans_b is set. MKL reads a transposed
// operand in place, which is why the backward products need no copies. The bfloat16
// variant calls cblas_gemm_bf16bf16f32, which runs on the CPU's AMX tiles where it has them
// (XLA's own CPU bfloat16 products do not). It takes each operand in bfloat16 or float32:
// a float32 operand (an activation, a gradient) is rounded here, into a scratch buffer,
// which costs far less than a separate XLA convert of it (see Round). Weights arrive
// rounded already, once per program, by RoundBf16.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "mkl_cblas.h"
#include "mkl_vml.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Operand {
  int64_t batch, rows, cols, ld;
};

template <typename Buffer>
Operand Shape(const Buffer& x, bool trans) {
  auto d = x.dimensions();
  const size_t n = d.size();
  Operand op;
  op.batch = n == 3 ? d[0] : 1;
  op.ld = d[n - 1];
  op.rows = trans ? d[n - 1] : d[n - 2];
  op.cols = trans ? d[n - 2] : d[n - 1];
  return op;
}

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* y) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, y, N);
}

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
          const uint16_t* b, int64_t ldb, float* y) {
  cblas_gemm_bf16bf16f32(CblasRowMajor, ta, tb, M, N, K, 1.0f, reinterpret_cast<const MKL_BF16*>(a), lda,
                         reinterpret_cast<const MKL_BF16*>(b), ldb, 0.0f, y, N);
}

// Floats of one block of a bfloat16 result (512 KB: inside a core's L2 cache).
constexpr int64_t kBlockFloats = 128 * 1024;

// float32 -> bfloat16, rounding to nearest even as XLA's convert does (NaNs stay NaNs).
inline uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// n floats rounded to bfloat16: 16 at a time with AVX512-BF16 where the compiler targets it
// (same rounding, NaNs quiet), the rest one by one.
void Round(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= n; i += 16) {
    const __m256bh packed = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(packed));
  }
#endif
  for (; i < n; ++i) dst[i] = ToBf16(src[i]);
}

// The operand's elements as Elem: the buffer itself, or for a float32 buffer of a bfloat16
// product its elements rounded into `scratch`. nullptr: a dtype the product does not take.
template <typename Elem>
const Elem* AsElem(const ffi::AnyBuffer& x, std::vector<uint16_t>& scratch) {
  const auto type = x.element_type();
  if constexpr (std::is_same_v<Elem, float>) {
    return type == ffi::DataType::F32 ? reinterpret_cast<const float*>(x.untyped_data()) : nullptr;
  } else {
    if (type == ffi::DataType::BF16) return reinterpret_cast<const uint16_t*>(x.untyped_data());
    if (type != ffi::DataType::F32) return nullptr;
    scratch.resize(x.element_count());
    Round(reinterpret_cast<const float*>(x.untyped_data()), scratch.data(), static_cast<int64_t>(x.element_count()));
    return scratch.data();
  }
}

template <typename Elem>
ffi::Error Products(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> y, bool trans_a, bool trans_b) {
  const Operand A = Shape(a, trans_a), B = Shape(b, trans_b);
  if (A.cols != B.rows || A.batch != B.batch) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mkl gemm: operand shapes do not chain");
  }
  const bool bf16_out = y->element_type() == ffi::DataType::BF16;
  if (!bf16_out && y->element_type() != ffi::DataType::F32) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mkl gemm: the result is float32 or bfloat16");
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int64_t M = A.rows, K = A.cols, N = B.cols;
  if (M == 0 || N == 0) return ffi::Error::Success();
  // Per thread: XLA may run two products at once on its own threads.
  static thread_local std::vector<uint16_t> rounded_a, rounded_b;
  const Elem* pa = AsElem<Elem>(a, rounded_a);
  const Elem* pb = AsElem<Elem>(b, rounded_b);
  if (pa == nullptr || pb == nullptr) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "mkl gemm: operands are float32, or for a bfloat16 product bfloat16 or float32");
  }
  // A bfloat16 result is accumulated in float32 and rounded once: the same numbers as a
  // float32 result converted by XLA. It is made a block of rows at a time, each block
  // rounded while it is still in cache (a separate pass over the whole float32 result cost
  // as much as XLA's own convert: it is bound by memory).
  const int64_t block = bf16_out ? std::max<int64_t>(1, kBlockFloats / N) : M;
  static thread_local std::vector<float> scratch;
  if (bf16_out) scratch.resize(static_cast<size_t>(std::min(block, M) * N));
  const int64_t a_row = trans_a ? 1 : A.ld;  // step between rows of op(a)
  for (int64_t l = 0; l < A.batch; ++l) {
    for (int64_t r = 0; r < M; r += block) {
      const int64_t rows = std::min(block, M - r);
      float* out = bf16_out ? scratch.data() : reinterpret_cast<float*>(y->untyped_data()) + (l * M + r) * N;
      if (K == 0) {  // an empty contraction: MKL's leading-dimension checks would reject it
        std::fill(out, out + rows * N, 0.0f);
      } else {
        Gemm(ta, tb, rows, N, K, pa + l * M * K + r * a_row, A.ld, pb + l * K * N, B.ld, out);
      }
      if (bf16_out) Round(out, reinterpret_cast<uint16_t*>(y->untyped_data()) + (l * M + r) * N, rows * N);
    }
  }
  return ffi::Error::Success();
}

// float32 -> bfloat16 of a whole array (Round): a weight rounded once per program for all
// the bfloat16 products that read it, at AVX512-BF16's rate, where XLA's own convert is a
// scalar loop.
ffi::Error RoundArray(ffi::Buffer<ffi::DataType::F32> x, ffi::Result<ffi::Buffer<ffi::DataType::BF16>> y) {
  Round(x.typed_data(), reinterpret_cast<uint16_t*>(y->untyped_data()), static_cast<int64_t>(x.element_count()));
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- token log-probabilities
//
// Per row r of logits x [R, V] and its token t_r, with z = x / T:
//   logp_r = z[t_r] - lse(z),   entropy_r = lse(z) - E_p[z],   p = softmax(z),
// and the backward pass dz_j = g_logp (1[j = t] - p_j) - g_ent p_j (z_j - E_p[z]),
// dx = dz / T. XLA's CPU passes over a [rows, vocabulary] array (a max, an exp, sums, a
// select, each a separate pass at well under a byte per nanosecond) took about 6% of an LM
// training step; here each row (a few KB) is read once per pass while it is in L1, and
// the exponentials are MKL's vector math.

// MKL's vector exp: its low-accuracy mode (a few ulps), denormals kept, no error reporting.
constexpr MKL_INT64 kExpMode = VML_LA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE;

float RowMax(const float* z, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, z[j]);
  return m;
}

// e = exp(z - max) into `e`, z = x * inv_t. Returns (max, sum e, sum e z).
struct RowSums {
  float max, sum, sum_ez;
};

// z is x itself when inv_t is 1 (no copy), else x * inv_t written to `scaled`.
RowSums ExpRow(const float* x, float inv_t, int64_t n, float* scaled, float* e, const float** z_out) {
  const float* z = x;
  if (inv_t != 1.0f) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) scaled[j] = x[j] * inv_t;
    z = scaled;
  }
  *z_out = z;
  const float m = RowMax(z, n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) e[j] = z[j] - m;
  vmsExp(static_cast<MKL_INT>(n), e, e, kExpMode);
  float sum = 0.0f, sum_ez = 0.0f;
#pragma omp simd reduction(+ : sum, sum_ez)
  for (int64_t j = 0; j < n; ++j) {
    sum += e[j];
    sum_ez += e[j] * z[j];
  }
  return {m, sum, sum_ez};
}

ffi::Error TokenLogprobsFwd(ffi::Buffer<ffi::DataType::F32> x, ffi::Buffer<ffi::DataType::S32> tokens,
                            ffi::Result<ffi::Buffer<ffi::DataType::F32>> logp,
                            ffi::Result<ffi::Buffer<ffi::DataType::F32>> entropy,
                            ffi::Result<ffi::Buffer<ffi::DataType::F32>> lse,
                            ffi::Result<ffi::Buffer<ffi::DataType::F32>> mean_z, float inv_t) {
  const auto d = x.dimensions();
  const int64_t V = d.back(), R = static_cast<int64_t>(x.element_count()) / std::max<int64_t>(V, 1);
  static thread_local std::vector<float> z, e;
  z.resize(V);
  e.resize(V);
  for (int64_t r = 0; r < R; ++r) {
    const float* zr;
    const RowSums s = ExpRow(x.typed_data() + r * V, inv_t, V, z.data(), e.data(), &zr);
    const float l = s.max + std::log(s.sum), ez = s.sum_ez / s.sum;
    const int32_t t = tokens.typed_data()[r];
    const float chosen = (t >= 0 && t < V) ? zr[t] : std::numeric_limits<float>::quiet_NaN();
    logp->typed_data()[r] = chosen - l;
    entropy->typed_data()[r] = l - ez;
    lse->typed_data()[r] = l;
    mean_z->typed_data()[r] = ez;
  }
  return ffi::Error::Success();
}

ffi::Error TokenLogprobsBwd(ffi::Buffer<ffi::DataType::F32> x, ffi::Buffer<ffi::DataType::S32> tokens,
                            ffi::Buffer<ffi::DataType::F32> lse, ffi::Buffer<ffi::DataType::F32> mean_z,
                            ffi::Buffer<ffi::DataType::F32> g_logp, ffi::Buffer<ffi::DataType::F32> g_ent,
                            ffi::Result<ffi::Buffer<ffi::DataType::F32>> dx, float inv_t) {
  const auto d = x.dimensions();
  const int64_t V = d.back(), R = static_cast<int64_t>(x.element_count()) / std::max<int64_t>(V, 1);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.typed_data() + r * V;
    float* out = dx->typed_data() + r * V;
    const float l = lse.typed_data()[r], ez = mean_z.typed_data()[r];
    const float gl = g_logp.typed_data()[r], ge = g_ent.typed_data()[r];
    // p = exp(z - lse), computed in `out`, then overwritten by the gradient.
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) out[j] = xr[j] * inv_t - l;
    vmsExp(static_cast<MKL_INT>(V), out, out, kExpMode);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) out[j] = -out[j] * (gl + ge * (xr[j] * inv_t - ez)) * inv_t;
    const int32_t t = tokens.typed_data()[r];
    if (t >= 0 && t < V) out[t] += gl * inv_t;
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- SwiGLU
//
// h = silu(g) u = g sigmoid(g) u, and its backward pass
//   dg = dh u (s + g s (1 - s)),  du = dh g s,  s = sigmoid(g),
// a block of elements at a time in cache, the exponentials through MKL's vector math:
// XLA's CPU code ran the sigmoid as its own pass over the [tokens, intermediate] array.

constexpr int64_t kSwigluBlock = 4096;
// exp(-g) for g below -kSigmoidClamp overflows float32: clamped (the sigmoid is then
// below 1e-38, against the exact value's still smaller one), which also keeps MKL's
// vector exp off its slow path for out-of-range arguments.
constexpr float kSigmoidClamp = 87.0f;

// s = sigmoid(g[0:n]) into `s`.
void Sigmoid(const float* g, int64_t n, float* s) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = std::min(-g[j], kSigmoidClamp);
  vmsExp(static_cast<MKL_INT>(n), s, s, kExpMode);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) s[j] = 1.0f / (1.0f + s[j]);
}

ffi::Error SwigluFwd(ffi::Buffer<ffi::DataType::F32> gate, ffi::Buffer<ffi::DataType::F32> up,
                     ffi::Result<ffi::Buffer<ffi::DataType::F32>> h) {
  const int64_t n = static_cast<int64_t>(gate.element_count());
  static thread_local std::vector<float> s;
  s.resize(kSwigluBlock);
  for (int64_t i0 = 0; i0 < n; i0 += kSwigluBlock) {
    const int64_t m = std::min(kSwigluBlock, n - i0);
    const float *g = gate.typed_data() + i0, *u = up.typed_data() + i0;
    float* out = h->typed_data() + i0;
    Sigmoid(g, m, s.data());
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) out[j] = g[j] * s[j] * u[j];
  }
  return ffi::Error::Success();
}

ffi::Error SwigluBwd(ffi::Buffer<ffi::DataType::F32> gate, ffi::Buffer<ffi::DataType::F32> up,
                     ffi::Buffer<ffi::DataType::F32> dh, ffi::Result<ffi::Buffer<ffi::DataType::F32>> dgate,
                     ffi::Result<ffi::Buffer<ffi::DataType::F32>> dup) {
  const int64_t n = static_cast<int64_t>(gate.element_count());
  static thread_local std::vector<float> s;
  s.resize(kSwigluBlock);
  for (int64_t i0 = 0; i0 < n; i0 += kSwigluBlock) {
    const int64_t m = std::min(kSwigluBlock, n - i0);
    const float *g = gate.typed_data() + i0, *u = up.typed_data() + i0, *d = dh.typed_data() + i0;
    float *dg = dgate->typed_data() + i0, *du = dup->typed_data() + i0;
    Sigmoid(g, m, s.data());
#pragma omp simd
    for (int64_t j = 0; j < m; ++j) {
      const float silu = g[j] * s[j];
      dg[j] = d[j] * u[j] * (s[j] + silu * (1.0f - s[j]));
      du[j] = d[j] * silu;
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SwigluForward, SwigluFwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SwigluBackward, SwigluBwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TokenLogprobsForward, TokenLogprobsFwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Attr<float>("inv_t"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TokenLogprobsBackward, TokenLogprobsBwd,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Attr<float>("inv_t"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RoundBf16, RoundArray,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::DataType::F32>>().Ret<ffi::Buffer<ffi::DataType::BF16>>());

#define RLINF_MKL_HANDLER(name, Elem)                                                              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, (Products<Elem>), ffi::Ffi::Bind()                           \
                                                            .Arg<ffi::AnyBuffer>()                 \
                                                            .Arg<ffi::AnyBuffer>()                 \
                                                            .Ret<ffi::AnyBuffer>()                 \
                                                            .Attr<bool>("trans_a")                 \
                                                            .Attr<bool>("trans_b"));

RLINF_MKL_HANDLER(MklGemmF32, float)
RLINF_MKL_HANDLER(MklGemmBf16, uint16_t)
