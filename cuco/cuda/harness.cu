/*************************************************************************
 * harness.cu: the C++ half of cuco's per-rank worker, loaded by Python through ctypes.
 *
 * It owns what Python cannot do through torch: the NCCL communicator handed to CUDA candidates,
 * symmetric buffers (ncclMemAlloc + NCCL_WIN_COLL_SYMMETRIC windows), the cuco_ctx_t that
 * candidates see, the start gate that releases every rank's timed region at the same instant, and the
 * done flag each rank's stream raises for its judge.
 *
 * It also owns the device memory a judge shares with the candidate's process: allocated with the
 * driver's virtual memory API and exported as a file descriptor, which the judge passes over a Unix
 * socket. Holding the descriptor is the only key to it, whatever uid the receiving process runs as
 * (CUDA's legacy IPC handles open only within one uid).
 *
 * Every function returns 0 on success or -1 with a reason readable through cuco_h_last_error().
 * Window registration and communicator creation are collective: every rank calls them in the
 * same order.
 *************************************************************************/
#include "cuco.h"

#include <nccl_device.h>

#include <cudaTypedefs.h>
#include <stdarg.h>
#include <stdlib.h>

static thread_local char lastError[CUCO_ERROR_LEN];

static int fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lastError, sizeof(lastError), fmt, ap);
  va_end(ap);
  return -1;
}

#define HCUDA(call)                                                                    \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) return fail("%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
  } while (0)

#define HNCCL(call)                                                                    \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) return fail("%s:%d: %s: %s", __FILE__, __LINE__, #call, ncclGetErrorString(r_)); \
  } while (0)

CUCO_EXPORT const char* cuco_h_last_error(void) { return lastError; }

CUCO_EXPORT int cuco_h_nccl_version(int* version) {
  HNCCL(ncclGetVersion(version));
  return 0;
}

CUCO_EXPORT int cuco_h_unique_id(char* out /* NCCL_UNIQUE_ID_BYTES */) {
  ncclUniqueId id;
  HNCCL(ncclGetUniqueId(&id));
  memcpy(out, id.internal, NCCL_UNIQUE_ID_BYTES);
  return 0;
}

CUCO_EXPORT int cuco_h_comm_init(int rank, int nRanks, int device, const char* idBytes, void** commOut) {
  ncclUniqueId id;
  memcpy(id.internal, idBytes, NCCL_UNIQUE_ID_BYTES);
  HCUDA(cudaSetDevice(device));
  ncclComm_t comm;
  HNCCL(ncclCommInitRank(&comm, nRanks, id, rank));
  *commOut = comm;
  return 0;
}

// Collective: every rank allocates and registers its buffers in the same order.
CUCO_EXPORT int cuco_h_sym_alloc(void* comm, size_t bytes, void** ptr, void** window) {
  HNCCL(ncclMemAlloc(ptr, bytes));
  ncclWindow_t win;
  HNCCL(ncclCommWindowRegister((ncclComm_t)comm, *ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC));
  *window = (void*)win;
  return 0;
}

CUCO_EXPORT int cuco_h_sym_free(void* comm, void* ptr, void* window) {
  HNCCL(ncclCommWindowDeregister((ncclComm_t)comm, (ncclWindow_t)window));
  HNCCL(ncclMemFree(ptr));
  return 0;
}

// A candidate's context and the device communicator it points to, in one allocation: ctx first, so the context's
// address is the allocation's.
struct HarnessCtx {
  cuco_ctx_t ctx;
  ncclDevComm devComm;
};

CUCO_EXPORT cuco_ctx_t* cuco_h_ctx_new(int rank, int nRanks, int device, void* comm, void* stream) {
  HarnessCtx* h = (HarnessCtx*)calloc(1, sizeof(HarnessCtx));
  if (!h) return NULL;
  cuco_ctx_t* ctx = &h->ctx;
  ctx->devComm = &h->devComm;  // zeroed until cuco_h_devcomm_create fills it
  ctx->abiVersion = CUCO_ABI_VERSION;
  ctx->rank = rank;
  ctx->nRanks = nRanks;
  ctx->cudaDevice = device;
  ctx->comm = (ncclComm_t)comm;
  ctx->stream = (cudaStream_t)stream;
  return ctx;
}

