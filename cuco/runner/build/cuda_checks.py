"""L1 checks of a CUDA candidate on what the compiler sees and on what it produced.

The raw-source regexes of static_checks.py are quick feedback, and a macro (`CAT(cudaStream, Create)`), a header of
the candidate's own or a declaration written by hand gets past them. So, before compiling:
  - the unit nvcc's preprocessing produces (host and device pass, see build.preprocess) may include only the headers
    of cuco, CUDA, NCCL, cuBLAS and the system compiler;
  - the lines its line markers attribute to the candidate, with every macro expanded, may not name a forbidden
    identifier. The candidate may not write line directives (`#line`, `# N "file"`), nor raw strings with a line
    starting with `#` (the unit carries them verbatim): either would move its lines into a header's name.
And after compiling, the library's undefined dynamic symbols (nvcc links the CUDA runtime shared, see build.py, so
those are the candidate's own imports) may not include a forbidden one, and its code may hold no system-call or
time-stamp instruction. Native code can still reach anything in its process by pointer arithmetic; these checks
refuse every honest-looking way to do it, not every way.
"""

from __future__ import annotations

import bisect
import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from cuco.runner.build.nvcc import (
    DEFAULT_ARCH,
    INCLUDE_DIR,
    MARKER,
    STAGED_NAME,
    BuildResult,
    Preprocessed,
    build,
    nvcc_command,
    preprocess,
    preprocess_commands,
)
from cuco.runner.build.static_checks import StaticReport, table
from cuco.runner.build.toolchain import Toolchain, find_toolchain

__all__ = ["Preprocessed", "preprocess", "check_preprocessed", "check_library_symbols", "check_and_build",
           "allowed_include_dirs"]

TIMING = "timing is the runner's job"
EXIT = "a candidate may not end the process"
SLEEP = "no sleeping on the host"
DEVICE = "the runner owns the device and its contexts"
STREAMS = "use ctx->stream and ctx->sideStreams: only those are gated and timed"
COMM = "use ctx->comm: the runner owns the communicator"
ENV = "candidates must not read or change the environment"
SPAWN = "a candidate may not start processes or threads"
DYNAMIC = "resolving functions at run time escapes these checks"
SIGNALS = "a candidate may not send or catch signals"
SYSCALL = "raw system calls escape these checks"
FILES = "a candidate may not touch files or map memory"
PYTHON = "the Python C API reaches the runner's interpreter"


_COMMON = {
    TIMING: "cudaEventElapsedTime cudaEventElapsedTime_v2 cuEventElapsedTime cuEventElapsedTime_v2 clock_gettime "
            "gettimeofday timespec_get",
    EXIT: "exit _exit _Exit quick_exit",
    SLEEP: "sleep usleep nanosleep clock_nanosleep",
    DEVICE: "cudaDeviceReset cudaSetDevice cudaThreadExit",
    COMM: "ncclCommDestroy ncclCommSplit ncclCommAbort ncclCommFinalize ncclCommShrink",
    ENV: "getenv secure_getenv setenv putenv unsetenv clearenv environ __environ",
    SPAWN: "system popen fork vfork clone clone3 fexecve pthread_create",
    DYNAMIC: "dlopen dlsym dlmopen dlvsym dlinfo dladdr dladdr1 dl_iterate_phdr getauxval cudaGetExportTable "
             "cuGetExportTable",
    SIGNALS: "kill killpg tgkill raise signal sigaction pthread_kill",
    SYSCALL: "syscall ptrace prctl",
    FILES: "mmap mmap64 mprotect fopen fopen64 freopen open open64 openat creat unlink unlinkat remove rename renameat",
}
# Identifiers on the candidate's own lines after preprocessing (member names after . or -> are not these).
FORBIDDEN_IDENTIFIERS = table({**_COMMON, TIMING: _COMMON[TIMING] + " chrono __rdtsc __rdtscp _rdtsc rdtsc",
                                EXIT: _COMMON[EXIT] + " abort",
                                SLEEP: _COMMON[SLEEP] + " sleep_for sleep_until this_thread"})
