"""ctypes binding to the C++ harness (cuda/harness.cu): NCCL communicator, symmetric windows, ctx, gate."""

from __future__ import annotations

import ctypes
from pathlib import Path

from cuco.dtypes import c_code

NCCL_UNIQUE_ID_BYTES = 128  # from nccl.h


class HarnessError(RuntimeError):
    pass


class Harness:
    def __init__(self, library: str | Path) -> None:
        self.lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
        L = self.lib
        vp, sz, i, c = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p
        u64, i64 = ctypes.c_ulonglong, ctypes.c_int64
        L.cuco_h_last_error.restype = c
        L.cuco_h_ctx_error.restype = c
        L.cuco_h_ctx_error.argtypes = [vp]
        L.cuco_h_ctx_new.restype = vp
        L.cuco_h_ctx_new.argtypes = [i, i, i, vp, vp]
        L.cuco_h_ctx_free.argtypes = [vp]
        L.cuco_h_ctx_add_stream.argtypes = [vp, vp]
        L.cuco_h_ctx_add_buffer.argtypes = [vp, c, vp, sz, i, i, ctypes.POINTER(i64), i, vp]
        L.cuco_h_ctx_add_param.argtypes = [vp, c, i64]
        L.cuco_h_unique_id.argtypes = [ctypes.c_char_p]
        L.cuco_h_comm_init.argtypes = [i, i, i, ctypes.c_char_p, ctypes.POINTER(vp)]
        L.cuco_h_sym_alloc.argtypes = [vp, sz, ctypes.POINTER(vp), ctypes.POINTER(vp)]
        L.cuco_h_sym_free.argtypes = [vp, vp, vp]
        L.cuco_h_host_register.argtypes = [vp, sz, ctypes.POINTER(vp)]
        L.cuco_h_host_unregister.argtypes = [vp]
        L.cuco_h_gate.argtypes = [vp, vp, u64, u64, vp, vp, vp]
        L.cuco_h_signal.argtypes = [vp, vp, u64]
        L.cuco_h_snapshot.argtypes = [vp, vp, vp, sz]
        L.cuco_h_crypt.argtypes = [vp, vp, vp, sz, vp, ctypes.c_uint]
        L.cuco_h_crypt_all.argtypes = [vp, vp, i, sz, vp]
        L.cuco_h_nccl_version.argtypes = [ctypes.POINTER(i)]
        L.cuco_h_devcomm_create.argtypes = [vp, vp]
        L.cuco_h_devcomm_destroy.argtypes = [vp]
        L.cuco_h_check_needs.argtypes = [vp, vp]
        L.cuco_h_declared_side_streams.argtypes = [vp]
        L.cuco_h_share_alloc.argtypes = [i, sz, ctypes.POINTER(vp), ctypes.POINTER(i), ctypes.POINTER(sz)]
        L.cuco_h_share_import.argtypes = [i, i, sz, ctypes.POINTER(vp)]
        L.cuco_h_share_free.argtypes = [vp, sz]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise HarnessError(f"{what}: {self.lib.cuco_h_last_error().decode(errors='replace')}")

    def nccl_version(self) -> int:
        v = ctypes.c_int()
        self._check(self.lib.cuco_h_nccl_version(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self) -> bytes:
        buf = ctypes.create_string_buffer(NCCL_UNIQUE_ID_BYTES)
        self._check(self.lib.cuco_h_unique_id(buf), "ncclGetUniqueId")
        return buf.raw

    def comm_init(self, rank: int, world: int, device: int, uid: bytes) -> int:
        comm = ctypes.c_void_p()
        self._check(self.lib.cuco_h_comm_init(rank, world, device, uid, ctypes.byref(comm)), "ncclCommInitRank")
        return comm.value

    def sym_alloc(self, comm: int, nbytes: int) -> tuple[int, int]:
        ptr, win = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.lib.cuco_h_sym_alloc(comm, nbytes, ctypes.byref(ptr), ctypes.byref(win)),
                    "ncclMemAlloc/WindowRegister")
        return ptr.value, win.value

    def sym_free(self, comm: int, ptr: int, win: int) -> None:
        self._check(self.lib.cuco_h_sym_free(comm, ptr, win), "ncclCommWindowDeregister/ncclMemFree")

    def host_register(self, host_ptr: int, nbytes: int) -> int:
        dev = ctypes.c_void_p()
        self._check(self.lib.cuco_h_host_register(host_ptr, nbytes, ctypes.byref(dev)), "cudaHostRegister")
        return dev.value

    def host_unregister(self, host_ptr: int) -> None:
        self._check(self.lib.cuco_h_host_unregister(host_ptr), "cudaHostUnregister")

    def share_alloc(self, device: int, nbytes: int) -> tuple[int, int, int]:
        """New device memory another process can map: (pointer, descriptor, bytes mapped, rounded up)."""
        ptr, fd, mapped = ctypes.c_void_p(), ctypes.c_int(-1), ctypes.c_size_t()
        self._check(self.lib.cuco_h_share_alloc(device, nbytes, ctypes.byref(ptr), ctypes.byref(fd),
                                                ctypes.byref(mapped)), "cuMemCreate/cuMemExportToShareableHandle")
        return ptr.value, fd.value, mapped.value

    def share_import(self, device: int, fd: int, nbytes: int) -> int:
        """The device memory behind a descriptor from share_alloc, mapped here; returns its pointer."""
        ptr = ctypes.c_void_p()
        self._check(self.lib.cuco_h_share_import(device, fd, nbytes, ctypes.byref(ptr)),
                    "cuMemImportFromShareableHandle/cuMemMap")
        return ptr.value

    def share_free(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cuco_h_share_free(ptr, nbytes), "cuMemUnmap/cuMemAddressFree")

    def gate(self, stream: int, counter_dev: int, target: int, timeout_ns: int, timed_out_dev: int, key_src: int,
             key_dst: int) -> None:
        """Wait for the counter to reach target, then copy the 64-bit key at key_src (the host's page) to key_dst."""
        self._check(self.lib.cuco_h_gate(stream, counter_dev, target, timeout_ns, timed_out_dev, key_src, key_dst),
                    "gate launch")

    def signal(self, stream: int, flag_dev: int, value: int) -> None:
        self._check(self.lib.cuco_h_signal(stream, flag_dev, value), "done-flag launch")

    def snapshot(self, stream: int, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cuco_h_snapshot(stream, dst, src, nbytes), "snapshot launch")

    def crypt(self, stream: int, dst: int, src: int, nbytes: int, key_dev: int, stream_id: int) -> None:
        """dst = src XOR the keystream of the 64-bit key at key_dev (read when the kernel runs) and stream_id."""
        self._check(self.lib.cuco_h_crypt(stream, dst, src, nbytes, key_dev, stream_id), "crypt launch")

    def crypt_all(self, stream: int, jobs_dev: int, n_jobs: int, max_bytes: int, key_dev: int) -> None:
        """crypt() of every job (destination, source, bytes, stream id: four 64-bit words each) in one launch."""
        self._check(self.lib.cuco_h_crypt_all(stream, jobs_dev, n_jobs, max_bytes, key_dev), "crypt launch")

    # --- the cuco_ctx_t handed to CUDA candidates ---
    def ctx_new(self, rank: int, world: int, device: int, comm: int, stream: int) -> int:
        ctx = self.lib.cuco_h_ctx_new(rank, world, device, comm, stream)
        if not ctx:
            raise HarnessError("cuco_h_ctx_new: out of memory")
        return ctx

    def ctx_add_stream(self, ctx: int, stream: int) -> None:
        self._check(self.lib.cuco_h_ctx_add_stream(ctx, stream), "ctx side stream")

    def ctx_add_buffer(self, ctx: int, name: str, ptr: int, nbytes: int, dtype: str, shape: tuple[int, ...],
                       symmetric: bool, window: int | None) -> None:
        arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        rc = self.lib.cuco_h_ctx_add_buffer(ctx, name.encode(), ptr, nbytes, c_code(dtype), len(shape), arr,
                                            int(symmetric), window or None)
        self._check(rc, f"ctx buffer {name}")

    def ctx_add_param(self, ctx: int, name: str, value: int) -> None:
        self._check(self.lib.cuco_h_ctx_add_param(ctx, name.encode(), value), f"ctx param {name}")

    def devcomm_create(self, ctx: int, requirements_fn: int) -> None:
        self._check(self.lib.cuco_h_devcomm_create(ctx, requirements_fn), "ncclDevCommCreate")

    def check_needs(self, ctx: int, needs_fn: int) -> str | None:
        """Why this run cannot give the candidate what its cuco_needs says it needs, or None."""
        if self.lib.cuco_h_check_needs(ctx, needs_fn) != 0:
            return self.lib.cuco_h_last_error().decode()
        return None

    def declared_side_streams(self, needs_fn: int) -> int:
        """How many side streams the candidate's cuco_needs says it enqueues on."""
        return int(self.lib.cuco_h_declared_side_streams(needs_fn))

    def devcomm_destroy(self, ctx: int) -> None:
        self._check(self.lib.cuco_h_devcomm_destroy(ctx), "ncclDevCommDestroy")

    def ctx_error(self, ctx: int) -> str:
        return self.lib.cuco_h_ctx_error(ctx).decode(errors="replace")

    def ctx_free(self, ctx: int) -> None:
        self.lib.cuco_h_ctx_free(ctx)
