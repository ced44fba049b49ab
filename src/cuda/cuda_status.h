// CUDA runtime and cuBLAS results as Status, and the macros that return them on failure.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "graphfuse/status.h"

namespace graphfuse::cuda {

// Ok, or Internal("<what>: <error name> (<error string>)").
inline Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// Ok, or Internal("<what>: cuBLAS <status name> (<status string>)").
inline Status BlasStatus(cublasStatus_t s, const std::string& what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(what, ": cuBLAS ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}

}  // namespace graphfuse::cuda

#define GF_CUDA(expr, what) GF_RETURN_IF_ERROR(::graphfuse::cuda::CudaStatus((expr), (what)))
#define GF_BLAS(expr, what) GF_RETURN_IF_ERROR(::graphfuse::cuda::BlasStatus((expr), (what)))