CUCO_EXPORT void cuco_h_ctx_free(cuco_ctx_t* ctx) { free((HarnessCtx*)ctx); }

CUCO_EXPORT const char* cuco_h_ctx_error(cuco_ctx_t* ctx) { return ctx->error; }

CUCO_EXPORT int cuco_h_ctx_add_stream(cuco_ctx_t* ctx, void* stream) {
  if (ctx->nSideStreams >= CUCO_MAX_SIDE_STREAMS) return fail("more than %d side streams", CUCO_MAX_SIDE_STREAMS);
  ctx->sideStreams[ctx->nSideStreams++] = (cudaStream_t)stream;
  return 0;
}

CUCO_EXPORT int cuco_h_ctx_add_buffer(cuco_ctx_t* ctx, const char* name, void* ptr, size_t bytes, int dtype,
                                      int ndim, const int64_t* shape, int symmetric, void* window) {
  if (ctx->nBuffers >= CUCO_MAX_BUFFERS) return fail("more than %d buffers", CUCO_MAX_BUFFERS);
  if (ndim > 4) return fail("buffer %s has %d dimensions; at most 4", name, ndim);
  if (strlen(name) >= CUCO_NAME_LEN) return fail("buffer name %s is longer than %d", name, CUCO_NAME_LEN - 1);
  cuco_buffer_t* b = &ctx->buffers[ctx->nBuffers++];
  strncpy(b->name, name, CUCO_NAME_LEN - 1);
  b->ptr = ptr;
  b->bytes = bytes;
  b->dtype = dtype;
  b->ndim = ndim;
  for (int i = 0; i < ndim; i++) b->shape[i] = shape[i];
  b->symmetric = symmetric;
  b->window = (ncclWindow_t)window;
  return 0;
}

CUCO_EXPORT int cuco_h_ctx_add_param(cuco_ctx_t* ctx, const char* name, int64_t value) {
  if (ctx->nParams >= CUCO_MAX_PARAMS) return fail("more than %d shape parameters", CUCO_MAX_PARAMS);
  if (strlen(name) >= CUCO_NAME_LEN) return fail("parameter name %s is too long", name);
  strncpy(ctx->paramNames[ctx->nParams], name, CUCO_NAME_LEN - 1);
  ctx->params[ctx->nParams++] = value;
  return 0;
}

typedef void (*cuco_requirements_fn)(const cuco_ctx_t*, ncclDevCommRequirements*);

// Collective: the device communicator a candidate asked for through cuco_dev_requirements.
CUCO_EXPORT int cuco_h_devcomm_create(cuco_ctx_t* ctx, void* requirementsFn) {
  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof(reqs));  // NCCL 2.28.9 has no NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER
  ((cuco_requirements_fn)requirementsFn)(ctx, &reqs);
  HNCCL(ncclDevCommCreate(ctx->comm, &reqs, ctx->devComm));
  ctx->hasDevComm = 1;
  return 0;
}

typedef void (*cuco_needs_fn)(cuco_needs_t*);

// The side streams a candidate says it enqueues on (cuco_needs), asked before its context is filled: the runner
// gates and joins only those, and the context's other side-stream slots are the main stream itself.
CUCO_EXPORT int cuco_h_declared_side_streams(void* needsFn) {
  cuco_needs_t needs;
  memset(&needs, 0, sizeof(needs));
  ((cuco_needs_fn)needsFn)(&needs);
  return needs.sideStreams > 0 ? needs.sideStreams : 0;
}

