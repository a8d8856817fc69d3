"""nvcc builds of CUDA candidates into shared libraries, cached by content hash.

The key covers what the compiler sees: the preprocessed translation unit of both of nvcc's passes (host and device),
which holds the text of every file the candidate includes, plus the command template and the toolchain's versions.
So an edited header, wherever it lies, or a changed toolchain never reuses a stale library. A failed build is cached
too, with the compiler's output, so the proposer sees the same diagnostics without paying for the compile again.

The source is preprocessed and compiled as `candidate.cu` in a fresh folder of the build cache, alone: a file beside
the original candidate is not there, and a relative `#include` resolves the same for the preprocessor and the
compiler. Libraries link the CUDA runtime as a shared library (`-cudart shared`): with nvcc's default, the static
runtime, every library would carry the runtime's own imports (dlopen, getenv, pthread_create, clock_gettime...), so
the check of a candidate's dynamic symbols (cuda_checks.py) could not tell them from the candidate's, and a runtime
call such as cudaStreamCreate would be resolved inside the library, out of sight. The runtime is found through an
rpath to the toolkit's library folder, or is the one the process already loaded (torch's).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from cuco.paths import build_cache_dir
from cuco.runner.toolchain import Toolchain, find_toolchain

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "cuda" / "include"
HARNESS_SRC = Path(__file__).resolve().parents[1] / "cuda" / "harness.cu"
# Hopper (H100/H200) by default; CUCO_CUDA_ARCH="90a" or "100" etc. to target others.
DEFAULT_ARCH = "90"
# The name a candidate is preprocessed and compiled under, in a folder of its own.
STAGED_NAME = "candidate.cu"
# Preprocessing reads only headers: a unit that takes longer, or more memory, is reading something else (/dev/zero).
PREPROCESS_TIMEOUT_S = 120
PREPROCESS_MEMORY_KB = 4 * 1024 * 1024
MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d+)*)$', re.M)


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    library: Path | None
    log: str
    cached: bool
    seconds: float
    command: list[str]
    # Set by cuda_checks.check_and_build when a check on the preprocessed unit or on the library failed.
    static_problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Preprocessed:
    """What nvcc's two passes see: {"host": unit handed to cudafe++, "device": unit handed to cicc}."""
    ok: bool
    units: dict[str, str]
    files: tuple[Path, ...]  # every file either unit includes, resolved; the candidate itself left out
    log: str

    @property
    def text(self) -> str:
        return "\n".join(f"//// {k}\n{v}" for k, v in sorted(self.units.items()))


def _lib_file(d: Path | None, prefix: str) -> Path | None:
    if d is None:
        return None
    files = sorted(d.glob(prefix + "*"), key=lambda p: len(p.name))
    return files[0] if files else None


@lru_cache(maxsize=16)
def _dryrun(cmd: tuple[str, ...]) -> tuple[dict[str, str], tuple[tuple[str, ...], ...]]:
    """nvcc's own plan for `cmd` (--dryrun): its variables (TOP, INCLUDES, LIBRARIES...) and the commands it runs."""
    proc = subprocess.run([*cmd, "--dryrun"], capture_output=True, text=True, cwd=tempfile.gettempdir())
    variables, commands = {}, []
    for line in (proc.stdout + proc.stderr).splitlines():
        if not line.startswith("#$ "):
            continue
        m = re.match(r"([A-Za-z_]\w*)=(.*)$", line[3:])
        if m:
            variables[m.group(1)] = m.group(2).strip()
            continue
        try:
            commands.append(tuple(shlex.split(line[3:])))
        except ValueError:
            continue
    return variables, tuple(commands)


@lru_cache(maxsize=4)
def cudart_dir(nvcc: Path) -> Path | None:
    """The toolkit's folder holding libcudart.so, where nvcc links it from."""
    variables, _ = _dryrun((str(nvcc), "-shared", "-o", "x.so", "x.cu"))
    for flag in shlex.split(variables.get("LIBRARIES", "")):
        d = Path(flag[2:]) if flag.startswith("-L") else None
        if d and d.name != "stubs" and any(d.glob("libcudart.so*")):
            return Path(os.path.realpath(d))
    return None


