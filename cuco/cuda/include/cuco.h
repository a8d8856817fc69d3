/*************************************************************************
 * cuco.h: the contract between cuco's runner and a CUDA candidate.
 *
 * A candidate is a .cu file built by nvcc into a shared library that exports, with C linkage,
 *   int cuco_setup(cuco_ctx_t* ctx);     once per shape, before any run: handles, device comms
 *   int cuco_run(cuco_ctx_t* ctx);       the timed region: enqueue work, never synchronize the host
 *   int cuco_teardown(cuco_ctx_t* ctx);  once per shape, after the last run
 * Each returns 0 on success; on failure it may write a reason into ctx->error.
 *
 * Optionally, a candidate states what its kernels need from the NCCL device API:
 *   void cuco_dev_requirements(const cuco_ctx_t* ctx, ncclDevCommRequirements* reqs);
 * reqs arrives zeroed (NCCL 2.28.9 has no NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER); the runner then
 * creates *ctx->devComm with them before cuco_setup and destroys it after cuco_teardown. Such a candidate includes
 * <nccl_device.h> (cuco_collectives.cuh does).
 *
 * Optionally, it states what it needs of the run (cuco_needs_t, below):
 *   void cuco_needs(cuco_needs_t* needs);
 * needs arrives zeroed; the runner checks it once the device communicator exists and, where it is not met, fails
 * with the reason before cuco_setup. A strategy kernel's comes from its workload.toml ([strategies.X] requires).
 *
 * The runner owns everything else: the NCCL communicator and device communicator, the streams, the
 * buffers (symmetric ones allocated with ncclMemAlloc and registered as NCCL_WIN_COLL_SYMMETRIC
 * windows), inputs, verification and timing. Work may be enqueued on ctx->stream and on ctx->sideStreams only: the
 * timed region ends when all of them are done, and all of them start behind the same gate.
 *************************************************************************/
#ifndef CUCO_H_
#define CUCO_H_

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CUCO_ABI_VERSION 2

// NCCL's device API (<nccl_device.h>) is what a program's kernels reach peers with. Only a program that uses it
// includes it (cuco_collectives.cuh does): its libcu++ atomics are half of a small program's compile time.
struct ncclDevComm;
#define CUCO_MAX_BUFFERS 16
#define CUCO_MAX_SIDE_STREAMS 4
#define CUCO_MAX_PARAMS 16
#define CUCO_NAME_LEN 32
#define CUCO_ERROR_LEN 512

typedef enum { CUCO_BF16 = 0, CUCO_F16, CUCO_F32, CUCO_F64, CUCO_I8, CUCO_U8, CUCO_I32, CUCO_I64 } cuco_dtype_t;

typedef struct {
  char name[CUCO_NAME_LEN];
  void* ptr;              // device pointer on this rank
  size_t bytes;
  int dtype;              // cuco_dtype_t
  int ndim;
  int64_t shape[4];
  int symmetric;          // allocated with ncclMemAlloc, registered as window
  ncclWindow_t window;    // NULL unless symmetric
} cuco_buffer_t;

typedef struct {
  int abiVersion;
  int rank, nRanks, cudaDevice;
  ncclComm_t comm;
  int hasDevComm;                                    // set when the candidate exports cuco_dev_requirements
  ncclDevComm* devComm;                              // the device communicator (zeroed without hasDevComm):
                                                     // kernels take it by value, *ctx->devComm
  cudaStream_t stream;                               // main stream
  int nSideStreams;
  cudaStream_t sideStreams[CUCO_MAX_SIDE_STREAMS];   // extra streams, gated and timed like the main one, as many
                                                     // as cuco_needs declares (the other slots: the main stream);
                                                     // [0] has the device's highest priority (communication)
  int nBuffers;
  cuco_buffer_t buffers[CUCO_MAX_BUFFERS];
  int nParams;
  char paramNames[CUCO_MAX_PARAMS][CUCO_NAME_LEN];
  int64_t params[CUCO_MAX_PARAMS];                   // shape parameters (M, K, N, ...)
  void* state;                                       // owned by the candidate
  char error[CUCO_ERROR_LEN];                        // reason for a non-zero return
} cuco_ctx_t;

// What a candidate needs of the run, beyond the contract (cuco_needs above).
typedef struct {
  int lsaTeam;      // every rank in one LSA team (one NVLink domain): devComm.lsaSize == nRanks
  int sideStreams;  // side streams it enqueues on
  int nSymmetric;
  char symmetric[CUCO_MAX_BUFFERS][CUCO_NAME_LEN];  // buffers it reaches through their windows
} cuco_needs_t;

static inline void cuco_need_symmetric(cuco_needs_t* needs, const char* name) {
  if (needs->nSymmetric < CUCO_MAX_BUFFERS) strncpy(needs->symmetric[needs->nSymmetric++], name, CUCO_NAME_LEN - 1);
}

static inline cuco_buffer_t* cuco_buffer(cuco_ctx_t* ctx, const char* name) {
  for (int i = 0; i < ctx->nBuffers; i++)
    if (strncmp(ctx->buffers[i].name, name, CUCO_NAME_LEN) == 0) return &ctx->buffers[i];
  return NULL;
}

// Returns the shape parameter, or -1 if the workload has none of that name.
static inline int64_t cuco_param(const cuco_ctx_t* ctx, const char* name) {
  for (int i = 0; i < ctx->nParams; i++)
    if (strncmp(ctx->paramNames[i], name, CUCO_NAME_LEN) == 0) return ctx->params[i];
  return -1;
}

#define CUCO_FAIL(ctx, ...)                                                     \
  do {                                                                          \
    snprintf((ctx)->error, CUCO_ERROR_LEN, __VA_ARGS__);                        \
    return 1;                                                                   \
  } while (0)

// Check a CUDA / NCCL / cuBLAS call inside an entry point; on failure record file, line and reason.
#define CUCO_CUDA(ctx, call)                                                    \
  do {                                                                          \
    cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess)                                                      \
      CUCO_FAIL(ctx, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)

#define CUCO_NCCL(ctx, call)                                                    \
  do {                                                                          \
    ncclResult_t r_ = (call);                                                   \
    if (r_ != ncclSuccess)                                                      \
      CUCO_FAIL(ctx, "%s:%d: %s: %s", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
  } while (0)

// Pass on the failure of a helper that returns non-zero and has already written its reason into ctx->error.
#define CUCO_TRY(call)        \
  do {                        \
    if ((call) != 0) return 1; \
  } while (0)

#define CUCO_CUBLAS(ctx, call)                                                  \
  do {                                                                          \
    int s_ = (int)(call);                                                       \
    if (s_ != 0) CUCO_FAIL(ctx, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, s_); \
  } while (0)

#ifdef __cplusplus
#define CUCO_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define CUCO_EXPORT __attribute__((visibility("default")))
#endif

#endif  // CUCO_H_