// What the candidate said it needs (cuco_needs), against this run: before cuco_setup, after the device communicator.
CUCO_EXPORT int cuco_h_check_needs(cuco_ctx_t* ctx, void* needsFn) {
  cuco_needs_t needs;
  memset(&needs, 0, sizeof(needs));
  ((cuco_needs_fn)needsFn)(&needs);
  if (needs.sideStreams > ctx->nSideStreams)
    return fail("needs %d side streams; the runner gives %d", needs.sideStreams, ctx->nSideStreams);
  if (needs.lsaTeam && !ctx->hasDevComm)
    return fail("needs an LSA team but exports no cuco_dev_requirements (no device communicator)");
  if (needs.lsaTeam && ctx->devComm->lsaSize != ctx->nRanks)
    return fail("needs all %d ranks in one LSA team (one NVLink domain); this run's team has %d", ctx->nRanks,
                ctx->devComm->lsaSize);
  for (int i = 0; i < needs.nSymmetric && i < CUCO_MAX_BUFFERS; i++) {
    const cuco_buffer_t* b = cuco_buffer(ctx, needs.symmetric[i]);
    if (!b) return fail("needs buffer %s, which the workload does not have", needs.symmetric[i]);
    if (!b->symmetric) return fail("needs buffer %s symmetric (a window); it is not", needs.symmetric[i]);
  }
  return 0;
}

CUCO_EXPORT int cuco_h_devcomm_destroy(cuco_ctx_t* ctx) {
  if (!ctx->hasDevComm) return 0;
  HNCCL(ncclDevCommDestroy(ctx->comm, ctx->devComm));
  ctx->hasDevComm = 0;
  return 0;
}

// Pin a page of host memory shared by all ranks of this node (an mmap of one /dev/shm file) so
// that one host store releases every GPU's gate.
CUCO_EXPORT int cuco_h_host_register(void* hostPtr, size_t bytes, void** devPtr) {
  HCUDA(cudaHostRegister(hostPtr, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  HCUDA(cudaHostGetDevicePointer(devPtr, hostPtr, 0));
  return 0;
}

CUCO_EXPORT int cuco_h_host_unregister(void* hostPtr) {
  HCUDA(cudaHostUnregister(hostPtr));
  return 0;
}

// ---- device memory shared through a file descriptor ----------------------------------------------
// The driver's entry points, fetched through the runtime so that nothing links libcuda itself.
struct DriverVmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 addressFree;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 setAccess;
  PFN_cuMemExportToShareableHandle_v10020 exportHandle;
  PFN_cuMemImportFromShareableHandle_v10020 importHandle;
};

static const int kVmmVersion = 10020;  // CUDA 10.2: the first with cuMem* and POSIX descriptors

static int driverVmm(DriverVmm* d) {
  static DriverVmm cached;
  static bool loaded = false;
  if (!loaded) {
    struct { const char* name; void** fn; } syms[] = {
        {"cuMemGetAllocationGranularity", (void**)&cached.granularity}, {"cuMemCreate", (void**)&cached.create},
        {"cuMemRelease", (void**)&cached.release}, {"cuMemAddressReserve", (void**)&cached.reserve},
        {"cuMemAddressFree", (void**)&cached.addressFree}, {"cuMemMap", (void**)&cached.map},
        {"cuMemUnmap", (void**)&cached.unmap}, {"cuMemSetAccess", (void**)&cached.setAccess},
        {"cuMemExportToShareableHandle", (void**)&cached.exportHandle},
        {"cuMemImportFromShareableHandle", (void**)&cached.importHandle}};
    for (auto& s : syms) {
      cudaDriverEntryPointQueryResult found;
      HCUDA(cudaGetDriverEntryPointByVersion(s.name, s.fn, kVmmVersion, cudaEnableDefault, &found));
      if (found != cudaDriverEntryPointSuccess) return fail("the CUDA driver has no %s", s.name);
    }
    loaded = true;
  }
  *d = cached;
  return 0;
}

#define HCU(call)                                                                      \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) return fail("%s:%d: %s: CUresult %d", __FILE__, __LINE__, #call, (int)r_); \
  } while (0)

