"""One rank of an evaluation: `python -m cuco.runner.worker JOB.json RANK`.

It runs the job's stages (L2/L3 correctness, L4 timing) in order, appends each step to
rank<R>.progress (the launcher reports the last one when a rank hangs) and writes rank<R>.json.
Ranks agree on every verdict before going on, so one rank's failure stops them all cleanly.
Imports only what a GPU image has: torch, numpy and cuco itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from cuco.runner.candidate import CandidateError, CudaCandidate, PyContext, PythonCandidate
from cuco.runner.harness import Harness, HarnessError
from cuco.runner.job import Job, Stage
from cuco.runner.timing import Gate, time_cpu, time_cuda
from cuco.runner.verify import Check, compare, poison, same
from cuco.workload.spec import WorkloadSpec, load_workload

TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "f64": torch.float64,
                "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64}
L2_FLUSH_BYTES = 2 * 60 * 2**20  # twice the largest Hopper L2 (60 MB on H200): evicts everything


class StageFailed(Exception):
    pass


class _CudaArray:
    """Lets torch view memory the harness allocated (ncclMemAlloc) without copying."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def load_reference(spec: WorkloadSpec):
    mod_spec = importlib.util.spec_from_file_location(f"cuco_reference_{spec.name}", spec.reference_path)
    assert mod_spec and mod_spec.loader
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    for fn in ("make_inputs", "reference"):
        if not callable(getattr(mod, fn, None)):
            raise CandidateError(f"{spec.reference_path}: defines no {fn}()")
    return mod


