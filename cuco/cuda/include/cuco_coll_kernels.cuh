/*************************************************************************
 * cuco_coll_kernels.cuh: the collective kernels: window pointers, all-gather and all-to-all(v) by stores,
 * send batches, the reductions (reduce-scatter by loads or by stores, all-reduce).
 *
 * A part of cuco_collectives.cuh, which includes it after its knobs and the parts before it; never included
 * on its own.
 *************************************************************************/
#ifndef CUCO_COLL_KERNELS_CUH_
#define CUCO_COLL_KERNELS_CUH_

#ifndef CUCO_COLLECTIVES_CUH_
#error "include cuco_collectives.cuh, not its parts"
#endif

namespace cuco {

// Every rank's LSA pointer of `win` (offset 0), copied to the host: collective-free, but it synchronizes `st`.
template <int = 0>
inline cudaError_t windowPointers(ncclWindow_t win, int nRanks, char** host, cudaStream_t st) {
  char** dev = NULL;
  cudaError_t err = cudaMalloc(&dev, nRanks * sizeof(char*));
  if (err == cudaSuccess) {
    windowPointersKernel<<<1, kSmallKernelThreads, 0, st>>>(win, dev, nRanks);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(host, dev, nRanks * sizeof(char*), cudaMemcpyDeviceToHost, st);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  if (dev) {
    const cudaError_t freed = cudaFree(dev);
    if (err == cudaSuccess) err = freed;
  }
  return err;
}

// All-gather and all-to-all in one kernel: to every rank p, `blockBytes` from send + p * srcStride land at
// recvOffset + rank * blockBytes of p's recv window. srcStride 0: an all-gather (one source, loaded once per
// step and stored to every slot); srcStride blockBytes: an all-to-all (block p to rank p). Every block moves in
// the same pass, this rank's own too.
template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    scatterBlocksKernel(ncclDevComm dc, ncclWindow_t recvWin, size_t recvOffset, const char* send, size_t blockBytes,
                        size_t srcStride) {
  Barrier bar(dc);
  bar.sync();
  char* dst[CUCO_COLL_MAX_RANKS];
  const char* src[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) {
    dst[p] = (char*)ncclGetLsaPointer(recvWin, recvOffset + (size_t)dc.lsaRank * blockBytes, p);
    src[p] = send + (size_t)p * srcStride;
  }
  issueCopy(dst, src, dc.lsaSize, blockBytes);
  bar.sync();
}

// All-to-all with uneven blocks whose sizes live on the device, as in a mixture-of-experts dispatch: no
// host round trip to learn them. counts (a window of nRanks int64 per rank): counts[p] = elements this rank
// sends to rank p, its blocks packed in rank order in send. Every rank receives the blocks sent to it packed
// in rank order at recvOffset of its recv window; with zeroTail, the rest of recv up to recvCapacity
// elements is zeroed. Block offsets are prefix sums of counts read from every rank's window. Every rank's recv
// must hold recvCapacity elements.
template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allToAllvKernel(ncclDevComm dc, ncclWindow_t countsWin, size_t countsOffset, const char* send,
                    ncclWindow_t recvWin, size_t recvOffset, size_t elemBytes, size_t recvCapacity, int zeroTail) {
  __shared__ int64_t sendAt[CUCO_COLL_MAX_RANKS], recvAt[CUCO_COLL_MAX_RANKS], count[CUCO_COLL_MAX_RANKS];
  __shared__ int64_t received;
  Barrier bar(dc);
  bar.sync();  // every rank's counts are written, and its recv is free
  if (threadIdx.x == 0) {
    const int64_t* mine = (const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, dc.lsaRank);
    int64_t at = 0;
    received = 0;
    for (int p = 0; p < dc.lsaSize; p++) {
      sendAt[p] = at, count[p] = mine[p], at += mine[p];
      recvAt[p] = 0;  // where this rank's block lands on p: after the blocks of ranks before this one
      for (int s = 0; s < dc.lsaRank; s++) recvAt[p] += ((const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, s))[p];
      received += ((const int64_t*)ncclGetLsaPointer(countsWin, countsOffset, p))[dc.lsaRank];
      // Counts that would write outside a peer's recv (every rank's holds recvCapacity elements) stop the kernel
      // with an error rather than corrupt the peer's memory.
      if (mine[p] < 0 || recvAt[p] + mine[p] > (int64_t)recvCapacity) __trap();
    }
  }
  __syncthreads();
  for (int i = 1; i <= dc.lsaSize; i++) {  // peers first, this rank's own block last
    const int peer = (dc.lsaRank + i) % dc.lsaSize;
    copyBytes((char*)ncclGetLsaPointer(recvWin, recvOffset + recvAt[peer] * elemBytes, peer),
              send + sendAt[peer] * elemBytes, count[peer] * elemBytes);
  }
  if (zeroTail && (size_t)received < recvCapacity) {
    char* tail = (char*)ncclGetLsaPointer(recvWin, recvOffset, dc.lsaRank) + received * elemBytes;
    const size_t n = (recvCapacity - received) * elemBytes;
    for (size_t b = gridThread(); b < n; b += gridThreads()) tail[b] = 0;
  }
  bar.sync();  // every block has landed, and no rank reads counts any more
}

// Point-to-point transfers issued together, as a host ncclGroupStart/ncclGroupEnd of sends and receives is:
// each send pushes its bytes into the matching receive's window on its peer. The i-th send of a rank matches
// the i-th receive of the group's program on the peer (the same program on every rank), so the sender knows
// where its data goes.
#define CUCO_COLL_MAX_SENDS 16
struct SendBatch {
  int n = 0;
  const char* send[CUCO_COLL_MAX_SENDS];
  ncclWindow_t recvWin[CUCO_COLL_MAX_SENDS];
  size_t recvOffset[CUCO_COLL_MAX_SENDS];
  size_t bytes[CUCO_COLL_MAX_SENDS];
  int peer[CUCO_COLL_MAX_SENDS];

  cudaError_t add(const void* src, size_t nBytes, int to, ncclWindow_t win, size_t offset) {
    if (n == CUCO_COLL_MAX_SENDS) return cudaErrorInvalidValue;
    send[n] = (const char*)src, bytes[n] = nBytes, peer[n] = to, recvWin[n] = win, recvOffset[n] = offset;
    n++;
    return cudaSuccess;
  }
};

template <int = 0>
__global__ void __launch_bounds__(CUCO_COLL_THREADS) sendKernel(ncclDevComm dc, SendBatch batch) {
  Barrier bar(dc);
  bar.sync();  // every receiver is done with its receive buffers
  for (int i = 0; i < batch.n; i++)
    copyBytes((char*)ncclGetLsaPointer(batch.recvWin[i], batch.recvOffset[i], batch.peer[i]), batch.send[i],
              batch.bytes[i]);
  bar.sync();  // every send has landed
}

// A 16-byte pack as elements and back, through memcpy rather than a pointer cast: the host build of these loops
// (tests/test_collectives_host.py) is C++, where reading a uint4 through a T* breaks strict aliasing and lets the
// optimiser reorder the reads. On the device both compile to register moves.
template <typename T>
__host__ __device__ inline void addPack(float* acc, const uint4& u) {
  T v[16 / sizeof(T)];
  memcpy(v, &u, sizeof(u));
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) acc[e] += toFloat(v[e]);
}

template <typename T>
__host__ __device__ inline uint4 packOf(const float* acc) {
  T v[16 / sizeof(T)];
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); e++) v[e] = fromFloat<T>(acc[e]);
  uint4 u;
  memcpy(&u, v, sizeof(u));
  return u;
}