def nvcc_command(src: Path, out: Path, tc: Toolchain, arch: str, includes: tuple[Path, ...] = ()) -> list[str]:
    """includes: a workload's own header folders, searched after cuco's."""
    cmd = [str(tc.nvcc), "-O3", "-std=c++17", "-lineinfo", "-shared", "-cudart", "shared", "-Xcompiler",
           "-fPIC,-fvisibility=hidden", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I", str(INCLUDE_DIR)]
    for inc in (*includes, tc.nccl_include, tc.cublas_include):
        if inc:
            cmd += ["-I", str(inc)]
    cmd += ["-o", str(out), str(src)]
    for d, prefix in ((tc.nccl_lib, "libnccl.so"), (tc.cublas_lib, "libcublas.so"), (tc.cublas_lib, "libcublasLt.so")):
        lib = _lib_file(d, prefix)
        if lib:
            cmd += [f"-L{lib.parent}", f"-l:{lib.name}", f"-Xlinker=-rpath,{lib.parent}"]
    rt = cudart_dir(tc.nvcc) if tc.nvcc else None
    if rt:
        cmd.append(f"-Xlinker=-rpath,{rt}")
    return cmd


@lru_cache(maxsize=16)
def preprocess_commands(template: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The host compiler's preprocessing commands nvcc runs for `template` (which compiles STAGED_NAME), one per
    pass, without their -o: taken from nvcc's --dryrun, so the flags, macros and forced includes are nvcc's own."""
    _, commands = _dryrun(template)
    found: dict[str, tuple[str, ...]] = {}
    for argv in commands:
        if "-E" not in argv or STAGED_NAME not in argv:
            continue
        kind = "device" if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else "host"
        keep, skip = [], False
        for a in argv:
            if skip or a == "-o":
                skip = not skip
                continue
            keep.append(a)
        found.setdefault(kind, tuple(keep))
    return found


def _unquote(name: str) -> str:
    """A file name as the preprocessor's line markers escape it (\\\\, \\" and octal bytes)."""
    raw = re.sub(r"\\([0-7]{1,3}|.)", lambda m: chr(int(m.group(1), 8)) if m.group(1).isdigit() else m.group(1), name)
    try:
        return raw.encode("latin-1", errors="surrogateescape").decode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return raw


def marker_files(text: str) -> set[str]:
    """Every file name the unit's line markers mention, as written (relative names are relative to the stage)."""
    return {_unquote(m.group(2)) for m in MARKER.finditer(text)}


def _resolved_files(units: dict[str, str], stage: Path) -> tuple[Path, ...]:
    own = Path(os.path.realpath(stage / STAGED_NAME))
    files = set()
    for text in units.values():
        for name in marker_files(text):
            if (name.startswith("<") and name.endswith(">")) or name.endswith("//"):
                continue  # <built-in>, <command-line>, the working folder
            path = Path(os.path.realpath(stage / name))
            if path != own:
                files.add(path)
    return tuple(sorted(files))


def _run_passes(commands: dict[str, tuple[str, ...]], stage: Path, out: Path) -> dict[str, tuple[int, str]]:
    """Both passes at once, each limited in memory and time. {kind: (returncode, stderr)}; units in out/kind.ii."""
    procs = {}
    for kind, argv in commands.items():
        # The unit goes to stdout, not -o: on an error the driver deletes its -o file, and the line markers of what
        # was read before the error are still wanted (a forbidden include is reported before its diagnostics).
        with open(out / f"{kind}.ii", "wb") as unit, open(out / f"{kind}.log", "wb") as err:
            procs[kind] = subprocess.Popen(["sh", "-c", f'ulimit -v {PREPROCESS_MEMORY_KB}; exec "$@"', "sh", *argv],
                                           cwd=stage, stdin=subprocess.DEVNULL, stdout=unit, stderr=err,
                                           start_new_session=True)
    deadline = time.monotonic() + PREPROCESS_TIMEOUT_S
    results = {}
    for kind, proc in procs.items():
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            (out / f"{kind}.log").write_text(f"preprocessing took over {PREPROCESS_TIMEOUT_S} s: killed\n")
        results[kind] = (rc, (out / f"{kind}.log").read_text(errors="replace"))
    return results


def preprocess(src: Path, toolchain: Toolchain | None = None, arch: str | None = None,
               includes: tuple[Path, ...] = ()) -> Preprocessed:
    """Run nvcc's host and device preprocessing on a staged copy of `src`, as the build will compile it."""
    tc = toolchain or find_toolchain()
    arch = arch or os.environ.get("CUCO_CUDA_ARCH", DEFAULT_ARCH)
    if tc.missing():
        return Preprocessed(False, {}, (), "cannot build: missing " + "; ".join(tc.missing()))
    commands = preprocess_commands(tuple(nvcc_command(Path(STAGED_NAME), Path("candidate.so"), tc, arch, includes)))
    if set(commands) != {"host", "device"}:
        return Preprocessed(False, {}, (), f"nvcc --dryrun shows no host and device preprocessing: {sorted(commands)}")
    stage = Path(tempfile.mkdtemp(prefix=".pre-", dir=build_cache_dir()))
    try:
        (stage / STAGED_NAME).write_bytes(Path(src).read_bytes())
        with tempfile.TemporaryDirectory(prefix="cuco-pre-") as out_s:
            out = Path(out_s)
            results = _run_passes(commands, stage, out)
            units = {k: (out / f"{k}.ii").read_text(encoding="utf-8", errors="surrogateescape") for k in commands}
        files = _resolved_files(units, stage)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    ok = all(rc == 0 for rc, _ in results.values())
    log = "".join(dict.fromkeys(line for _, err in results.values() for line in err.splitlines(keepends=True)))
    return Preprocessed(ok, units, files, log.replace(str(stage / STAGED_NAME), Path(src).name)
                        .replace(STAGED_NAME, Path(src).name))


def build_key(unit_text: str, cmd_template: list[str], tc: Toolchain) -> str:
    """Over the preprocessed units (every included file's text is in them), the command and the versions."""
    h = hashlib.sha256()
    h.update(unit_text.encode(errors="surrogateescape"))
    h.update(json.dumps([cmd_template, tc.nvcc_version, tc.nccl_version]).encode())
    return h.hexdigest()[:24]


def build(src: Path, arch: str | None = None, toolchain: Toolchain | None = None,
          pre: Preprocessed | None = None, includes: tuple[Path, ...] = ()) -> BuildResult:
    """Compile `src` into a shared library (or return the cached one). `pre`: its preprocess() for the same
    toolchain and arch, when the caller already has it."""
    tc = toolchain or find_toolchain()
    arch = arch or os.environ.get("CUCO_CUDA_ARCH", DEFAULT_ARCH)
    missing = tc.missing()
    if missing:
        return BuildResult(False, None, "cannot build: missing " + "; ".join(missing), False, 0.0, [])
    pre = pre or preprocess(src, tc, arch, includes)
    if not pre.ok:
        return BuildResult(False, None, pre.log, False, 0.0, [])
    data = Path(src).read_bytes()
    template = nvcc_command(Path("SRC.cu"), Path("OUT.so"), tc, arch, includes)
    key = build_key(pre.text, template, tc)
    d = build_cache_dir() / key
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f".{key}.lock", "w") as lock:
        # One compile per key: a build of the same program by another process (a search's other slot, another
        # test) is waited for and reused, not repeated.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (d / "status.json").is_file():
            st = json.loads((d / "status.json").read_text())
            return BuildResult(st["ok"], d / "candidate.so" if st["ok"] else None, (d / "build.log").read_text(),
                               True, 0.0, st["command"])
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=d.parent))
        (tmp / STAGED_NAME).write_bytes(data)
        cmd = nvcc_command(tmp / STAGED_NAME, tmp / "candidate.so", tc, arch, includes)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, stdin=subprocess.DEVNULL)
        secs = time.perf_counter() - t0
        ok = proc.returncode == 0 and (tmp / "candidate.so").is_file()
        log = (proc.stdout + proc.stderr).replace(str(tmp / STAGED_NAME), Path(src).name)
        (tmp / "build.log").write_text(log)
        (tmp / "status.json").write_text(json.dumps({"ok": ok, "command": cmd, "seconds": secs, "source": str(src)}))
        shutil.rmtree(d, ignore_errors=True)  # a folder without its status is no build (a copy cut short)
        tmp.rename(d)  # atomic: a reader sees the whole folder or none of it
    return BuildResult(ok, d / "candidate.so" if ok else None, log, False, secs, cmd)


def build_harness(arch: str | None = None) -> BuildResult:
    return build(HARNESS_SRC, arch)


def first_error(log: str) -> str:
    """The line of a compiler log a person reads first: its first error, else its first line."""
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return (log.strip().splitlines() or ["no output"])[0][:300]