# Undefined dynamic symbols of the built library, version suffix removed. abort is left out: libstdc++'s inline code
# may import it, and the identifier check has the candidate's own calls.
FORBIDDEN_SYMBOLS = table({**_COMMON, TIMING: _COMMON[TIMING] + " time ftime", DYNAMIC: _COMMON[DYNAMIC]
                            + " _dl_find_object __libc_dlopen_mode __libc_dlsym _dl_sym"})
FORBIDDEN_PREFIXES = [("cudaStreamCreate", STREAMS), ("cuStreamCreate", STREAMS), ("cuCtxCreate", DEVICE),
                      ("cuCtxDestroy", DEVICE), ("cuDevicePrimaryCtxReset", DEVICE), ("ncclCommInit", COMM),
                      ("execv", SPAWN), ("execl", SPAWN), ("posix_spawn", SPAWN),
                      ("cudaGetDriverEntryPoint", DYNAMIC), ("cuGetProcAddress", DYNAMIC)]
# Forbidden functions whose names are ordinary words (a cudaEvent_t named fork): flagged on the candidate's lines
# only when called, declared, address-taken or qualified. Any other use links the function, and the symbol check
# of the library has it.
ORDINARY_WORDS = {"exit", "abort", "sleep", "signal", "raise", "kill", "system", "fork", "clone", "open", "remove",
                  "rename", "unlink", "creat", "mmap"}
FORBIDDEN_QUALIFIED = {"std::thread": SPAWN, "std::jthread": SPAWN, "std::async": SPAWN}
# Demangled C++ symbols.
FORBIDDEN_CXX = [(re.compile(r"^std::(thread|jthread)\b"), SPAWN), (re.compile(r"^std::this_thread\b"), SLEEP),
                 (re.compile(r"^std::chrono::.*::now\("), TIMING)]
PYTHON_API = re.compile(r"^(?:Py[A-Z_]|_Py)")
FORBIDDEN_INSTRUCTIONS = {"syscall": SYSCALL, "sysenter": SYSCALL, "int $0x80": SYSCALL, "rdtsc": TIMING,
                          "rdtscp": TIMING}
SYSTEM_INCLUDE_DIRS = ["/usr/include", "/usr/local/include", "/usr/lib/gcc", *glob.glob("/usr/lib/llvm-*")]

