// Device code for anybind: launchers of ab.GPU_SIGNATURE, compiled ahead of time.
//
//   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC cube.cu -o libcube.so
//
// Each launcher gets XLA's stream and XLA's device buffers, queues its kernel on
// that stream and returns 0 (or non-zero with a message in err); it never
// synchronises the device. Shapes, ranks and dtypes are host memory.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

namespace {

constexpr int32_t F32 = 11, F64 = 12;  // ab.dtype_code(np.float32), ab.dtype_code(np.float64)

int64_t count(const int64_t *shape, int64_t rank) {
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

template <typename T>
__global__ void cube_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) {
    T v = x[i];
    y[i] = v * v * v;
  }
}

// 3 x² · t: the jvp (t = ẋ) and the vjp (t = ȳ) of x³ alike.
template <typename T>
__global__ void dcube_kernel(const T *__restrict__ x, const T *__restrict__ t,
                             T *__restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = T(3) * x[i] * x[i] * t[i];
}

int32_t launched(char *err, int64_t err_size) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  snprintf(err, static_cast<size_t>(err_size), "CUDA: %s", cudaGetErrorString(e));
  return 2;
}

int32_t wrong_dtype(int32_t dtype, char *err, int64_t err_size) {
  snprintf(err, static_cast<size_t>(err_size),
           "float32 or float64 only (dtype codes 11, 12), got dtype code %d", dtype);
  return 1;
}

}  // namespace

extern "C" {

// y = x³
int32_t cube(void *stream, void *const *ins, void *const *outs, const int64_t *const *shapes,
             const int64_t *ranks, const int32_t *dtypes, int64_t n_in, int64_t n_out,
             char *err, int64_t err_size) {
  int64_t n = count(shapes[0], ranks[0]);
  if (n == 0) return 0;
  unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtypes[0] == F32)
    cube_kernel<<<blocks, 256, 0, s>>>(static_cast<const float *>(ins[0]),
                                       static_cast<float *>(outs[0]), n);
  else if (dtypes[0] == F64)
    cube_kernel<<<blocks, 256, 0, s>>>(static_cast<const double *>(ins[0]),
                                       static_cast<double *>(outs[0]), n);
  else
    return wrong_dtype(dtypes[0], err, err_size);
  return launched(err, err_size);
}

// The jvp rule (ins: x, ẋ; out: ẏ) and the vjp rule (ins: x, ȳ; out: x̄) of x³.
int32_t cube_jvp(void *stream, void *const *ins, void *const *outs,
                 const int64_t *const *shapes, const int64_t *ranks, const int32_t *dtypes,
                 int64_t n_in, int64_t n_out, char *err, int64_t err_size) {
  int64_t n = count(shapes[2], ranks[2]);  // the output's: a tangent may be broadcast
  if (n == 0) return 0;
  if (count(shapes[0], ranks[0]) != n || count(shapes[1], ranks[1]) != n) {
    snprintf(err, static_cast<size_t>(err_size), "operands of different sizes");
    return 3;
  }
  unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  auto s = static_cast<cudaStream_t>(stream);
  if (dtypes[0] == F32)
    dcube_kernel<<<blocks, 256, 0, s>>>(static_cast<const float *>(ins[0]),
                                        static_cast<const float *>(ins[1]),
                                        static_cast<float *>(outs[0]), n);
  else if (dtypes[0] == F64)
    dcube_kernel<<<blocks, 256, 0, s>>>(static_cast<const double *>(ins[0]),
                                        static_cast<const double *>(ins[1]),
                                        static_cast<double *>(outs[0]), n);
  else
    return wrong_dtype(dtypes[0], err, err_size);
  return launched(err, err_size);
}

// Always fails: how a launcher's error reaches the caller.
int32_t refuses(void *stream, void *const *ins, void *const *outs,
                const int64_t *const *shapes, const int64_t *ranks, const int32_t *dtypes,
                int64_t n_in, int64_t n_out, char *err, int64_t err_size) {
  snprintf(err, static_cast<size_t>(err_size), "refused %lld inputs",
           static_cast<long long>(n_in));
  return 7;
}

}  // extern "C"