static CUmemAllocationProp sharedProp(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// Reserve an address range, map the allocation there, and give this device read and write access.
static int mapShared(const DriverVmm& d, int device, CUmemGenericAllocationHandle handle, size_t bytes, void** ptr) {
  CUdeviceptr va = 0;
  HCU(d.reserve(&va, bytes, 0, 0, 0));
  CUresult r = d.map(va, bytes, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    d.addressFree(va, bytes);
    return fail("cuMemMap: CUresult %d", (int)r);
  }
  CUmemAccessDesc access;
  memset(&access, 0, sizeof(access));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.setAccess(va, bytes, &access, 1);
  if (r != CUDA_SUCCESS) {
    d.unmap(va, bytes);
    d.addressFree(va, bytes);
    return fail("cuMemSetAccess: CUresult %d", (int)r);
  }
  *ptr = (void*)va;
  return 0;
}

// New device memory of at least `bytes` (rounded up to the allocation granularity, returned in *mapped),
// mapped here and exported as a descriptor (*fd) for another process to import.
CUCO_EXPORT int cuco_h_share_alloc(int device, size_t bytes, void** ptr, int* fd, size_t* mapped) {
  DriverVmm d;
  if (driverVmm(&d)) return -1;
  HCUDA(cudaSetDevice(device));
  HCUDA(cudaFree(0));  // the primary context, current for the driver calls below
  CUmemAllocationProp prop = sharedProp(device);
  size_t gran = 0;
  HCU(d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t size = bytes ? (bytes + gran - 1) / gran * gran : gran;
  CUmemGenericAllocationHandle handle;
  HCU(d.create(&handle, size, &prop, 0));
  int rc = mapShared(d, device, handle, size, ptr);
  if (rc == 0) {
    CUresult r = d.exportHandle(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      d.unmap((CUdeviceptr)*ptr, size);
      d.addressFree((CUdeviceptr)*ptr, size);
      rc = fail("cuMemExportToShareableHandle: CUresult %d", (int)r);
    }
  }
  d.release(handle);  // the mapping keeps the memory until it is unmapped
  *mapped = size;
  return rc;
}

// The memory behind a descriptor from cuco_h_share_alloc, mapped into this process.
CUCO_EXPORT int cuco_h_share_import(int device, int fd, size_t bytes, void** ptr) {
  DriverVmm d;
  if (driverVmm(&d)) return -1;
  HCUDA(cudaSetDevice(device));
  HCUDA(cudaFree(0));
  CUmemGenericAllocationHandle handle;
  HCU(d.importHandle(&handle, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  int rc = mapShared(d, device, handle, bytes, ptr);
  d.release(handle);
  return rc;
}

CUCO_EXPORT int cuco_h_share_free(void* ptr, size_t bytes) {
  DriverVmm d;
  if (driverVmm(&d)) return -1;
  HCU(d.unmap((CUdeviceptr)ptr, bytes));
  HCU(d.addressFree((CUdeviceptr)ptr, bytes));
  return 0;
}

static __device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A 64-bit load with acquire semantics at system scope: what the judge wrote before it (over the bus, from the CPU)
// is visible to the loads that follow it.
static __device__ __forceinline__ unsigned long long loadAcquireSys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// One thread spins until the shared host counter reaches `target`, then fetches this rank's key to the run's sealed
// inputs (the judge writes the keys before it raises the counter) into device memory. The timed region's start event
// is recorded behind this kernel, so the host's launch overhead, the ranks' skew in reaching the barrier and the
// key's read over the bus stay out of the measurement. The timeout keeps a candidate whose cuco_run blocks the host
// from deadlocking the gate; the runner then reports ungated timing.
__global__ void gateKernel(const unsigned long long* counter, unsigned long long target, unsigned long long timeoutNs,
                           int* timedOut, const unsigned long long* keySrc, unsigned long long* keyDst) {
  const uint64_t start = globalTimerNs();
  while (loadAcquireSys(counter) < target) {
    if (globalTimerNs() - start > timeoutNs) {
      *timedOut = 1;
      break;
    }
  }
  *keyDst = loadAcquireSys(keySrc);
}

CUCO_EXPORT int cuco_h_gate(void* stream, void* counterDev, unsigned long long target, unsigned long long timeoutNs,
                            int* timedOutDev, const void* keySrcDev, void* keyDstDev) {
  gateKernel<<<1, 1, 0, (cudaStream_t)stream>>>((const unsigned long long*)counterDev, target, timeoutNs, timedOutDev,
                                                (const unsigned long long*)keySrcDev, (unsigned long long*)keyDstDev);
  HCUDA(cudaGetLastError());
  return 0;
}

// Raised in stream order after the timed region and its snapshot: the judge's clock stops when it sees
// the value, and it copies the snapshot then, so work still running after this point is not in it.
__global__ void signalKernel(volatile unsigned long long* flag, unsigned long long value) {
  __threadfence_system();  // the snapshot's writes are visible before the flag is
  *flag = value;
}

CUCO_EXPORT int cuco_h_signal(void* stream, void* flagDev, unsigned long long value) {
  signalKernel<<<1, 1, 0, (cudaStream_t)stream>>>((volatile unsigned long long*)flagDev, value);
  HCUDA(cudaGetLastError());
  return 0;
}

// Sealed inputs. The judge writes a run's inputs into the staging area XORed with a keystream, and the key
// reaches the host's page only when the judge starts its clock (with the gate, or just before an ungated run).
// The runner's stream unseals them into the candidate's buffers after the start event: nothing of a run's
// inputs is readable in the candidate's process before its time starts. The keystream is Philox-4x32-10
// (Salmon et al., SC'11; the generator cuRAND and torch use), counter = (16-byte index, stream), key = 64 bits.
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

static __device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
#pragma unroll
  for (int r = 0; r < PHILOX_ROUNDS; ++r) {
    const uint32_t hi0 = __umulhi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
    const uint32_t hi1 = __umulhi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += PHILOX_W0;
    k.y += PHILOX_W1;
  }
  return c;
}

// dst[i] = src[i] ^ keystream(i) over one buffer, this CTA's share of it: sealing and unsealing are the same
// operation, in place or not.
static __device__ __forceinline__ void cryptRange(uint4* dst, const uint4* src, size_t bytes, uint32_t stream,
                                                  uint2 key) {
  const size_t nVec = bytes / 16, nTail = bytes % 16;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nVec; i += stride) {
    const uint4 ks = philox(make_uint4((uint32_t)i, (uint32_t)(i >> 32), stream, 0u), key);
    const uint4 v = src[i];
    dst[i] = make_uint4(v.x ^ ks.x, v.y ^ ks.y, v.z ^ ks.z, v.w ^ ks.w);
  }
  if (blockIdx.x == 0 && threadIdx.x < nTail) {
    const uint4 ks = philox(make_uint4((uint32_t)nVec, (uint32_t)(nVec >> 32), stream, 0u), key);
    const uint32_t word = (&ks.x)[threadIdx.x / 4];
    ((unsigned char*)(dst + nVec))[threadIdx.x] =
        ((const unsigned char*)(src + nVec))[threadIdx.x] ^ (unsigned char)(word >> (8 * (threadIdx.x % 4)));
  }
}

static __device__ __forceinline__ uint2 blockKey(const unsigned long long* keyDev) {
  __shared__ unsigned long long key64;  // one read per CTA
  if (threadIdx.x == 0) key64 = *keyDev;
  __syncthreads();
  return make_uint2((uint32_t)key64, (uint32_t)(key64 >> 32));
}

__global__ void cryptKernel(uint4* dst, const uint4* src, size_t bytes, const unsigned long long* keyDev,
                            uint32_t stream) {
  cryptRange(dst, src, bytes, stream, blockKey(keyDev));
}

// Every input of a run unsealed by one launch: a run's fixed cost is one kernel, whatever the number of its inputs.
// A job is four 64-bit words: destination, source, bytes, keystream (the input's index).
__global__ void cryptAllKernel(const unsigned long long* jobs, int nJobs, const unsigned long long* keyDev) {
  const uint2 key = blockKey(keyDev);
  for (int j = 0; j < nJobs; ++j) {
    const unsigned long long* job = jobs + 4 * j;
    cryptRange((uint4*)job[0], (const uint4*)job[1], (size_t)job[2], (uint32_t)job[3], key);
  }
}

// The snapshot of a run's outputs into the judge's memory: a kernel on the runner's stream, so it is ordered
// behind that stream alone. (A cudaMemcpyAsync into another process's allocation may be serialised with the
// whole device, which would let work on a stream of the candidate's own into the snapshot.)
__global__ void snapshotKernel(uint4* dst, const uint4* src, size_t nVec, unsigned char* dstTail,
                               const unsigned char* srcTail, size_t nTail) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < nVec; i += stride) dst[i] = src[i];
  if (blockIdx.x == 0 && threadIdx.x < nTail) dstTail[threadIdx.x] = srcTail[threadIdx.x];
}