// Part i of `parts` of [0, count) elements, cut on boundaries of packs of kN elements so that every part
// starts aligned like element 0; the last part takes the tail.
__host__ __device__ inline void packSlice(size_t count, size_t kN, size_t i, size_t parts, size_t* lo, size_t* hi) {
  const size_t packs = count / kN;
  *lo = packs * i / parts * kN;
  *hi = i == parts - 1 ? count : packs * (i + 1) / parts * kN;
}

// 16-byte packs each thread of a reduction loads before it adds: CUCO_COLL_UNROLL from each of two ranks, the
// same bytes split among more ranks, so that registers stay within the launch bounds' budget at 8 ranks.
#define CUCO_COLL_REDUCE_PACKS (2 * CUCO_COLL_UNROLL)

// Packs [0, nPacks) of in[p] + lo, for nIn <= kMaxIn: every rank's loads are issued before the first add, so a
// rank's loads from its own memory wait beside the peers' instead of after them (the loop over p is unrolled;
// ranks past nIn are predicated off). The adds still run in rank order.
template <typename T, int kMaxIn, int kPacks>
__host__ __device__ inline void reducePacks(const T* const* in, int nIn, T* const* out, int nOut, size_t lo,
                                            size_t nPacks, size_t tid, size_t nThreads) {
  constexpr int kN = 16 / sizeof(T);
  constexpr int kU = kMaxIn >= kPacks ? 1 : kPacks / kMaxIn;
  for (size_t base = tid; base < nPacks; base += nThreads * kU) {
    uint4 v[kMaxIn][kU];
#pragma unroll
    for (int p = 0; p < kMaxIn; p++) {
      const uint4* src = reinterpret_cast<const uint4*>(in[p] + lo);
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (p < nIn && base + u * nThreads < nPacks) v[p][u] = src[base + u * nThreads];
    }
#pragma unroll
    for (int u = 0; u < kU; u++) {
      if (base + u * nThreads >= nPacks) break;
      float acc[kN] = {};
#pragma unroll
      for (int p = 0; p < kMaxIn; p++)
        if (p < nIn) addPack<T>(acc, v[p][u]);
      const uint4 r = packOf<T>(acc);
      for (int o = 0; o < nOut; o++) reinterpret_cast<uint4*>(out[o] + lo)[base + u * nThreads] = r;
    }
  }
}

