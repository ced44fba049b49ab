#include "cpu/kernels/sgemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

#include "graphfuse/status.h"

extern "C" void omp_set_num_threads(int);  // libgomp, oneDNN's threading runtime here
extern "C" int omp_get_max_threads(void);

namespace graphfuse::kernels {

OneOmpThread::OneOmpThread() : previous_(omp_get_max_threads()) { omp_set_num_threads(1); }
OneOmpThread::~OneOmpThread() { omp_set_num_threads(previous_); }

void Sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  const OneOmpThread one_thread;
  // oneDNN checks the leading dimensions against the operands' widths even where a dimension is
  // empty: at least 1, as BLAS asks.
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, std::max<int64_t>(lda, 1), b,
                                      std::max<int64_t>(ldb, 1), beta, c, std::max<int64_t>(ldc, 1));
  GF_CHECK(st == dnnl_success, "oneDNN sgemm ", m, "x", n, "x", k, " (lda ", lda, ", ldb ", ldb, ", ldc ", ldc,
           ") failed: status ", static_cast<int>(st));
}

}  // namespace graphfuse::kernels
