/*************************************************************************
 * cuco_coll_copy.cuh: the element helpers and the copy loops every collective kernel is made of (host-callable
 * too: tests/test_collectives_host.py runs them on the CPU).
 *
 * A part of cuco_collectives.cuh, which includes it after its knobs and the parts before it; never included
 * on its own.
 *************************************************************************/
#ifndef CUCO_COLL_COPY_CUH_
#define CUCO_COLL_COPY_CUH_

#ifndef CUCO_COLLECTIVES_CUH_
#error "include cuco_collectives.cuh, not its parts"
#endif

namespace cuco {

// A line said once a process at a call site (`said`: that site's own flag): a fallback that changes no result, so
// that a test can tell a program that ran as designed from one that fell back.
inline void sayOnce(bool* said, const char* line) {
  if (*said) return;
  *said = true;
  fprintf(stderr, "%s\n", line);
}

// Element helpers and the copy and reduction loops are __host__ too: tests/test_collectives_host.py runs
// them on the CPU, one emulated thread after another, to check every alignment and tail path.
__host__ __device__ inline float toFloat(float v) { return v; }
__host__ __device__ inline float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ inline float toFloat(__half v) { return __half2float(v); }
template <typename T> __host__ __device__ inline T fromFloat(float v);
template <> __host__ __device__ inline float fromFloat<float>(float v) { return v; }
template <> __host__ __device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __host__ __device__ inline __half fromFloat<__half>(float v) { return __float2half(v); }

// This thread's index in the grid, and the grid's size.
__device__ inline size_t gridThread() { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ inline size_t gridThreads() { return (size_t)gridDim.x * blockDim.x; }

// n bytes from src[d] to dst[d] for every pair d < nPairs, in accesses of V, by thread `tid` of `nThreads`.
// The pairs advance together, so the local copy of an all-gather or all-to-all runs beside the remote ones
// instead of after them; pairs that share a source (an all-gather) load it once. Every dst[d] and src[d] is
// aligned like dst[0] modulo sizeof(V): bytes up to dst[0]'s first V boundary, then V words with
// CUCO_COLL_UNROLL loads in flight before their stores, then the tail.
template <typename V>
__host__ __device__ inline void copyAs(char* const* dst, const char* const* src, int nPairs, size_t n, size_t tid,
                                       size_t nThreads) {
  size_t head = (sizeof(V) - (uintptr_t)dst[0] % sizeof(V)) % sizeof(V);
  if (head > n) head = n;
  for (size_t i = tid; i < head; i += nThreads)
    for (int d = 0; d < nPairs; d++) dst[d][i] = src[d][i];
  const size_t nVec = (n - head) / sizeof(V);
  for (size_t base = tid; base < nVec; base += nThreads * CUCO_COLL_UNROLL) {
    V v[CUCO_COLL_UNROLL];
    for (int d = 0; d < nPairs; d++) {
      if (d == 0 || src[d] != src[d - 1]) {
        const V* in = (const V*)(src[d] + head);
#pragma unroll
        for (int u = 0; u < CUCO_COLL_UNROLL; u++)
          if (base + u * nThreads < nVec) v[u] = in[base + u * nThreads];
      }
      V* out = (V*)(dst[d] + head);
#pragma unroll
      for (int u = 0; u < CUCO_COLL_UNROLL; u++)
        if (base + u * nThreads < nVec) out[base + u * nThreads] = v[u];
    }
  }
  for (size_t i = head + nVec * sizeof(V) + tid; i < n; i += nThreads)
    for (int d = 0; d < nPairs; d++) dst[d][i] = src[d][i];
}

// The same with the widest access (16 bytes down to 1) that every pointer can share.
__host__ __device__ inline void copyBytes(char* const* dst, const char* const* src, int nPairs, size_t n, size_t tid,
                                          size_t nThreads) {
  uintptr_t rel = 0;  // low bits set where two of the pointers disagree
  for (int d = 0; d < nPairs; d++) rel |= ((uintptr_t)dst[d] - (uintptr_t)src[d]) | ((uintptr_t)dst[d] - (uintptr_t)dst[0]);
  if (rel % 16 == 0) copyAs<uint4>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 8 == 0) copyAs<uint2>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 4 == 0) copyAs<uint32_t>(dst, src, nPairs, n, tid, nThreads);
  else if (rel % 2 == 0) copyAs<uint16_t>(dst, src, nPairs, n, tid, nThreads);
  else copyAs<char>(dst, src, nPairs, n, tid, nThreads);
}

// The grid's part of a copy: every thread of the grid strides over the n bytes, or, under CUCO_COLL_ISSUER_WARP,
// each warp copies a contiguous slice (a multiple of 16 bytes, so every slice keeps the pointers' alignment).
__device__ inline void issueCopy(char* const* dst, const char* const* src, int nPairs, size_t n) {
#if defined(CUCO_COLL_ISSUER_WARP)
  constexpr size_t kWarp = 32;
  const size_t warps = gridThreads() / kWarp, w = gridThread() / kWarp;
  const size_t per = ((n + warps - 1) / warps + 15) / 16 * 16;
  const size_t b = per * w < n ? per * w : n, e = b + per < n ? b + per : n;
  if (b >= e) return;
  char* to[CUCO_COLL_MAX_RANKS];
  const char* from[CUCO_COLL_MAX_RANKS];
  for (int d = 0; d < nPairs; d++) to[d] = dst[d] + b, from[d] = src[d] + b;
  copyBytes(to, from, nPairs, e - b, threadIdx.x % kWarp, kWarp);
#else
  copyBytes(dst, src, nPairs, n, gridThread(), gridThreads());
#endif
}

// One pair, by the grid (issueCopy).
__device__ inline void copyBytes(char* dst, const char* src, size_t n) { issueCopy(&dst, &src, 1, n); }

// One worker's piece of an all-gather that its caller cuts itself: bytes [lo, hi) of `src` are split evenly among
// `nWorkers` workers (a CTA each, or a warp each...), and worker `w` stores its part at the same offsets of every
// dst[d], d < nDst (nDst <= CUCO_COLL_MAX_RANKS), with its `workerThreads` threads, this one `t`. Each worker's
// part is contiguous, so it can signal that part alone once its threads are done.
__host__ __device__ inline void pushSlice(char* const* dst, int nDst, const char* src, size_t lo, size_t hi, size_t w,
                                          size_t nWorkers, size_t t, size_t workerThreads) {
  const size_t per = (hi - lo + nWorkers - 1) / nWorkers;
  const size_t b = lo + per * w, e = b + per < hi ? b + per : hi;
  if (b >= e) return;
  char* to[CUCO_COLL_MAX_RANKS];
  const char* from[CUCO_COLL_MAX_RANKS];
  for (int d = 0; d < nDst; d++) to[d] = dst[d] + b, from[d] = src + b;
  copyBytes(to, from, nDst, e - b, t, workerThreads);
}

}  // namespace cuco

#endif  // CUCO_COLL_COPY_CUH_