// Every rank's copy of one operand, passed to a kernel by value (its parameters hold CUCO_COLL_MAX_RANKS pointers).
template <typename T>
struct RankPointers {
  const T* at[CUCO_COLL_MAX_RANKS];
  int n;
};

// Elements [lo, hi), by thread `tid` of `nThreads`: the sum over ranks p = 0..nIn-1 (in that order, in fp32)
// of in[p][i], stored to every out[o][i]. 16-byte packs when every pointer is 16-byte aligned at lo, element by
// element otherwise and for the tail; both paths add in the same order, so the result does not depend on
// alignment. kPacks: packs in flight per thread (reducePacks).
template <typename T, int kPacks = CUCO_COLL_REDUCE_PACKS>
__host__ __device__ inline void reduceRange(const T* const* in, int nIn, T* const* out, int nOut, size_t lo, size_t hi,
                                            size_t tid, size_t nThreads) {
  constexpr int kN = 16 / sizeof(T);
  uintptr_t addrs = 0;
  for (int p = 0; p < nIn; p++) addrs |= (uintptr_t)(in[p] + lo);
  for (int o = 0; o < nOut; o++) addrs |= (uintptr_t)(out[o] + lo);
  const size_t nPacks = (addrs & 15) ? 0 : (hi - lo) / kN;
  if (nIn <= 2) reducePacks<T, 2, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  else if (nIn <= 4) reducePacks<T, 4, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  else reducePacks<T, CUCO_COLL_MAX_RANKS, kPacks>(in, nIn, out, nOut, lo, nPacks, tid, nThreads);
  for (size_t i = lo + nPacks * kN + tid; i < hi; i += nThreads) {
    float acc = 0.0f;
    for (int p = 0; p < nIn; p++) acc += toFloat(in[p][i]);
    const T v = fromFloat<T>(acc);
    for (int o = 0; o < nOut; o++) out[o][i] = v;
  }
}

