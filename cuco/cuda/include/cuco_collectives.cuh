/*************************************************************************
 * cuco_collectives.cuh: cuco's device-side collectives over NCCL 2.28 LSA windows.
 *
 * The conservative design point of the fast path: one kernel per collective (placement deferred),
 * CUCO_COLL_CTAS CTAs each owning one LSA barrier (sync global, issuer cta), the whole buffer at once;
 * reduceScatterPush is the same collective at another point (sync chunk: producer CTAs raise a flag per
 * chunk on the peer, consumer CTAs wait for it). Every kernel starts with a barrier (no rank writes into,
 * or reads from, a peer buffer that peer may still be using) and ends with one (every store has landed
 * before anything after the kernel runs), but reduceScatterPush, whose consumers end only once every
 * peer's stores to them have landed. pushSlice is the all-gather's copy for a caller that cuts the transfer
 * itself (into chunks, among CTAs or warps) and signals each piece its own way, as the GEMM+AllGather strategy
 * kernel does.
 * Knobs a program may define before the include (cuco's derived strategies do, cuco/fastpath/knobs.py):
 * CUCO_COLL_CTAS, the CTAs of every collective kernel; CUCO_COLL_ISSUER_WARP, under which each warp of the
 * grid moves (or reduces) a contiguous slice of its own instead of the grid's threads striding over the whole
 * buffer together; CUCO_COLL_SIDE_STREAM, under which onSideStream / joinSideStream move a collective to
 * ctx->sideStreams[0] (placement stream_overlap; without it they are the plain call); CUCO_COLL_CE, under which
 * the copy engine moves what is only copied (backend ce); and CUCO_COLL_CHUNK_SYNC with CUCO_CHUNKS, under which
 * allGatherChunks raises a flag per piece for a consumer that reads piece by piece (sync chunk).
 * Reductions add in fixed rank order in fp32, so results are bitwise deterministic. Data moves by stores
 * into peers' windows (all-gather, all-to-all(v), send, reduceScatterPush), or loads from them (reduce-scatter,
 * all-reduce).
 *
 * Requires: the device communicator has CUCO_COLL_CTAS LSA barriers (cuco::coll_requirements); the
 * windows are symmetric buffers of the workload; all ranks in one LSA team.
 *************************************************************************/
#ifndef CUCO_COLLECTIVES_CUH_
#define CUCO_COLLECTIVES_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl_device.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "cuco.h"

// One LSA barrier per CTA, so this is also the lsaBarrierCount the device communicator needs. 64: the count that
// moved data fastest over NVLink in the collectives benchmark (benchmarks/results/notes-collectives.md). A program
// may define it before the include (the collectives benchmark compares counts).
#ifndef CUCO_COLL_CTAS
#define CUCO_COLL_CTAS 64
#endif
#define CUCO_COLL_THREADS 512
#define CUCO_COLL_MAX_RANKS 8
// 16-byte packs each thread has in flight per rank before it adds or stores: enough bytes outstanding to
// cover the latency of loads over NVLink (about a microsecond) at link rate with CUCO_COLL_CTAS x
// CUCO_COLL_THREADS. Like CUCO_COLL_CTAS, a program may define it first.
#ifndef CUCO_COLL_UNROLL
#define CUCO_COLL_UNROLL 4
#endif

// Every kernel, and every host function that launches one, is a template (of an unused `int = 0`): a program
// compiles the kernels it launches, not all of them (unused, they were a third of a small program's build).
// The library by job, each part after those it builds on:
#include "cuco_coll_copy.cuh"
#include "cuco_coll_sync.cuh"
#include "cuco_coll_kernels.cuh"
#include "cuco_coll_host.cuh"
#include "cuco_coll_chunks.cuh"

#endif  // CUCO_COLLECTIVES_CUH_
