"""The candidate's process for one rank: forked by its judge (candidate_handle.py), or
`python -m cuco.runner.processes.candidate_process FD`.

It confines itself (sandbox/) before the candidate is loaded, then does only what the judge asks over
the channel: set up a shape, stage inputs, run, tear down. It holds no seed, no reference, no other
rank's inputs and no clock that counts: on the CPU the judge times each run itself; on GPUs the judge's
clock runs from the start gate to the done flag this process's stream raises after the run and its
snapshot, and the CUDA events recorded here are only believed when they agree with it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cuco.runner.judge.verify import poison
from cuco.runner.processes.buffers import TORCH_DTYPES, Exchange, Layout, SharedRegion, attach_memfd_buffers, cuda_array
from cuco.runner.processes.channel import Channel, ChannelClosed, Reply
from cuco.runner.processes.harness import Harness
from cuco.runner.processes.loaded import CandidateError, CudaCandidate, PyContext, PythonCandidate
from cuco.runner.processes.pages import Page, key_offset
from cuco.runner.sandbox import confine, die_with_parent
from cuco.workload.spec import DELIVERED, VERIFIED

GATE_TIMEOUT_NS = 30_000_000_000  # a gate left closed this long means the judges never released it
PROBE_TIMEOUT_NS = 2_000_000_000  # first gated run: detects a cuco_run that blocks the host


class CandidateProcess:
    def __init__(self, chan: Channel, hello: Reply) -> None:
        d = hello.data
        self.chan = chan
        self.rank, self.world = int(d["rank"]), int(d["world"])
        self.language, self.cuda = str(d["candidate_language"]), d["device"] == "cuda"
        self.candidate, self.library = Path(d["candidate"]), d.get("library")
        self.device = torch.device("cuda", int(d["gpu"])) if self.cuda else torch.device("cpu")
        self.harness = Harness(d["harness"]) if d.get("harness") else None
        self.gate = Page(hello.fds[0]) if self.cuda else None
        self.done = Page(hello.fds[1]) if self.cuda else None
        self.comm = None
        self.nccl_group = None
        self.store_port = int(d["store_port"])
        self.shape: dict[str, Any] = {}

    # ---- start-up --------------------------------------------------------------------------------
    def init(self) -> None:
        store = dist.TCPStore("127.0.0.1", self.store_port, self.world, self.rank == 0, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world)
        if not self.cuda:
            self.stream, self.side_streams = None, []
            return
        torch.cuda.set_device(self.device)
        self.stream = torch.cuda.Stream(self.device)
        # Side stream 0 has the device's highest priority: communication issued there is scheduled ahead of
        # the waves of a GEMM already running on the main stream.
        self.side_streams = [torch.cuda.Stream(self.device, priority=-100), torch.cuda.Stream(self.device)]
        self.gate.register(self.harness)
        self.done.register(self.harness)
        self.timed_out = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.key = torch.zeros(2, dtype=torch.int64, device=self.device)  # a run's key, once fetched
        self.load_runner_kernels()
        if self.language == "cuda":
            if self.rank == 0:
                store.set("cuco_nccl_id", self.harness.unique_id())
            self.comm = self.harness.comm_init(self.rank, self.world, self.device.index, store.get("cuco_nccl_id"))

    def load_runner_kernels(self) -> None:
        """Launch the gate, snapshot, unsealing and done-flag kernels once. CUDA loads a kernel's module on its first
        launch and waits for the whole device to do so: in a run, that wait would let work on a stream the runner
        does not know finish before the snapshot."""
        s, scratch = self.stream.cuda_stream, torch.empty(16, dtype=torch.uint8, device=self.device)
        self.harness.gate(s, self.gate.dev_ptr, 0, GATE_TIMEOUT_NS, self.timed_out.data_ptr(),
                          self.gate.dev_ptr + key_offset(self.rank), self.key.data_ptr())
        self.harness.snapshot(s, scratch.data_ptr(), scratch.data_ptr(), 0)
        self.harness.crypt_all(s, scratch.data_ptr(), 0, 0, self.key.data_ptr())
        self.harness.signal(s, self.done.dev_ptr, 0)
        self.sync()

    def barrier(self) -> None:
        dist.barrier()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    # ---- shapes ----------------------------------------------------------------------------------
    def setup(self, msg: Reply) -> None:
        layouts = [Layout.from_json(b) for b in msg.data["buffers"]]
        params = {str(k): int(v) for k, v in msg.data["params"].items()}
        sym: list[tuple[int, int]] = []
        regions: list[SharedRegion] = []
        if self.cuda:  # descriptors: the exchange, then the parameters in the order of their sizes
            sizes = [int(msg.data["exchange"]), *map(int, msg.data["parameters"].values())]
            regions = [SharedRegion.open(self.harness, fd, n, self.device) for fd, n in zip(msg.fds, sizes)]
            shared = dict(zip(msg.data["parameters"], regions[1:]))
            bufs, sym = self.allocate(layouts, shared)
            exchange = Exchange(regions[0], layouts)
        else:
            bufs, exchange = attach_memfd_buffers(layouts, msg.fds), None
        cand, ctx, sides = self.make_candidate(layouts, bufs, sym, params)
        # The framework's own references: what the candidate does to ctx cannot redirect staging or snapshots.
        self.shape = {"layouts": layouts, "bufs": dict(bufs), "sym": sym, "cand": cand, "ctx": ctx,
                      "exchange": exchange, "regions": regions, "sides": sides}
        if self.cuda:
            self.shape["unseal"] = self.unseal_jobs(layouts, bufs, exchange)
        self.sync()
        self.barrier()
        cand.setup()
        self.sync()

    def unseal_jobs(self, layouts: list[Layout], bufs: dict[str, torch.Tensor],
                    exchange: Exchange) -> tuple[torch.Tensor, int, int]:
        """Each input's unsealing (its buffer, its staged copy, its bytes, its index as the keystream's), in device
        memory for the one kernel that unseals them all in a run; their count; the largest input's bytes."""
        jobs = [(bufs[lay.name].data_ptr(), exchange[f"stage:{lay.name}"].data_ptr(), lay.nbytes, n)
                for n, lay in enumerate(layouts) if lay.role in DELIVERED]
        if any(dst % 16 or src % 16 for dst, src, _, _ in jobs):
            raise RuntimeError("an input or its staging area is not 16-byte aligned")
        table = torch.tensor(jobs or [(0, 0, 0, 0)], dtype=torch.int64, device=self.device)
        return table, len(jobs), max((nbytes for _, _, nbytes, _ in jobs), default=0)

    def allocate(self, layouts: list[Layout],
                 shared: dict[str, SharedRegion]) -> tuple[dict[str, torch.Tensor], list[tuple[int, int]]]:
        """The candidate's buffers: windows, the judge's memory for the parameters it drew, the rest our own."""
        bufs, sym = {}, []
        for lay in layouts:
            if lay.role == "parameter":
                bufs[lay.name] = lay.view(shared[lay.name].tensor)
            elif self.language == "cuda" and lay.symmetric:
                ptr, win = self.harness.sym_alloc(self.comm, lay.nbytes)  # collective: same order on all ranks
                sym.append((ptr, win))
                bufs[lay.name] = lay.view(cuda_array(ptr, lay.nbytes, self.device))
            else:
                bufs[lay.name] = torch.empty(lay.shape, dtype=TORCH_DTYPES[lay.dtype], device=self.device)
        return bufs, sym

    def make_candidate(self, layouts, bufs, sym, params):
        """The candidate and its context. Of the side streams, it is given those it declares (cuco_needs, or
        SIDE_STREAMS in Python), which every run gates and joins (about 3 us each); its other side-stream slots are the
        main stream itself, so that work put there without a word is timed all the same."""
        if self.language == "cuda":
            h = self.harness
            ctx = h.ctx_new(self.rank, self.world, self.device.index, self.comm, self.stream.cuda_stream)
            cand = CudaCandidate(Path(self.library), h, ctx)
            slots, gated = self.side_streams_for(cand)
            for s in slots:
                h.ctx_add_stream(ctx, s.cuda_stream)
            windows = dict(sym)
            for lay in layouts:
                t = bufs[lay.name]
                h.ctx_add_buffer(ctx, lay.name, t.data_ptr(), lay.nbytes, lay.dtype, lay.shape, lay.symmetric,
                                 windows.get(t.data_ptr()))
            for k, v in params.items():
                h.ctx_add_param(ctx, k, v)
            return cand, ctx, gated
        group = self.torch_nccl_group() if self.cuda else dist.group.WORLD
        ctx = PyContext(self.rank, self.world, self.device, group, self.stream, [], dict(bufs), params)
        cand = PythonCandidate(self.candidate, ctx)
        ctx.side_streams, gated = self.side_streams_for(cand)
        return cand, None, gated

    def side_streams_for(self, cand) -> tuple[list, list]:
        """(Every side-stream slot, the side streams a run gates and joins): the streams the candidate declares
        (more than there are: cuco_needs then fails, saying so), then the main stream in the other slots."""
        gated = self.side_streams[:min(cand.declared_side_streams, len(self.side_streams))]
        return gated + [self.stream] * (len(self.side_streams) - len(gated)), gated

    def torch_nccl_group(self):
        if self.nccl_group is None:
            self.nccl_group = dist.new_group(backend="nccl", device_id=self.device)  # type: ignore[call-arg]
        return self.nccl_group

    def teardown(self) -> None:
        sh = self.shape
        self.barrier()
        sh["cand"].teardown()
        self.sync()
        for ptr, win in sh["sym"]:
            self.harness.sym_free(self.comm, ptr, win)
        if sh["ctx"] is not None:
            self.harness.ctx_free(sh["ctx"])
        for region in sh["regions"]:
            region.close()
        self.shape = {}

    # ---- runs ------------------------------------------------------------------------------------
    def stage(self) -> None:
        """GPU: outputs and scratch poisoned before a run (untimed). The run's inputs are not here yet: they arrive
        sealed, and are unsealed into the candidate's buffers inside the timed region (run_gpu)."""
        sh = self.shape
        with torch.cuda.stream(self.stream):
            for lay in sh["layouts"]:
                if lay.role in ("output", "scratch"):
                    poison(sh["bufs"][lay.name])
        self.sync()

    def run_cpu(self, msg: Reply) -> None:
        """The candidate's run; a null run (the runner's own floor, timed by the judge) does nothing at all."""
        if not msg.data.get("null"):
            self.shape["cand"].run()

    def run_gpu(self, msg: Reply) -> None:
        """Gate (which fetches the run's key), start event, the run's inputs unsealed by one kernel, the candidate's
        run, every stream joined, snapshot, done flag: all in stream order."""
        sh, s = self.shape, self.stream
        target = msg.data.get("gate")
        key = self.gate.dev_ptr + key_offset(self.rank)
        if target is not None:  # the gate fetches the key (the judge writes it before it opens the gate)
            timeout = PROBE_TIMEOUT_NS if msg.data.get("probe") else GATE_TIMEOUT_NS
            self.harness.gate(s.cuda_stream, self.gate.dev_ptr, int(target), timeout, self.timed_out.data_ptr(), key,
                              self.key.data_ptr())
        else:  # an ungated run's key is written before the run is asked for
            self.harness.snapshot(s.cuda_stream, self.key.data_ptr(), key, 8)
        start = torch.cuda.Event(enable_timing=True)
        start.record(s)
        jobs, count, largest = sh["unseal"]
        self.harness.crypt_all(s.cuda_stream, jobs.data_ptr(), count, largest, self.key.data_ptr())
        delivered = torch.cuda.Event()
        delivered.record(s)
        for side in sh["sides"]:
            side.wait_event(delivered)
        if not msg.data.get("null"):
            sh["cand"].run()
        ends = []
        for st in (s, *sh["sides"]):
            e = torch.cuda.Event(enable_timing=True)
            e.record(st)
            ends.append(e)
        for e in ends[1:]:
            s.wait_event(e)
        for lay in sh["layouts"]:
            if lay.role in (*VERIFIED, "input"):
                area = "out" if lay.role in VERIFIED else "inputs_after"
                dst, src = sh["exchange"][f"{area}:{lay.name}"], sh["bufs"][lay.name]
                self.harness.snapshot(s.cuda_stream, dst.data_ptr(), src.data_ptr(), lay.nbytes)
        self.harness.signal(s.cuda_stream, self.done.dev_ptr, int(msg.data["seq"]))
        self.chan.send("queued")
        self.sync()
        gate_timed_out = bool(self.timed_out.item())
        self.timed_out.zero_()
        self.chan.send("finished", ms=[max(start.elapsed_time(e) for e in ends)], gate_timed_out=gate_timed_out)

    def serve(self) -> None:
        """Until the judge goes; it kills this process once it has every reply it needs."""
        while True:
            try:
                msg = self.chan.recv()
            except ChannelClosed:
                return
            where = msg.data.get("where", msg.kind)
            try:
                if msg.kind == "setup":
                    self.setup(msg)
                    self.chan.send("ok")
                elif msg.kind == "teardown":
                    self.teardown()
                    self.chan.send("ok")
                elif msg.kind == "stage":
                    self.stage()
                    self.chan.send("staged")
                elif msg.kind == "run" and not self.cuda:
                    self.run_cpu(msg)
                    self.chan.send("done")
                elif msg.kind == "run":
                    self.run_gpu(msg)
                else:
                    raise ValueError(f"unknown command {msg.kind!r}")
            except CandidateError as exc:
                self.chan.send("error", message=str(exc), where=where)
            except Exception as exc:  # not the candidate's own report: the runner's side failed under it
                self.chan.send("error", message=f"{type(exc).__name__}: {exc}", where=where, framework=True,
                               traceback=traceback.format_exc(limit=6))


