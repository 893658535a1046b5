// EAGLE-3 draft head: draft-vocabulary argmax / top-k mapped through d2t to target ids.
//
// The drafter's lm_head gives logits over the draft vocabulary ([T, V], V = 32000 for the
// Kimi drafters). Upstream scatters them into a target-vocabulary tensor of -inf (163840
// wide for Kimi) and takes the argmax there. These kernels read the draft logits once and
// write the target ids directly: target_id = draft_id + d2t[draft_id].
//
// One block per token row; 16-byte vector loads; per-thread running best, then warp
// shuffles and one shared-memory round per block. Ties go to the lowest index and NaN
// ranks above every number (first NaN wins), exactly as torch.argmax.
//
// C ABI (no torch headers, no libtorch link): the Python side passes raw device pointers
// and the current CUDA stream. Build: see kimi/kernels/build.py.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#define KIMI_API extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kAbiVersion = 1;
constexpr int kMaxWarps = 32;     // blockDim.x <= 1024
constexpr int kLoadBatch = 4;     // 16-byte loads in flight per thread per step
constexpr int kMaxTopkThreads = 512;  // leaves 128 registers a thread for the K = 16 lists
constexpr int kMaxK = 16;

enum Dtype : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Argument errors (negative, so they never collide with cudaError_t values).
enum ArgError : int {
  kBadDtype = -1,
  kBadShape = -2,
  kBadThreads = -3,
  kBadK = -4,
  kNullPointer = -5,
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// (a, ia) ranks before (b, ib): NaN first (lowest index among NaNs), then the larger value,
// then the lower index. A strict total order on pairs with distinct indices.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return a > b || (a == b && ia < ib);
}

// Calls f(value, index) for every element of the row this thread owns. A thread sees its
// indices in increasing order: the scalar head (up to 16-byte alignment), then the vector
// body, then the scalar tail.
template <typename T, typename F>
__device__ __forceinline__ void for_each_owned(const T* __restrict__ row, int vocab, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const auto misalign = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
  int head = misalign ? (16 - misalign) / static_cast<int>(sizeof(T)) : 0;
  head = head < vocab ? head : vocab;
  for (int j = tid; j < head; j += nthreads) f(to_float(row[j]), j);

  const int nvec = (vocab - head) / kVec;
  const uint4* __restrict__ body = reinterpret_cast<const uint4*>(row + head);
  for (int base = tid; base < nvec; base += kLoadBatch * nthreads) {
    uint4 raw[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int v = base + u * nthreads;
      if (v < nvec) raw[u] = __ldg(body + v);
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int v = base + u * nthreads;
      if (v < nvec) {
        const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
        for (int q = 0; q < kVec; ++q) f(to_float(e[q]), head + v * kVec + q);
      }
    }
  }
  for (int j = head + nvec * kVec + tid; j < vocab; j += nthreads) f(to_float(row[j]), j);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
    if (ranks_before(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Block-wide best pair; every thread returns with the result. Two barriers, so it can be
// called repeatedly (the top-k rounds) with the same shared buffers.
__device__ __forceinline__ void block_argmax(float& v, int& i) {
  __shared__ float warp_v[kMaxWarps];
  __shared__ int warp_i[kMaxWarps];
  __shared__ float best_v;
  __shared__ int best_i;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  warp_argmax(v, i);
  if (lane == 0) {
    warp_v[warp] = v;
    warp_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? warp_v[lane] : -INFINITY;
    i = lane < nwarps ? warp_i[lane] : INT_MAX;
    warp_argmax(v, i);
    if (lane == 0) {
      best_v = v;
      best_i = i;
    }
  }
  __syncthreads();
  v = best_v;
  i = best_i;
}

// Online softmax statistics in base 2: m is the largest non-NaN raw logit seen, s the sum of
// 2^((x - m) * c) with c = log2(e) / temperature.
__device__ __forceinline__ void softmax_merge(float& m, float& s, float om, float os, float c) {
  const float nm = fmaxf(m, om);
  if (nm == -INFINITY) return;  // both empty (or all -inf so far): s stays 0
  const float a = m == -INFINITY ? 0.f : s * exp2f((m - nm) * c);
  const float b = om == -INFINITY ? 0.f : os * exp2f((om - nm) * c);
  m = nm;
  s = a + b;
}

__device__ __forceinline__ void block_softmax_stats(float& m, float& s, float c) {
  __shared__ float warp_m[kMaxWarps];
  __shared__ float warp_s[kMaxWarps];
  __shared__ float total_m, total_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, offset);
    const float os = __shfl_xor_sync(0xffffffffu, s, offset);
    softmax_merge(m, s, om, os, c);
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? warp_m[lane] : -INFINITY;
    s = lane < nwarps ? warp_s[lane] : 0.f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, m, offset);
      const float os = __shfl_xor_sync(0xffffffffu, s, offset);
      softmax_merge(m, s, om, os, c);
    }
    if (lane == 0) {
      total_m = m;
      total_s = s;
    }
  }
  __syncthreads();
  m = total_m;
  s = total_s;
}

