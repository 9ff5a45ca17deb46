// Matrix products through Intel MKL, as XLA CPU custom calls (jax.ffi).
//
// Compiled on first use by rlinf_jax/kernels/mkl.py (actor.model.matmul=mkl). Row-major,
// float32 out; the handlers MklGemmF32 / MklGemmBf16 take
//   2-D operands:  y[M, N]    = op(a) @ op(b)
//   3-D operands:  y[L, M, N] = op(a[l]) @ op(b[l])   (one product per leading index)
// op() transposes when the attribute trans_a / trans_b is set. MKL reads a transposed
// operand in place, which is why the backward products need no copies. The bfloat16
// variant calls cblas_gemm_bf16bf16f32, which runs on the CPU's AMX tiles where it has them
// (XLA's own CPU bfloat16 products do not).
#include <algorithm>
#include <cstdint>

#include "mkl_cblas.h"
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

template <ffi::DataType T, typename Elem>
ffi::Error Products(ffi::Buffer<T> a, ffi::Buffer<T> b, ffi::Result<ffi::Buffer<ffi::F32>> y, bool trans_a,
                    bool trans_b) {
  const Operand A = Shape(a, trans_a), B = Shape(b, trans_b);
  if (A.cols != B.rows || A.batch != B.batch) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "mkl gemm: operand shapes do not chain");
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const Elem* pa = reinterpret_cast<const Elem*>(a.untyped_data());
  const Elem* pb = reinterpret_cast<const Elem*>(b.untyped_data());
  float* py = y->typed_data();
  const int64_t M = A.rows, K = A.cols, N = B.cols;
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {  // an empty contraction: MKL's leading-dimension checks would reject it
    std::fill(py, py + A.batch * M * N, 0.0f);
    return ffi::Error::Success();
  }
  for (int64_t l = 0; l < A.batch; ++l) {
    Gemm(ta, tb, M, N, K, pa + l * M * K, A.ld, pb + l * K * N, B.ld, py + l * M * N);
  }
  return ffi::Error::Success();
}

}  // namespace

#define RLINF_MKL_HANDLER(name, T, Elem)                                                           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, (Products<T, Elem>), ffi::Ffi::Bind()                        \
                                                               .Arg<ffi::Buffer<T>>()              \
                                                               .Arg<ffi::Buffer<T>>()              \
                                                               .Ret<ffi::Buffer<ffi::F32>>()       \
                                                               .Attr<bool>("trans_a")              \
                                                               .Attr<bool>("trans_b"));

RLINF_MKL_HANDLER(MklGemmF32, ffi::DataType::F32, float)
RLINF_MKL_HANDLER(MklGemmBf16, ffi::DataType::BF16, uint16_t)