# C++ preprocessing tokens, enough to tell code from comments, strings, characters and numbers.
TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<raw>(?:u8|[uUL])?R"(?P<delim>[^()\\\s"]{0,16})\(.*?\)(?P=delim)")
  | (?P<str>(?:u8|[uUL])?"(?:\\.|[^"\\\n])*")
  | (?P<chr>(?:u8|[uUL])?'(?:\\.|[^'\\\n])*')
  | (?P<num>\.?\d(?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)
  | (?P<ident>[A-Za-z_$][\w$]*)
  | (?P<nl>\n)
  | (?P<punct>::|->|%:|\S)
  | (?P<ws>[ \t\r\f\v]+)
""", re.S | re.X)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, offset) of each token that matters: comments and white space dropped, newlines kept."""
    return [(m.lastgroup or "", m.group(m.lastgroup or 0), m.start()) for m in TOKEN.finditer(text)
            if m.lastgroup not in ("comment", "ws")]


def _identifier_why(name: str) -> str | None:
    if name in FORBIDDEN_IDENTIFIERS:
        return FORBIDDEN_IDENTIFIERS[name]
    if PYTHON_API.match(name):
        return PYTHON
    return next((why for prefix, why in FORBIDDEN_PREFIXES if name.startswith(prefix)), None)


def _symbol_why(raw: str, demangled: str) -> str | None:
    if raw in FORBIDDEN_SYMBOLS:
        return FORBIDDEN_SYMBOLS[raw]
    if PYTHON_API.match(raw):
        return PYTHON
    hit = next((why for prefix, why in FORBIDDEN_PREFIXES if raw.startswith(prefix)), None)
    return hit or next((why for pattern, why in FORBIDDEN_CXX if pattern.match(demangled)), None)


def _splice(text: str) -> tuple[str, Callable[[int], int]]:
    """Backslash-newlines removed, as the compiler does outside raw strings, and a map back to `text`'s offsets."""
    starts, removed, total = [], [], 0
    for m in re.finditer(r"\\[ \t]*\n", text):
        starts.append(m.start() - total)
        total += len(m.group(0))
        removed.append(total)
    spliced = re.sub(r"\\[ \t]*\n", "", text)

    def original(pos: int) -> int:
        i = bisect.bisect_right(starts, pos)
        return pos + (removed[i - 1] if i else 0)
    return spliced, original


def line_directive_problems(text: str, name: str) -> list[str]:
    """`#line` and GNU line markers in the candidate's source, and raw strings with a line starting with `#` (copied
    verbatim into the unit, such a line reads as a marker): refused, the checks trust the markers."""
    spliced, original = _splice(text)
    problems, at_start, hash_seen = [], True, False
    for kind, tok, pos in _tokens(spliced):
        if kind == "nl":
            at_start, hash_seen = True, False
            continue
        if hash_seen and (kind == "num" or (kind == "ident" and tok == "line")):
            what = "line directive: it would attribute the candidate's lines to another file"
        elif kind == "raw" and "\n#" in text[original(pos):original(pos + len(tok) - 1) + 1]:
            what = "raw string with a line starting with '#': it would read as a line marker"
        else:
            what = ""
        if what:
            problems.append(f"{name}:{text.count(chr(10), 0, original(pos)) + 1}: forbidden {what}")
        hash_seen = at_start and tok in ("#", "%:")
        at_start = False
    return problems


def _is_candidate(marker_name: str) -> bool:
    return os.path.normpath(marker_name) == STAGED_NAME


def candidate_lines(unit: str) -> list[tuple[int, str]]:
    """(source line, text) of each line of a preprocessed unit that its markers attribute to the candidate."""
    out, mine, line = [], False, 0
    for text in unit.split("\n"):
        m = MARKER.match(text)
        if m:
            mine, line = _is_candidate(m.group(2)), int(m.group(1))
            continue
        if mine and text.strip():
            out.append((line, text))
        line += 1
    return out


def _joined(lines: list[tuple[int, str]]) -> tuple[str, list[int], list[int]]:
    """The lines as one text, with each line's start offset and source line number."""
    starts, numbers, offset = [], [], 0
    for line, text in lines:
        starts.append(offset)
        numbers.append(line)
        offset += len(text) + 1
    return "\n".join(text for _, text in lines), starts, numbers


def _used_as_function(toks: list[tuple[str, str, int]], i: int) -> bool:
    """Called, declared, address taken or qualified: what an ordinary word (a member `fork`) is not."""
    prev = toks[i - 1][1] if i > 0 else ""
    after = toks[i + 1][1] if i + 1 < len(toks) else ""
    return after == "(" or prev in ("&", "::")


def _identifier_hits(unit: str) -> dict[tuple[int, str], str]:
    text, starts, numbers = _joined(candidate_lines(unit))
    toks = [t for t in _tokens(text) if t[0] != "nl"]
    hits = {}
    for i, (kind, tok, pos) in enumerate(toks):
        prev = [t for _, t, _ in toks[max(0, i - 2):i]]
        if kind != "ident" or (prev and prev[-1] in (".", "->")):
            continue
        qualified = f"{prev[0]}::{tok}" if len(prev) == 2 and prev[1] == "::" else tok
        why = FORBIDDEN_QUALIFIED.get(qualified) or _identifier_why(tok)
        if why and tok in ORDINARY_WORDS and not _used_as_function(toks, i):
            continue
        if why:
            line = numbers[bisect.bisect_right(starts, pos) - 1]
            hits.setdefault((line, qualified if qualified in FORBIDDEN_QUALIFIED else tok), why)
    return hits


def identifier_problems(units: dict[str, str], name: str) -> list[str]:
    """Forbidden identifiers on the candidate's lines, macros expanded, strings and member names left out."""
    found: dict[tuple[int, str], str] = {}
    for unit in units.values():
        for key, why in _identifier_hits(unit).items():
            found.setdefault(key, why)
    return [f"{name}:{line}: forbidden {tok!r} (after preprocessing): {why}"
            for (line, tok), why in sorted(found.items())]


@lru_cache(maxsize=8)
def compiler_search_dirs(compiler: str) -> tuple[Path, ...]:
    """The host compiler's own #include search path (`-E -v`)."""
    try:
        proc = subprocess.run([compiler, "-x", "c++", "-E", "-v", "-"], input="", capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, inside = [], False
    for line in proc.stderr.splitlines():
        if line.startswith("#include ") and "search starts here" in line:
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.startswith(" "):
            dirs.append(Path(line.strip().split(" (")[0]))
    return tuple(dirs)


def _flag_dirs(argv: tuple[str, ...]) -> list[str]:
    dirs = []
    for i, a in enumerate(argv):
        for flag in ("-I", "-isystem", "-idirafter", "-iquote"):
            if a == flag and i + 1 < len(argv):
                dirs.append(argv[i + 1])
            elif a.startswith(flag) and len(a) > len(flag) and flag == "-I":
                dirs.append(a[2:])
    return dirs


def allowed_include_dirs(tc: Toolchain, arch: str, includes: tuple[Path, ...] = ()) -> tuple[Path, ...]:
    """cuco's, the workload's own (`includes`), NCCL's, cuBLAS's and CUDA's headers (the -I folders of nvcc's own
    preprocessing command) and the system compiler's."""
    cmd = nvcc_command(Path(STAGED_NAME), Path("candidate.so"), tc, arch, includes)
    host = preprocess_commands(tuple(cmd)).get("host", ())
    dirs: list[str | Path | None] = [INCLUDE_DIR, *includes, tc.nccl_include, tc.cublas_include, *_flag_dirs(host),
                                     *SYSTEM_INCLUDE_DIRS]
    if host:
        dirs += compiler_search_dirs(host[0])
    return tuple(sorted({Path(os.path.realpath(d)) for d in dirs if d}))


def include_problems(pre: Preprocessed, name: str, allowed: tuple[Path, ...]) -> list[str]:
    return [f"{name}: includes {f}: only the headers of cuco, its workload (include/), CUDA, NCCL, cuBLAS and the "
            "system compiler may be included" for f in pre.files if not any(f.is_relative_to(d) for d in allowed)]


def missing_include_problems(log: str, name: str) -> list[str]:
    """An include the staged copy cannot find: the candidate is built alone, so a header beside it is not there."""
    pattern = rf"^{re.escape(name)}:(\d+):\d+: fatal error: (.+?): No such file or directory"
    return [f"{name}:{m.group(1)}: includes {m.group(2)!r}, which is not there: a candidate is built alone, from a "
            "copy, and may include only the headers of cuco, its workload (include/), CUDA, NCCL, cuBLAS and the "
            "system compiler"
            for m in re.finditer(pattern, log, flags=re.M)]


def check_preprocessed(src: Path, toolchain: Toolchain | None = None, arch: str | None = None,
                       pre: Preprocessed | None = None, includes: tuple[Path, ...] = ()) -> StaticReport:
    """Line directives, includes and forbidden identifiers, on the unit nvcc's preprocessing produces."""
    tc = toolchain or find_toolchain()
    arch = arch or os.environ.get("CUCO_CUDA_ARCH", DEFAULT_ARCH)
    name = Path(src).name
    problems = line_directive_problems(Path(src).read_text(errors="replace"), name)
    if problems:
        return StaticReport(False, problems)
    pre = pre or preprocess(src, tc, arch, includes)
    if not pre.units:
        first = pre.log.strip().splitlines()[0] if pre.log.strip() else "no output"
        return StaticReport(False, [f"{name}: cannot preprocess: {first}"])
    problems = include_problems(pre, name, allowed_include_dirs(tc, arch, includes))
    if not pre.ok:
        problems += missing_include_problems(pre.log, name)
    problems += identifier_problems(pre.units, name)
    return StaticReport(not problems, problems)


def _undefined_symbols(lib: Path) -> list[str] | str:
    """The library's undefined dynamic symbols, version suffixes removed; a reason when they cannot be listed."""
    if shutil.which("nm"):
        proc = subprocess.run(["nm", "-D", "--undefined-only", "-P", str(lib)], capture_output=True, text=True)
        if proc.returncode == 0:
            return [line.split()[0].split("@")[0] for line in proc.stdout.splitlines() if line.strip()]
    if shutil.which("readelf"):
        proc = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True)
        if proc.returncode == 0:
            rows = [line.split() for line in proc.stdout.splitlines()]
            return [r[7].split("@")[0] for r in rows if len(r) >= 8 and r[6] == "UND"]
        return f"readelf failed: {proc.stderr.strip()[:200]}"
    return "neither nm nor readelf (binutils) is installed"


def _demangled(names: list[str]) -> list[str]:
    if not shutil.which("c++filt") or not any(n.startswith("_Z") for n in names):
        return names
    proc = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True)
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else names