// The first index this thread visits in for_each_owned (INT_MAX when it owns none).
template <typename T>
__device__ __forceinline__ int first_owned(const T* row, int vocab) {
  constexpr int kVec = 16 / sizeof(T);
  const int tid = threadIdx.x;
  const auto misalign = static_cast<int>(reinterpret_cast<uintptr_t>(row) & 15);
  int head = misalign ? (16 - misalign) / static_cast<int>(sizeof(T)) : 0;
  head = head < vocab ? head : vocab;
  if (tid < head) return tid;
  const int nvec = (vocab - head) / kVec;
  if (tid < nvec) return head + tid * kVec;
  const int tail = head + nvec * kVec + tid;
  return tail < vocab ? tail : INT_MAX;
}

template <typename T>
__global__ void __launch_bounds__(1024)
    draft_argmax_kernel(const T* __restrict__ logits, int64_t row_stride, int vocab, const int64_t* __restrict__ d2t,
                        int64_t* __restrict__ target_ids, int64_t* __restrict__ draft_ids) {
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * row_stride;
  // A thread's indices increase, so a strict "greater" keeps the first of equal values;
  // !(x <= best) is also true for a NaN x, and nothing replaces a NaN best.
  float best = -INFINITY;
  int best_i = INT_MAX;
  for_each_owned(row, vocab, [&](float x, int j) {
    if (!(x <= best) && !isnan(best)) {
      best = x;
      best_i = j;
    }
  });
  if (best_i == INT_MAX) best_i = first_owned(row, vocab);  // every owned value is -inf
  block_argmax(best, best_i);
  if (threadIdx.x == 0) {
    const int64_t id = best_i;
    if (draft_ids != nullptr) draft_ids[blockIdx.x] = id;
    target_ids[blockIdx.x] = d2t != nullptr ? id + d2t[id] : id;
  }
}

// Arguments of one top-k launch (passed by value to the kernel).
struct TopkArgs {
  const void* logits;
  int64_t row_stride;
  int vocab;
  const int64_t* d2t;
  const float* inv_temperature;  // per row, or null: inv_temperature_scalar
  float inv_temperature_scalar;
  int k;
  float* probs;
  int64_t* target_ids;
  int64_t* draft_ids;  // may be null
};