class Worker:
    def __init__(self, job: Job, rank: int) -> None:
        self.job, self.rank, self.world = job, rank, job.world
        self.out = Path(job.out_dir)
        self.progress = open(self.out / f"rank{rank}.progress", "a", buffering=1)
        self.spec = load_workload(Path(job.workload_root), job.world)
        self.ref = load_reference(self.spec)
        self.cuda = job.device == "cuda"
        self.device = torch.device("cuda", job.gpus[rank] if job.gpus else rank) if self.cuda else torch.device("cpu")
        self.harness: Harness | None = None
        self.comm = None
        self.gate: Gate | None = None
        self.nccl_group = None

    # ---- plumbing -------------------------------------------------------------------------------
    def mark(self, what: str) -> None:
        self.progress.write(what + "\n")

    def barrier(self) -> None:
        dist.barrier(group=self.gloo)

    def any_rank(self, flag: bool) -> bool:
        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.gloo)
        return bool(t.item())

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.gloo)
        return out

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def init(self) -> None:
        self.mark("init: process group")
        store = dist.TCPStore("127.0.0.1", self.job.master_port, self.world, self.rank == 0,
                              timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world)
        self.gloo = dist.group.WORLD
        self.store = store
        if self.cuda:
            torch.cuda.set_device(self.device)
            torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
            self.stream = torch.cuda.Stream(self.device)
            # Side stream 0 has the device's highest priority: communication issued there (barrier, put
            # and copy kernels) is scheduled ahead of the waves of a GEMM already running on the main stream.
            self.side_streams = [torch.cuda.Stream(self.device, priority=-100), torch.cuda.Stream(self.device)]
            self.flush_buf = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=self.device)
            if self.job.harness:
                self.harness = Harness(self.job.harness)
                if self.job.gate_file:
                    self.gate = Gate(self.harness, self.job.gate_file, self.rank, self.device)
            if self.job.kind == "cuda":
                self.mark("init: NCCL communicator")
                assert self.harness is not None, "CUDA candidates need the harness library"
                if self.rank == 0:
                    store.set("cuco_nccl_id", self.harness.unique_id())
                uid = store.get("cuco_nccl_id")
                self.comm = self.harness.comm_init(self.rank, self.world, self.device.index, uid)
        else:
            self.stream, self.side_streams, self.flush_buf = None, [], None

    def torch_nccl_group(self):
        if self.nccl_group is None:
            self.nccl_group = dist.new_group(backend="nccl", device_id=self.device)  # type: ignore[call-arg]
        return self.nccl_group

    # ---- buffers and candidate ------------------------------------------------------------------
    def allocate(self, env: dict[str, int]) -> tuple[dict[str, torch.Tensor], list[tuple[int, int]]]:
        bufs, sym = {}, []
        for b in self.spec.buffers.values():
            dims, nbytes = b.dims(env), b.nbytes(env)
            if self.job.kind == "cuda" and b.symmetric:
                ptr, win = self.harness.sym_alloc(self.comm, nbytes)  # collective, same order on all ranks
                raw = torch.as_tensor(_CudaArray(ptr, nbytes), device=self.device)
                sym.append((ptr, win))
                bufs[b.name] = raw.view(TORCH_DTYPES[b.dtype]).view(dims)
            else:
                bufs[b.name] = torch.empty(dims, dtype=TORCH_DTYPES[b.dtype], device=self.device)
        return bufs, sym

    def make_candidate(self, bufs: dict[str, torch.Tensor], sym: list[tuple[int, int]], params: dict[str, int]):
        if self.job.kind == "cuda":
            h = self.harness
            ctx = h.ctx_new(self.rank, self.world, self.device.index, self.comm, self.stream.cuda_stream)
            for s in self.side_streams:
                h.ctx_add_stream(ctx, s.cuda_stream)
            windows = {ptr: win for ptr, win in sym}
            for b in self.spec.buffers.values():
                t = bufs[b.name]
                h.ctx_add_buffer(ctx, b.name, t.data_ptr(), t.numel() * t.element_size(), b.dtype, tuple(t.shape),
                                 b.symmetric, windows.get(t.data_ptr()))
            for k, v in params.items():
                h.ctx_add_param(ctx, k, v)
            return CudaCandidate(Path(self.job.library), h, ctx), ctx
        group = self.torch_nccl_group() if self.cuda else self.gloo
        ctx = PyContext(self.rank, self.world, self.device, group, self.stream, self.side_streams, bufs, params)
        return PythonCandidate(Path(self.job.candidate), ctx), None

    def free(self, sym: list[tuple[int, int]], ctx: int | None) -> None:
        self.sync()
        for ptr, win in sym:
            self.harness.sym_free(self.comm, ptr, win)
        if ctx is not None:
            self.harness.ctx_free(ctx)

    # ---- inputs ---------------------------------------------------------------------------------
    def inputs_for(self, params: dict[str, int], seed: int) -> list[dict[str, torch.Tensor]]:
        """Every rank's inputs, from per-rank seeds, so each rank computes its reference alone."""
        out = []
        for r in range(self.world):
            gen = torch.Generator(device=self.device).manual_seed(seed * 1_000_003 + r)
            out.append(self.ref.make_inputs(params, self.world, r, gen, self.device))
        return out

    def load_inputs(self, bufs: dict[str, torch.Tensor], mine: dict[str, torch.Tensor]) -> None:
        for b in self.spec.buffers.values():
            if b.role == "input":
                if b.name not in mine:
                    raise CandidateError(f"reference.make_inputs returned no {b.name!r}")
                bufs[b.name].copy_(mine[b.name])
            else:
                poison(bufs[b.name])

    def outputs(self) -> list[str]:
        return [b.name for b in self.spec.buffers.values() if b.role == "output"]

    def poison_outputs(self, bufs: dict[str, torch.Tensor]) -> None:
        for name in self.outputs():
            poison(bufs[name])

    def run_once(self, cand, bufs) -> None:
        self.poison_outputs(bufs)
        self.sync()
        self.barrier()
        cand.run()
        self.sync()

    # ---- stages ---------------------------------------------------------------------------------
    def agree(self, checks: list[Check], stage: Stage, what: str) -> None:
        mine = [c.message for c in checks if not c.ok]
        allv = self.gather(mine)
        failures = [f"rank {r}: {m}" for r, ms in enumerate(allv) for m in ms]
        if failures:
            raise StageFailed(f"{stage.level} {stage.shape} {what}: " + "; ".join(failures[:6]))

    def correctness(self, stage: Stage, cand, bufs, params, seed: int) -> dict[str, Any]:
        tol = self.spec.tolerance
        errors: list[float] = []
        for trial in range(self.spec.timing.trials):
            self.mark(f"{stage.level} {stage.shape} trial {trial}: inputs")
            inputs = self.inputs_for(params, seed + trial)
            self.load_inputs(bufs, inputs[self.rank])
            before = {k: bufs[k].clone() for k in inputs[self.rank]}
            self.mark(f"{stage.level} {stage.shape} trial {trial}: run")
            self.run_once(cand, bufs)
            expected = self.ref.reference(params, self.world, self.rank, inputs)
            checks = [compare(n, bufs[n], expected[n], tol.rtol, tol.atol, tol.norm_rtol) for n in self.outputs()]
            self.agree(checks, stage, f"trial {trial} (seed {seed + trial})")
            errors += [c.norm_rel_err or 0.0 for c in checks]
            first = {n: bufs[n].clone() for n in self.outputs()}
            self.mark(f"{stage.level} {stage.shape} trial {trial}: determinism run")
            self.run_once(cand, bufs)
            if tol.determinism == "bitwise":
                checks = [same(n, bufs[n], first[n], "two runs on the same inputs differ") for n in self.outputs()]
            else:
                checks = [compare(n, bufs[n], first[n], tol.rtol, tol.atol, tol.norm_rtol) for n in self.outputs()]
            checks += [same(k, bufs[k], v, "input changed by the run") for k, v in before.items()]
            self.agree(checks, stage, f"trial {trial}")
        return {"level": stage.level, "shape": stage.shape, "ok": True, "trials": self.spec.timing.trials,
                "max_norm_rel_err": max(errors) if errors else 0.0}

    def timed(self, run: Callable[[], None], before: Callable[[], None], warmup: int, iters: int):
        if self.cuda:
            return time_cuda(run, before, self.barrier, self.any_rank, self.stream, self.side_streams, self.gate,
                             warmup, iters)
        return time_cpu(run, before, self.barrier, warmup, iters)

    def timing(self, stage: Stage, cand, bufs, params, seed: int) -> dict[str, Any]:
        t = self.spec.timing
        warmup = self.job.warmup if self.job.warmup is not None else t.warmup
        iters = self.job.iters if self.job.iters is not None else t.iters
        inputs = self.inputs_for(params, seed)
        self.load_inputs(bufs, inputs[self.rank])

        def before() -> None:
            with self._on_stream():
                self.poison_outputs(bufs)
                if t.l2_flush and self.flush_buf is not None:
                    self.flush_buf.zero_()

        self.mark(f"L4 {stage.shape}: timing candidate")
        res = self.timed(cand.run, before, warmup, iters)
        self.sync()
        # The last timed iteration ran on poisoned outputs: it must still be right (catches skipped work).
        expected = self.ref.reference(params, self.world, self.rank, inputs)
        tol = self.spec.tolerance
        checks = [compare(n, bufs[n], expected[n], tol.rtol, tol.atol, tol.norm_rtol) for n in self.outputs()]
        final_errors = [f"rank {r}: {m}" for r, ms in enumerate(self.gather([c.message for c in checks if not c.ok]))
                        for m in ms]
        out: dict[str, Any] = {"level": "L4", "shape": stage.shape, "ok": True,
                               "per_rank_ms": self.gather(res.times_ms), "gated": res.gated, "note": res.note,
                               "final_output_errors": final_errors}
        out.update(self.reference_timings(params, inputs, bufs, before, warmup, iters))
        return out

    def reference_timings(self, params, inputs, bufs, before, warmup: int, iters: int) -> dict[str, Any]:
        """The bound's measured half: the workload's compute alone (best library), and its collective alone."""
        out: dict[str, Any] = {}
        for key in ("compute_alone", "comm_alone"):
            factory = getattr(self.ref, key, None)
            if factory is None:
                continue
            group = (self.torch_nccl_group() if self.cuda else self.gloo) if key == "comm_alone" else None
            self.mark(f"L4: timing {key}")
            fn = factory(params, self.world, self.rank, inputs, bufs, group)
            with self._on_stream():  # the reference ops run on the same stream the candidate gets
                res = self.timed(fn, before, warmup, max(10, min(iters, 30)))
            out[f"{key}_per_rank_ms"] = self.gather(res.times_ms)
        return out

    def _on_stream(self):
        import contextlib

        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def run_stages(self) -> list[dict[str, Any]]:
        results = []
        by_shape: dict[str, list[Stage]] = {}
        for st in self.job.stages:
            by_shape.setdefault(st.shape, []).append(st)
        for shape_name, stages in by_shape.items():
            shape = self.spec.shape(shape_name)
            params, env = dict(shape.params), shape.env(self.world)
            self.mark(f"{stages[0].level} {shape_name}: allocate")
            bufs, sym = self.allocate(env)
            cand, ctx = self.make_candidate(bufs, sym, params)
            self.mark(f"{stages[0].level} {shape_name}: setup")
            self.sync()
            self.barrier()
            cand.setup()
            self.sync()
            seed = self.job.seed + 7919 * (1 + list(by_shape).index(shape_name))
            for st in stages:
                if st.level in ("L2", "L3"):
                    results.append(self.correctness(st, cand, bufs, params, seed))
                else:
                    results.append(self.timing(st, cand, bufs, params, seed + 101))
                self.write_partial(results)
            self.mark(f"{shape_name}: teardown")
            self.barrier()
            cand.teardown()
            self.free(sym, ctx)
        return results

    def write_partial(self, results: list[dict[str, Any]]) -> None:
        _write_json(self.out / f"rank{self.rank}.json", {"rank": self.rank, "stages": results, "error": None,
                                                          "done": False})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _die_with_parent() -> None:
    """Ranks run in their own process groups (for the watchdog); if the launcher itself is killed, the kernel
    kills them too instead of leaving orphans (Linux PR_SET_PDEATHSIG; elsewhere a no-op)."""
    import ctypes
    import signal

    parent = int(os.environ.get("CUCO_LAUNCHER_PID", "0"))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def main(argv: list[str]) -> int:
    _die_with_parent()
    job, rank = Job.read(Path(argv[0])), int(argv[1])
    out = Path(job.out_dir) / f"rank{rank}.json"
    worker = None
    stages: list[dict[str, Any]] = []
    try:
        worker = Worker(job, rank)
        worker.init()
        stages = worker.run_stages()
        _write_json(out, {"rank": rank, "stages": stages, "error": None, "done": True})
        dist.destroy_process_group()
        return 0
    except StageFailed as exc:
        prev = json.loads(out.read_text())["stages"] if out.is_file() else []
        _write_json(out, {"rank": rank, "stages": prev, "error": str(exc), "kind": "verification", "done": True})
        return 0
    except (CandidateError, HarnessError, Exception) as exc:  # the worker reports every failure as data
        prev = json.loads(out.read_text())["stages"] if out.is_file() else []
        kind = "candidate" if isinstance(exc, CandidateError) else "harness" if isinstance(exc, HarnessError) else "crash"
        _write_json(out, {"rank": rank, "stages": prev, "error": f"{type(exc).__name__}: {exc}", "kind": kind,
                          "traceback": traceback.format_exc(limit=8), "done": True})
        sys.stderr.write(traceback.format_exc())
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