def instruction_problems(lib: Path) -> list[str]:
    """System-call and time-stamp instructions in the library's code (inline assembly imports nothing)."""
    if not shutil.which("objdump"):
        return []
    proc = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True)
    found = {re.sub(r"\s+", " ", m.group(1)) for m in re.finditer(
        r"^\s*[0-9a-f]+:\s+(syscall|sysenter|int\s+\$0x80|rdtscp?)\b", proc.stdout, flags=re.M)}
    return [f"{lib.name}: contains a {insn!r} instruction: {FORBIDDEN_INSTRUCTIONS[insn]}" for insn in sorted(found)]


def check_library_symbols(lib: Path) -> StaticReport:
    """Forbidden imports among the library's undefined dynamic symbols, and forbidden instructions in its code."""
    lib = Path(lib)
    names = _undefined_symbols(lib)
    if isinstance(names, str):
        return StaticReport(False, [f"{lib.name}: cannot list its dynamic symbols: {names}"])
    problems = []
    for raw, shown in zip(names, _demangled(names), strict=True):
        why = _symbol_why(raw, shown)
        if why:
            problems.append(f"{lib.name}: imports {shown}: {why}")
    problems += instruction_problems(lib)
    return StaticReport(not problems, problems)


def check_and_build(src: Path, arch: str | None = None, toolchain: Toolchain | None = None,
                    includes: tuple[Path, ...] = ()) -> tuple[BuildResult, list[str]]:
    """Preprocess once, check the unit, build, check the library. Returns the build and the static problems (empty
    when fine); a static problem stops before compiling, and a library that fails its check is not handed out."""
    tc = toolchain or find_toolchain()
    arch = arch or os.environ.get("CUCO_CUDA_ARCH", DEFAULT_ARCH)
    if tc.missing():
        return build(src, arch, tc, includes=includes), []
    pre = preprocess(src, tc, arch, includes)
    report = check_preprocessed(src, tc, arch, pre, includes)
    if not report.ok:
        log = "static check after preprocessing failed:\n" + "\n".join(report.problems)
        return BuildResult(False, None, log, False, 0.0, [], static_problems=report.problems), report.problems
    built = build(src, arch, tc, pre=pre, includes=includes)
    if not built.ok or built.library is None:
        return built, []
    lib_report = check_library_symbols(built.library)
    if not lib_report.ok:
        return replace(built, ok=False, library=None, static_problems=lib_report.problems), lib_report.problems
    return built, []
