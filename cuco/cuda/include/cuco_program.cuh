/*************************************************************************
 * cuco_program.cuh: what a CUDA program's setup, run and teardown repeat, for any program (strategies, candidates).
 *
 *   Common                what a program holds between runs (a cuBLAS handle, fork/join and per-chunk events,
 *                         the run count): its State derives from it; newState / deleteState are its setup's first
 *                         step and its teardown
 *   streams               one stream behind another (fork and join), events created and destroyed by the array
 *************************************************************************/
#ifndef CUCO_PROGRAM_CUH_
#define CUCO_PROGRAM_CUH_

#include "cuco.h"
#include "cuco_collectives.cuh"
#include "cuco_design_point.cuh"
#include "cuco_gemm.h"

namespace cuco {

// Ranks a program runs on at most: its per-rank arrays (peer pointers, a reduction's inputs) have this many
// entries, as cuco::pushSlice's and cuco::reduceRange's do. newState refuses more.
constexpr int kMaxRanks = CUCO_COLL_MAX_RANKS;

// `waiter` goes on only once what `leader` has queued so far is done (`ev` is recorded on `leader`): a side stream
// forked from the main one, or joined back into it.
inline cudaError_t streamAfter(cudaStream_t waiter, cudaStream_t leader, cudaEvent_t ev) {
  cudaError_t err = cudaEventRecord(ev, leader);
  return err != cudaSuccess ? err : cudaStreamWaitEvent(waiter, ev, 0);
}

// Events for ordering only (no timing), n at a time.
inline cudaError_t createEvents(cudaEvent_t* ev, int n) {
  for (int i = 0; i < n; i++) {
    const cudaError_t err = cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

inline cudaError_t destroyEvents(cudaEvent_t* ev, int n) {
  for (int i = 0; i < n; i++) {
    const cudaError_t err = cudaEventDestroy(ev[i]);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// What most programs hold between runs, with kReady events for the pieces a run is cut into (chunks, layers,
// groups). A program's State derives from it and adds its own; a State with resources of its own hides create()
// and destroy() with ones that call Common's and add them.
template <int kReady = kMaxChunks>
struct Common {
  cublasHandle_t blas;             // GEMMs on the main stream
  cudaEvent_t fork, join;          // a side stream forked from the main one, and joined back
  cudaEvent_t chunkReady[kReady];  // piece j is done on the stream that recorded it
  unsigned long long epoch;        // runs so far: counters that only grow are waited on at multiples of it

  // reservedSms > 0: cuBLAS leaves that many SMs to the kernels that run beside its GEMMs.
  int create(cuco_ctx_t* ctx, int reservedSms) {
    CUCO_CUBLAS(ctx, cuco_gemm_handle(&blas, ctx->stream));
    if (reservedSms > 0) CUCO_CUBLAS(ctx, cuco_gemm_leave_sms(blas, ctx->cudaDevice, reservedSms));
    CUCO_CUDA(ctx, createEvents(&fork, 1));
    CUCO_CUDA(ctx, createEvents(&join, 1));
    CUCO_CUDA(ctx, createEvents(chunkReady, kReady));
    return 0;
  }

  int destroy(cuco_ctx_t* ctx) {
    CUCO_CUBLAS(ctx, cublasDestroy(blas));
    CUCO_CUDA(ctx, destroyEvents(&fork, 1));
    CUCO_CUDA(ctx, destroyEvents(&join, 1));
    CUCO_CUDA(ctx, destroyEvents(chunkReady, kReady));
    return 0;
  }
};

// A program's setup, first step: its State, created and held in ctx->state.
template <class State>
int newState(cuco_ctx_t* ctx, State** out, int reservedSms) {
  if (ctx->nRanks > kMaxRanks) CUCO_FAIL(ctx, "at most %d ranks, not %d", kMaxRanks, ctx->nRanks);
  State* s = new State();
  ctx->state = s;
  *out = s;
  return s->create(ctx, reservedSms);
}

// A program's teardown: its State's resources released, then the State.
template <class State>
int deleteState(cuco_ctx_t* ctx) {
  State* s = (State*)ctx->state;
  if (!s) return 0;
  CUCO_TRY(s->destroy(ctx));
  delete s;
  ctx->state = NULL;
  return 0;
}

}  // namespace cuco

#endif  // CUCO_PROGRAM_CUH_