def scrub_environment(scratch: Path, tmp: Path) -> None:
    """Caches go to the host's scratch folder and temporary files to the folder all ranks share (processes of one
    program find each other's sockets in TMPDIR); keys of the driver's stay out."""
    for key in list(os.environ):
        if any(w in key.upper() for w in ("KEY", "TOKEN", "SECRET", "PASSWORD")) or key == "CUCO_HOME":
            del os.environ[key]
    os.environ["TMPDIR"] = str(tmp)
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("XDG_CACHE_HOME", "cache"),
                     ("CUDA_CACHE_PATH", "nv"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        os.environ[var] = str(scratch / sub)
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    sys.dont_write_bytecode = True


def must_read(hello: dict[str, Any]) -> list[Path]:
    """What this process reads after it gives up root: the interpreter and its packages (torch and Triton import
    lazily), cuco, the toolkit's libraries, the candidate, its build and the harness."""
    import cuco

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *sys.path, os.path.dirname(os.path.dirname(cuco.__file__)),
             *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep), os.environ.get("CUDA_HOME", ""),
             hello["candidate"], hello.get("library") or "", hello.get("harness") or ""]
    return [Path(p) for p in dict.fromkeys(paths) if p and os.path.isabs(p)]


def main(argv: list[str]) -> int:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # the judge blocks it for its own watcher
    judge = os.getppid()
    die_with_parent(judge)
    chan = Channel(socket.socket(fileno=int(argv[0])))
    hello = chan.expect("hello")
    # Until "ready" no code of the candidate's has run: a failure here is the runner's own, and says so.
    try:
        scratch, tmp = Path(hello.data["scratch"]), Path(hello.data["tmp"])
        scrub_environment(scratch, tmp)
        uid = hello.data.get("uid")
        confinement = confine(scratch, tmp, uid=None if uid is None else int(uid), parent=judge,
                              readable=must_read(hello.data))
        host = CandidateProcess(chan, hello)
        host.init()
    except Exception as exc:
        chan.send("error", message=f"cuco could not start the candidate's process: {type(exc).__name__}: {exc}",
                  where="start-up", framework=True)
        return 3
    chan.send("ready", sandbox=confinement.describe())
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