#define SNAPSHOT_THREADS 512
#define SNAPSHOT_MAX_CTAS 1024  // enough 16-byte loads in flight to run at memory speed on Hopper

// The grid of a kernel that moves nVec 16-byte vectors, a thread each, in grid-stride loops (snapshot, crypt).
static unsigned copyCtas(size_t nVec) {
  const size_t ctas = (nVec + SNAPSHOT_THREADS - 1) / SNAPSHOT_THREADS;
  return (unsigned)(ctas < 1 ? 1 : ctas > SNAPSHOT_MAX_CTAS ? SNAPSHOT_MAX_CTAS : ctas);
}

CUCO_EXPORT int cuco_h_snapshot(void* stream, void* dst, const void* src, size_t bytes) {
  if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) return fail("snapshot buffers must be 16-byte aligned");
  const size_t nVec = bytes / 16, nTail = bytes % 16;
  snapshotKernel<<<copyCtas(nVec), SNAPSHOT_THREADS, 0, (cudaStream_t)stream>>>(
      (uint4*)dst, (const uint4*)src, nVec, (unsigned char*)dst + nVec * 16, (const unsigned char*)src + nVec * 16,
      nTail);
  HCUDA(cudaGetLastError());
  return 0;
}

// The key is read from device memory when the kernel runs: for the candidate's process, the word its gate fetched
// from the host's page (one read over the bus, before the clock starts, where a read per CTA would cost a
// microsecond each, one after another); for the judge, which seals in place, a word it wrote itself.
CUCO_EXPORT int cuco_h_crypt(void* stream, void* dst, const void* src, size_t bytes, const void* keyDev,
                             unsigned streamId) {
  if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) return fail("sealed buffers must be 16-byte aligned");
  cryptKernel<<<copyCtas(bytes / 16), SNAPSHOT_THREADS, 0, (cudaStream_t)stream>>>(
      (uint4*)dst, (const uint4*)src, bytes, (const unsigned long long*)keyDev, streamId);
  HCUDA(cudaGetLastError());
  return 0;
}

// jobsDev: nJobs jobs of four 64-bit words in device memory (cryptAllKernel), written once per shape; maxBytes: the
// largest job's bytes, which sizes the grid.
CUCO_EXPORT int cuco_h_crypt_all(void* stream, const void* jobsDev, int nJobs, size_t maxBytes, const void* keyDev) {
  cryptAllKernel<<<copyCtas(maxBytes / 16), SNAPSHOT_THREADS, 0, (cudaStream_t)stream>>>(
      (const unsigned long long*)jobsDev, nJobs, (const unsigned long long*)keyDev);
  HCUDA(cudaGetLastError());
  return 0;
}