// The grid's part of a reduction of elements [lo, hi): every thread of the grid strides over them, or, under
// CUCO_COLL_ISSUER_WARP, each warp reduces a contiguous slice cut on 16-byte packs (the same additions in the same
// order either way: the result does not depend on the issuer).
template <typename T>
__device__ inline void issueReduce(const T* const* in, int nIn, T* const* out, int nOut, size_t lo, size_t hi) {
#if defined(CUCO_COLL_ISSUER_WARP)
  constexpr size_t kWarp = 32;
  size_t b, e;
  packSlice(hi - lo, 16 / sizeof(T), gridThread() / kWarp, gridThreads() / kWarp, &b, &e);
  if (b < e) reduceRange<T>(in, nIn, out, nOut, lo + b, lo + e, threadIdx.x % kWarp, kWarp);
#else
  reduceRange<T>(in, nIn, out, nOut, lo, hi, gridThread(), gridThreads());
#endif
}

// Reduce-scatter (sum) of elements [lo, hi): recv[i] = sum over ranks p (in order) of p's send[rank * count + i].
// `first` opens the collective with a barrier, `last` closes it with one: a reduce-scatter in pieces (sync chunk)
// is one kernel per piece, the first and the last of them meeting every rank.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    reduceScatterKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, T* recv, size_t count, size_t lo,
                        size_t hi, int first, int last) {
  if (first) lsaBarrier(dc);
  const T* in[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) in[p] = (const T*)ncclGetLsaPointer(sendWin, sendOffset, p) + (size_t)dc.lsaRank * count;
  issueReduce<T>(in, dc.lsaSize, &recv, 1, lo, hi);
  if (last) lsaBarrier(dc);  // peers may reuse their send buffers only once every rank has read them
}

// Reduce-scatter by stores (sync chunk, producer and consumer CTAs), the design point beside reduceScatterKernel's
// loads: the data crosses NVLink as stores, and the consumers' additions run behind the producers' stores (how the
// two compare: benchmarks/results/notes-collectives.md). A stage of the program's own (ReduceScatterStage) receives,
// in slot r, the block that rank r stores for this rank. CTA b < CUCO_COLL_CTAS is a producer: it stores chunk after
// chunk of its range of every peer's block (send + p * count) into slot `rank` of p's stage, then raises its flag
// there. CTA CUCO_COLL_CTAS + b is a consumer: it waits for flag b of every peer, chunk by chunk, and adds while the
// producers' next stores are in flight. Flags count up across calls (call * nChunks + chunk + 1), so they are never
// reset. A barrier per producer at the start keeps a rank from storing into a peer's stage that the peer's consumers
// may still be reading from the previous call. Producers have the lower block indices, so they are dispatched first;
// a consumer waits only on peers' producers, and the 2 * 64 CTAs fit a 132-SM H100 or H200 together (one per SM at
// these launch bounds). Same addition order as reduceScatterKernel (rank order, fp32).
struct ReduceScatterStage {
  void* buf;         // nRanks slots of slotBytes, then nRanks * CUCO_COLL_CTAS flags (uint64_t)
  ncclWindow_t win;  // symmetric: every rank allocates the same stage
  size_t count;      // elements in each rank's block
  size_t slotBytes;  // count elements rounded up to 256 bytes, so every slot starts aligned
  uint64_t calls;    // reduceScatterPush calls so far: where the flags start this time
};

__host__ __device__ inline size_t stageFlagsOffset(int nRanks, size_t slotBytes) { return (size_t)nRanks * slotBytes; }

