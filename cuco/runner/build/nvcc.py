"""nvcc builds of CUDA candidates into shared libraries, cached by content hash.

The key covers what the compiler sees: the preprocessed translation unit of both of nvcc's passes (host and device),
which holds the text of every file the candidate includes, plus the command template and the toolchain's versions.
So an edited header, wherever it lies, or a changed toolchain never reuses a stale library. Those units are
also what gets compiled: the rest of nvcc's plan (its --dryrun) runs on them, so a build preprocesses once. A
failed build is cached too, with the compiler's output, so the proposer sees the same diagnostics without paying
for the compile again.

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
from cuco.runner.build.toolchain import Toolchain, find_toolchain

INCLUDE_DIR = Path(__file__).resolve().parents[2] / "cuda" / "include"
HARNESS_SRC = Path(__file__).resolve().parents[2] / "cuda" / "harness.cu"
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
def _dryrun_lines(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """nvcc's own plan for `cmd` (--dryrun), run in the temporary folder: its lines, without their '#$ '."""
    proc = subprocess.run([*cmd, "--dryrun"], capture_output=True, text=True, cwd=tempfile.gettempdir())
    return tuple(line[3:] for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("#$ "))


def _variable(line: str) -> tuple[str, str] | None:
    m = re.match(r"([A-Za-z_]\w*)=(.*)$", line)
    return (m.group(1), m.group(2).strip()) if m else None


def _dryrun(cmd: tuple[str, ...]) -> tuple[dict[str, str], tuple[tuple[str, ...], ...]]:
    """nvcc's plan for `cmd`: its variables (TOP, INCLUDES, LIBRARIES...) and the commands it runs."""
    variables, commands = {}, []
    for line in _dryrun_lines(cmd):
        if var := _variable(line):
            variables[var[0]] = var[1]
            continue
        try:
            commands.append(tuple(shlex.split(line)))
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
    """includes: a workload's own header folders, searched after cuco's. Each host function in a section of its
    own, and the linker keeps only what the exported entry points reach: nvcc writes a host stub that calls exit()
    for every __device__ function, which nothing on the host calls, and which the library's symbol check would
    otherwise read as the candidate ending the process."""
    cmd = [str(tc.nvcc), "-O3", "-std=c++17", "-lineinfo", "-shared", "-cudart", "shared", "-Xcompiler",
           "-fPIC,-fvisibility=hidden,-ffunction-sections", "-Xlinker=--gc-sections",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", "-I", str(INCLUDE_DIR)]
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


def _nvcc_env(lines: tuple[str, ...]) -> dict[str, str]:
    """The environment nvcc gives its tools: its one-word variables (CICC_PATH, PATH, LD_LIBRARY_PATH...), on top of
    ours. The lists (INCLUDES, LIBRARIES) are spelled out in the commands already."""
    env = dict(os.environ)
    for line in lines:
        var = _variable(line)
        if var and len(words := shlex.split(var[1] or "''")) <= 1:
            env[var[0]] = words[0] if words else ""
    return env


def _compile_after_preprocessing(template: tuple[str, ...], pre: Preprocessed,
                                 stage: Path) -> tuple[int | None, str]:
    """nvcc's steps for `template` (which compiles STAGED_NAME, in STAGE) after its two preprocessing runs, whose
    units `pre` holds already (the build key is made of them): each is written where nvcc's own run would have
    written it, and the rest of nvcc's --dryrun runs as nvcc would run it, in its temporary files under STAGE. A
    compile of a second or more less per build. (returncode, output); returncode None where the dry run does not
    show the two preprocessing runs (the caller then runs nvcc itself)."""
    lines = _dryrun_lines(template)
    # nvcc's temporary files, in its temporary folder (whichever: TMPDIR's) or named relative to it (the host
    # stub's #include)
    temps = re.compile(r"((?:/[^/\s\"'=,]+)*/+)?tmpxft_[0-9a-f]+_[0-9a-f]+-")
    staged_at = re.escape(os.path.join(tempfile.gettempdir(), STAGED_NAME))
    steps, written = [], set()
    for line in lines:
        if _variable(line):
            continue
        line = temps.sub(lambda m: f"{stage}/nvcc-" if m.group(1) else "nvcc-", line)
        line = re.sub(staged_at, str(stage / STAGED_NAME), line)
        argv = shlex.split(line)
        if argv[:1] == ["rm"]:
            continue  # nvcc's removal of intermediates, some never written: they go with STAGE's nvcc-* files
        if "-E" in argv and STAGED_NAME in argv and "-o" in argv:
            kind = "device" if any(a.startswith("-D__CUDA_ARCH__=") for a in argv) else "host"
            if kind in written or kind not in pre.units:
                return None, ""
            Path(argv[argv.index("-o") + 1]).write_bytes(pre.units[kind].encode("utf-8", errors="surrogateescape"))
            written.add(kind)
        else:
            steps.append(line)
    if written != {"host", "device"}:
        return None, ""
    env, out = _nvcc_env(lines), []
    for line in steps:
        proc = subprocess.run(["sh", "-c", line], cwd=stage, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL)
        out.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return proc.returncode, "".join(out)
    return 0, "".join(out)


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
        rc, out = _compile_after_preprocessing(
            tuple(nvcc_command(Path(STAGED_NAME), Path("candidate.so"), tc, arch, includes)), pre, tmp)
        if rc is None:  # nvcc's plan is not the one read: nvcc itself, preprocessing again
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, stdin=subprocess.DEVNULL)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        for f in tmp.glob("nvcc-*"):
            f.unlink()
        secs = time.perf_counter() - t0
        ok = rc == 0 and (tmp / "candidate.so").is_file()
        log = out.replace(str(tmp / STAGED_NAME), Path(src).name).replace(STAGED_NAME, Path(src).name)
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
