// The copy and reduction loops of cuco_collectives.cuh on the host: each entry point runs the loop once per
// emulated thread, tid = 0 .. nThreads-1, which is what the grid does (no thread reads what another writes).
#include "cuco.h"
#include "cuco_collectives.cuh"

CUCO_EXPORT int cuco_test_copy(char* const* dst, const char* const* src, int nPairs, size_t n, size_t nThreads) {
  for (size_t t = 0; t < nThreads; t++) cuco::copyBytes(dst, src, nPairs, n, t, nThreads);
  return 0;
}

template <typename T>
static int reduce(void* const* in, int nIn, void* const* out, int nOut, size_t lo, size_t hi, size_t nThreads) {
  const T* ins[CUCO_COLL_MAX_RANKS];
  T* outs[CUCO_COLL_MAX_RANKS];
  if (nIn > CUCO_COLL_MAX_RANKS || nOut > CUCO_COLL_MAX_RANKS) return 1;
  for (int p = 0; p < nIn; p++) ins[p] = (const T*)in[p];
  for (int o = 0; o < nOut; o++) outs[o] = (T*)out[o];
  for (size_t t = 0; t < nThreads; t++) cuco::reduceRange<T>(ins, nIn, outs, nOut, lo, hi, t, nThreads);
  return 0;
}

CUCO_EXPORT int cuco_test_reduce_bf16(void* const* in, int nIn, void* const* out, int nOut, size_t lo, size_t hi,
                                      size_t nThreads) {
  return reduce<__nv_bfloat16>(in, nIn, out, nOut, lo, hi, nThreads);
}

CUCO_EXPORT int cuco_test_reduce_f32(void* const* in, int nIn, void* const* out, int nOut, size_t lo, size_t hi,
                                     size_t nThreads) {
  return reduce<float>(in, nIn, out, nOut, lo, hi, nThreads);
}

// Every part of [0, count) as packSlice cuts it, into lo[i], hi[i].
CUCO_EXPORT int cuco_test_pack_slice(size_t count, size_t kN, size_t parts, size_t* lo, size_t* hi) {
  for (size_t i = 0; i < parts; i++) cuco::packSlice(count, kN, i, parts, &lo[i], &hi[i]);
  return 0;
}

// One piece of an all-reduce cut by columns (allReducePieceKernel) by every rank, CTA and thread: in[p] is rank p's
// matrix of `lines` lines `ld` elements apart, out[p] rank p's output; columns [c0, c1) of every line.
CUCO_EXPORT int cuco_test_piece_sum_bf16(void* const* in, void* const* out, int n, size_t ld, size_t lines, size_t c0,
                                         size_t c1, size_t ctas, size_t threads) {
  using T = __nv_bfloat16;
  const T* ins[CUCO_COLL_MAX_RANKS];
  T* outs[CUCO_COLL_MAX_RANKS];
  if (n > CUCO_COLL_MAX_RANKS) return 1;
  for (int p = 0; p < n; p++) ins[p] = (const T*)in[p], outs[p] = (T*)out[p];
  for (int r = 0; r < n; r++)
    for (size_t cta = 0; cta < ctas; cta++)
      for (size_t th = 0; th < threads; th++) {
        const cuco::PieceShare s = cuco::pieceShare(lines, c0, c1, 16 / sizeof(T), r, n, cta, ctas, th, threads);
        for (size_t line = s.line0; line < s.line1; line += s.lineStep)
          cuco::reduceRange<T>(ins, n, outs, n, line * ld + s.a, line * ld + s.b, s.tid, s.nThreads);
      }
  return 0;
}

// How many times the shares of a piece cover each element of a matrix of `lines` lines `ld` elements apart: a share's
// lines and columns counted once, by the first thread of the CTAs that split them (the rest split the same elements).
CUCO_EXPORT int cuco_test_piece_cover(int n, size_t ld, size_t lines, size_t c0, size_t c1, size_t ctas,
                                      size_t threads, int* counts) {
  for (int r = 0; r < n; r++)
    for (size_t cta = 0; cta < ctas; cta++)
      for (size_t th = 0; th < threads; th++) {
        const cuco::PieceShare s = cuco::pieceShare(lines, c0, c1, 8, r, n, cta, ctas, th, threads);
        if (s.tid != 0) continue;
        for (size_t line = s.line0; line < s.line1; line += s.lineStep)
          for (size_t i = s.a; i < s.b; i++) counts[line * ld + i]++;
      }
  return 0;
}

// The candidate contract, so that the runner's build accepts the file.
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