// Top-k over the draft vocabulary with the softmax probabilities (fp32) of the chosen
// entries. Each thread keeps its own best K (sorted, in registers: K is a compile-time
// constant and every index into the arrays is static after unrolling), the block merges
// them in k rounds of block_argmax. Selection uses the raw logits, so the temperature
// cannot reorder entries; probabilities use (x - max) / temperature.
template <typename T, int K>
__global__ void __launch_bounds__(kMaxTopkThreads) draft_topk_kernel(const TopkArgs a) {
  const T* row = static_cast<const T*>(a.logits) + static_cast<int64_t>(blockIdx.x) * a.row_stride;
  const int vocab = a.vocab;
  const float inv_t = a.inv_temperature != nullptr ? a.inv_temperature[blockIdx.x] : a.inv_temperature_scalar;
  const float c = 1.4426950408889634f * inv_t;  // log2(e) / temperature
  float top_v[K];
  int top_i[K];
#pragma unroll
  for (int r = 0; r < K; ++r) {
    top_v[r] = -INFINITY;
    top_i[r] = INT_MAX;
  }
  float m = -INFINITY, s = 0.f;
  for_each_owned(row, vocab, [&](float x, int j) {
    if (x > m) {
      s = (m == -INFINITY ? 0.f : s * exp2f((m - x) * c)) + 1.f;
      m = x;
    } else if (x != -INFINITY) {
      s += exp2f((x - m) * c);  // a NaN x makes s NaN, as in torch.softmax
    }
    if (ranks_before(x, j, top_v[K - 1], top_i[K - 1])) {
#pragma unroll
      for (int r = 0; r < K; ++r) {
        if (ranks_before(x, j, top_v[r], top_i[r])) {
          const float tv = top_v[r];
          const int ti = top_i[r];
          top_v[r] = x;
          top_i[r] = j;
          x = tv;
          j = ti;
        }
      }
    }
  });
  block_softmax_stats(m, s, c);
  const float inv_s = 1.f / s;
  for (int r = 0; r < a.k; ++r) {
    float v = top_v[0];
    int i = top_i[0];
    block_argmax(v, i);
    if (top_i[0] == i) {  // this thread held the winner: drop it from the head
#pragma unroll
      for (int q = 0; q + 1 < K; ++q) {
        top_v[q] = top_v[q + 1];
        top_i[q] = top_i[q + 1];
      }
      top_v[K - 1] = -INFINITY;
      top_i[K - 1] = INT_MAX;
    }
    if (threadIdx.x == 0) {
      const int64_t out = static_cast<int64_t>(blockIdx.x) * a.k + r;
      const int64_t id = i;
      a.probs[out] = exp2f((v - m) * c) * inv_s;
      if (a.draft_ids != nullptr) a.draft_ids[out] = id;
      a.target_ids[out] = a.d2t != nullptr ? id + a.d2t[id] : id;
    }
  }
}

int check_common(const void* logits, int dtype, int64_t rows, int64_t vocab, int64_t row_stride, int threads,
                 const void* out) {
  if (dtype != kFloat32 && dtype != kFloat16 && dtype != kBFloat16) return kBadDtype;
  if (rows < 0 || rows > INT_MAX || vocab <= 0 || vocab > INT_MAX / 2 || row_stride < vocab) return kBadShape;
  if (threads != 0 && (threads < 32 || threads > 1024 || threads % 32 != 0)) return kBadThreads;
  if (rows > 0 && (logits == nullptr || out == nullptr)) return kNullPointer;
  return 0;
}

int auto_threads(int64_t rows) { return rows <= 256 ? 1024 : 512; }

template <typename T>
void launch_argmax(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride, const int64_t* d2t,
                   int64_t* target_ids, int64_t* draft_ids, int threads, cudaStream_t stream) {
  draft_argmax_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      static_cast<const T*>(logits), row_stride, static_cast<int>(vocab), d2t, target_ids, draft_ids);
}

template <typename T>
void launch_topk(const TopkArgs& a, int64_t rows, int threads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(rows));
  if (a.k <= 1) {
    draft_topk_kernel<T, 1><<<grid, threads, 0, stream>>>(a);
  } else if (a.k <= 2) {
    draft_topk_kernel<T, 2><<<grid, threads, 0, stream>>>(a);
  } else if (a.k <= 4) {
    draft_topk_kernel<T, 4><<<grid, threads, 0, stream>>>(a);
  } else if (a.k <= 8) {
    draft_topk_kernel<T, 8><<<grid, threads, 0, stream>>>(a);
  } else {
    draft_topk_kernel<T, 16><<<grid, threads, 0, stream>>>(a);
  }
}

}  // namespace

// Version of this C interface; the Python wrapper refuses a library with another one.
KIMI_API int kimi_draft_head_abi_version() { return kAbiVersion; }

// Largest k kimi_draft_topk accepts.
KIMI_API int kimi_draft_head_max_k() { return kMaxK; }

