"""A candidate as the worker sees it: setup / run / teardown, whatever language it is written in."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuco.runner.build.static_checks import SourceError, python_text
from cuco.runner.processes.harness import Harness


class CandidateError(RuntimeError):
    """The candidate itself failed (a non-zero return, an exception); the message is its own."""


@dataclass
class PyContext:
    """What a Python candidate's setup(ctx) / run(ctx) / teardown(ctx) receive."""

    rank: int
    world: int
    device: Any  # torch.device
    group: Any  # torch.distributed group for the candidate's own communication (nccl on GPUs, gloo on CPU)
    stream: Any  # torch.cuda.Stream, or None on the CPU
    # gated and timed like the main stream: as many as the module's SIDE_STREAMS declares, the rest of the list the
    # main stream itself (empty on the CPU)
    side_streams: list[Any]
    buffers: dict[str, Any]  # name -> torch.Tensor
    params: dict[str, int]
    state: dict[str, Any] = field(default_factory=dict)


class PythonCandidate:
    def __init__(self, path: Path, ctx: PyContext) -> None:
        # The text the static checks read, compiled as text: the importer would decode the bytes itself, by any
        # coding declaration they make, into other code than was checked.
        try:
            text = python_text(path.read_bytes(), path.name)
        except SourceError as exc:
            raise CandidateError(str(exc)) from None
        spec = importlib.util.spec_from_file_location(f"cuco_candidate_{path.stem}", path)
        assert spec and spec.loader
        self.module = importlib.util.module_from_spec(spec)
        exec(compile(text, str(path), "exec", dont_inherit=True), self.module.__dict__)
        self.ctx = ctx

    @property
    def declared_side_streams(self) -> int:
        """The side streams the module says it enqueues on (SIDE_STREAMS = n; none where it says nothing)."""
        n = getattr(self.module, "SIDE_STREAMS", 0)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise CandidateError(f"SIDE_STREAMS must be a count of side streams, got {n!r}")
        return n

    def _stream(self):
        if self.ctx.stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self.ctx.stream)

    def _call(self, name: str) -> None:
        fn = getattr(self.module, name, None)
        if fn is None:
            if name == "run":
                raise CandidateError("candidate defines no run(ctx)")
            return
        try:
            with self._stream():
                fn(self.ctx)
        except Exception as exc:  # the candidate's own failure, reported as such
            raise CandidateError(f"{name}: {type(exc).__name__}: {exc}") from exc

    def setup(self) -> None:
        self._call("setup")

    def run(self) -> None:
        self._call("run")

    def teardown(self) -> None:
        self._call("teardown")


class CudaCandidate:
    """A shared library with cuco_setup / cuco_run / cuco_teardown, driven through a harness-made ctx."""

    def __init__(self, library: Path, harness: Harness, ctx: int) -> None:
        self.lib = ctypes.CDLL(str(library))
        self.harness, self.ctx = harness, ctx
        for name in ("cuco_setup", "cuco_run", "cuco_teardown"):
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise CandidateError(f"library exports no {name} (declare it CUCO_EXPORT int {name}(cuco_ctx_t*))")
            fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int

    @property
    def declared_side_streams(self) -> int:
        """The side streams its cuco_needs says it enqueues on (none without cuco_needs)."""
        needs = getattr(self.lib, "cuco_needs", None)
        return 0 if needs is None else self.harness.declared_side_streams(ctypes.cast(needs, ctypes.c_void_p).value)

    def _call(self, name: str) -> None:
        rc = getattr(self.lib, name)(self.ctx)
        if rc != 0:
            raise CandidateError(f"{name} returned {rc}: {self.harness.ctx_error(self.ctx) or 'no reason given'}")

    def setup(self) -> None:
        req = getattr(self.lib, "cuco_dev_requirements", None)
        if req is not None:  # collective: every rank runs the same candidate
            self.harness.devcomm_create(self.ctx, ctypes.cast(req, ctypes.c_void_p).value)
        needs = getattr(self.lib, "cuco_needs", None)
        if needs is not None:
            unmet = self.harness.check_needs(self.ctx, ctypes.cast(needs, ctypes.c_void_p).value)
            if unmet:
                raise CandidateError(f"cuco_needs: {unmet}")
        self._call("cuco_setup")

    def run(self) -> None:
        self._call("cuco_run")

    def teardown(self) -> None:
        self._call("cuco_teardown")
        self.harness.devcomm_destroy(self.ctx)