// Where in the stage the flag that rank `src`'s producer CTA b raises lies.
__device__ inline size_t stageFlag(size_t flagsOffset, int src, int b) {
  return flagsOffset + ((size_t)src * CUCO_COLL_CTAS + b) * sizeof(uint64_t);
}

template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    reduceScatterPushKernel(ncclDevComm dc, const T* send, ReduceScatterStage stage, T* recv, int nChunks) {
  const int me = dc.lsaRank, n = dc.lsaSize;
  const bool producer = blockIdx.x < CUCO_COLL_CTAS;
  const int b = blockIdx.x % CUCO_COLL_CTAS;
  const size_t count = stage.count, flags = stageFlagsOffset(n, stage.slotBytes);
  const uint64_t first = stage.calls * (uint64_t)nChunks + 1;  // flag value once chunk 0 of this call landed
  constexpr size_t kN = 16 / sizeof(T);
  size_t lo, hi;  // this CTA's range of the block
  packSlice(count, kN, b, CUCO_COLL_CTAS, &lo, &hi);
  if (producer) {  // every peer is done reading its stage (barrier b: blockIdx.x is b for a producer)
    Barrier bar(dc);
    bar.sync();
  }
  for (int k = 0; k < nChunks; k++) {
    size_t c0, c1;  // chunk k of the range, pack-aligned like it
    packSlice(hi - lo, kN, k, nChunks, &c0, &c1);
    c0 += lo, c1 += lo;
    if (producer) {
      char* dst[CUCO_COLL_MAX_RANKS];
      const char* src[CUCO_COLL_MAX_RANKS];
      int m = 0;
      for (int p = 0; p < n; p++) {
        if (p == me) continue;
        dst[m] = (char*)ncclGetLsaPointer(stage.win, me * stage.slotBytes + c0 * sizeof(T), p);
        src[m++] = (const char*)(send + (size_t)p * count + c0);
      }
      copyBytes(dst, src, m, (c1 - c0) * sizeof(T), threadIdx.x, blockDim.x);
      __syncthreads();  // every thread's stores of chunk k precede the flag (release, below)
      if (threadIdx.x == 0)
        for (int p = 0; p < n; p++) {
          if (p == me) continue;
          uint64_t* flag = (uint64_t*)ncclGetLsaPointer(stage.win, stageFlag(flags, me, b), p);
          cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*flag).store(first + k, cuda::memory_order_release);
        }
    } else {
      // Built per chunk, not hoisted out of the loop: live across it, these pointers spill more registers.
      const char* mine = (const char*)ncclGetLsaPointer(stage.win, 0, me);
      if (threadIdx.x == 0)
        for (int q = 0; q < n; q++) {
          if (q == me) continue;
          // acquire: chunk k from rank q has landed in slot q before any thread of this CTA reads it
          cuda::atomic_ref<uint64_t, cuda::thread_scope_system> flag(*(uint64_t*)(mine + stageFlag(flags, q, b)));
          while (flag.load(cuda::memory_order_acquire) < first + k) {
          }
        }
      __syncthreads();
      const T* in[CUCO_COLL_MAX_RANKS];
      for (int q = 0; q < n; q++) in[q] = q == me ? send + (size_t)me * count : (const T*)(mine + q * stage.slotBytes);
      // Half the loads version's packs in flight: these inputs are local, so fewer loads cover their latency,
      // and this kernel also holds the producer's copy loop, beside which the full count spills registers.
      reduceRange<T, CUCO_COLL_REDUCE_PACKS / 2>(in, n, &recv, 1, c0, c1, threadIdx.x, blockDim.x);
    }
  }
}