// 0 when the kernels have an image for the current device, else the CUDA error
// (cudaErrorNoKernelImageForDevice on a GPU the library was not built for).
KIMI_API int kimi_draft_head_probe() {
  cudaFuncAttributes attr;
  return static_cast<int>(cudaFuncGetAttributes(&attr, draft_argmax_kernel<__nv_bfloat16>));
}

// Text for a return code of the functions below.
KIMI_API const char* kimi_draft_head_error_string(int code) {
  switch (code) {
    case 0: return "no error";
    case kBadDtype: return "logits dtype must be float32 (0), float16 (1) or bfloat16 (2)";
    case kBadShape: return "bad shape: need 0 <= rows <= INT_MAX, 0 < vocab <= INT_MAX/2, row_stride >= vocab";
    case kBadThreads: return "threads must be 0 (auto) or a multiple of 32 in [32, 1024] ([32, 512] for top-k)";
    case kBadK: return "k must be in [1, min(vocab, 16)]";
    case kNullPointer: return "a required pointer is null";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

// target_ids[t] = a + d2t[a] with a = argmax(logits[t, :vocab]) (torch.argmax's tie and NaN
// rules); draft_ids[t] = a when draft_ids is not null; d2t null means target = draft id.
// logits: device pointer to rows x vocab values of `dtype`, row t at logits + t * row_stride
// elements. All pointers on the current device; the launch is asynchronous on `stream`.
// Returns 0, an ArgError (< 0) or the cudaError_t of the launch (> 0).
KIMI_API int kimi_draft_argmax(const void* logits, int dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                               const int64_t* d2t, int64_t* target_ids, int64_t* draft_ids, int threads,
                               void* stream) {
  const int err = check_common(logits, dtype, rows, vocab, row_stride, threads, target_ids);
  if (err != 0) return err;
  if (rows == 0) return 0;
  if (threads == 0) threads = auto_threads(rows);
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kFloat32:
      launch_argmax<float>(logits, rows, vocab, row_stride, d2t, target_ids, draft_ids, threads, s);
      break;
    case kFloat16:
      launch_argmax<__half>(logits, rows, vocab, row_stride, d2t, target_ids, draft_ids, threads, s);
      break;
    default:
      launch_argmax<__nv_bfloat16>(logits, rows, vocab, row_stride, d2t, target_ids, draft_ids, threads, s);
  }
  return static_cast<int>(cudaGetLastError());
}

// The k largest draft logits of each row, in order (value descending, then index ascending;
// NaN first), as softmax probabilities over the whole draft vocabulary in fp32 with
// temperature 1 / inv_temperature[t] (null: 1 / inv_temperature_scalar), mapped through d2t
// like kimi_draft_argmax. probs, target_ids and draft_ids (optional) are rows x k,
// row-major. 1 <= k <= 16 and k <= vocab; threads 0 (auto: 512) or at most 512.
KIMI_API int kimi_draft_topk(const void* logits, int dtype, int64_t rows, int64_t vocab, int64_t row_stride,
                             const int64_t* d2t, const float* inv_temperature, float inv_temperature_scalar, int k,
                             float* probs, int64_t* target_ids, int64_t* draft_ids, int threads, void* stream) {
  const int err = check_common(logits, dtype, rows, vocab, row_stride, threads, target_ids);
  if (err != 0) return err;
  if (k < 1 || k > kMaxK || k > vocab) return kBadK;
  if (threads > kMaxTopkThreads) return kBadThreads;
  if (rows > 0 && probs == nullptr) return kNullPointer;
  if (rows == 0) return 0;
  if (threads == 0) threads = kMaxTopkThreads;
  const TopkArgs a{logits, row_stride, static_cast<int>(vocab), d2t, inv_temperature, inv_temperature_scalar,
                   k, probs, target_ids, draft_ids};
  auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case kFloat32: launch_topk<float>(a, rows, threads, s); break;
    case kFloat16: launch_topk<__half>(a, rows, threads, s); break;
    default: launch_topk<__nv_bfloat16>(a, rows, threads, s);
  }
  return static_cast<int>(cudaGetLastError());
}