// All-reduce (sum): rank r reduces its slice of every rank's send and stores the sum into every rank's recv.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allReduceKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin, size_t recvOffset,
                    size_t count) {
  Barrier bar(dc);
  bar.sync();
  size_t lo, hi;
  packSlice(count, 16 / sizeof(T), dc.lsaRank, dc.lsaSize, &lo, &hi);
  const T* in[CUCO_COLL_MAX_RANKS];
  T* out[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) {
    in[p] = (const T*)ncclGetLsaPointer(sendWin, sendOffset, p);
    out[p] = (T*)ncclGetLsaPointer(recvWin, recvOffset, p);
  }
  issueReduce<T>(in, dc.lsaSize, out, dc.lsaSize, lo, hi);
  bar.sync();
}

// The part of a piece (columns [c0, c1) of `lines` lines) that rank r of n sums: its slice of the lines, or with
// fewer lines than ranks its slice of the columns (on packs of kN elements); and of that, the part of CTA `cta` of
// `ctas`: the CTAs share out the lines, several to a line where the lines are fewer than the CTAs, thread `thread`
// of `threads` of each one of perLine * threads on its lines. Lines [line0, line1) by lineStep, columns [a, b).
struct PieceShare {
  size_t line0, line1, lineStep, a, b, tid, nThreads;
};

__host__ __device__ inline PieceShare pieceShare(size_t lines, size_t c0, size_t c1, size_t kN, size_t r, size_t n,
                                                 size_t cta, size_t ctas, size_t thread, size_t threads) {
  PieceShare s{0, lines, 1, c0, c1, 0, 1};
  if (lines >= n) {
    s.line0 = lines * r / n, s.line1 = lines * (r + 1) / n;
  } else {
    packSlice(c1 - c0, kN, r, n, &s.a, &s.b);
    s.a += c0, s.b += c0;
  }
  const size_t mine = s.line1 - s.line0;
  if (mine == 0 || s.b <= s.a) {
    s.line1 = s.line0;
    return s;
  }
  const size_t perLine = ctas > mine ? ctas / mine : 1;  // CTAs that share one line
  const size_t groups = ctas / perLine, group = cta / perLine;
  s.lineStep = groups;
  s.tid = (cta % perLine) * threads + thread, s.nThreads = perLine * threads;
  if (group >= groups) s.line1 = s.line0;  // a CTA left over where perLine does not divide the grid
  else s.line0 += group;
  return s;
}

// All-reduce (sum) of one piece of a matrix of `lines` lines `ld` elements apart: columns [c0, c1) of every line
// (sync chunk, a GEMM's output cut by columns). This rank sums its share of every rank's send (pieceShare) and stores
// it into every rank's recv, in the same order as allReduceKernel. `last` closes the all-reduce with a barrier: a
// rank reads its recv only once every rank has stored its share; the pieces' flags, raised after the GEMM wrote
// them, stand for the barrier at the start.
template <typename T>
__global__ void __launch_bounds__(CUCO_COLL_THREADS)
    allReducePieceKernel(ncclDevComm dc, ncclWindow_t sendWin, size_t sendOffset, ncclWindow_t recvWin,
                         size_t recvOffset, size_t ld, size_t lines, size_t c0, size_t c1, int last) {
  const T* in[CUCO_COLL_MAX_RANKS];
  T* out[CUCO_COLL_MAX_RANKS];
  for (int p = 0; p < dc.lsaSize; p++) {
    in[p] = (const T*)ncclGetLsaPointer(sendWin, sendOffset, p);
    out[p] = (T*)ncclGetLsaPointer(recvWin, recvOffset, p);
  }
  const PieceShare s = pieceShare(lines, c0, c1, 16 / sizeof(T), dc.lsaRank, dc.lsaSize, blockIdx.x, gridDim.x,
                                  threadIdx.x, blockDim.x);
  for (size_t line = s.line0; line < s.line1; line += s.lineStep)
    reduceRange<T>(in, dc.lsaSize, out, dc.lsaSize, line * ld + s.a, line * ld + s.b, s.tid, s.nThreads);
  if (last) lsaBarrier(dc);
}

}  // namespace cuco

#endif  // CUCO_COLL_KERNELS_CUH_
