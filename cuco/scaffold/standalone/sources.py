"""A program's files as the one translation unit the conversion reads, every line mapped back to the file and line
the user wrote.

People split a program into a host file (.cpp/.cc) and its kernels (.cu), with a header between them, and write
macros the grammar cannot see through (a launch configuration, NVTX ranges without a semicolon, an `#if` that
splits an if/else). The files are joined in one unit (headers first, the file with main() last, an include of a
given file dropped since its text is already there) and the program's own macros are expanded by the C
preprocessor, with the program's include folders and defines. The system headers are not read: their macros stay
as written. Two kinds of the program's macros stay as written too, because the conversion reads them better than
their expansion: a check macro around one call (`CUDACHECK(cudaMalloc(...))`, which becomes cuco's) and an integer
constant (`#define N 1024`, a size fixed at file scope). A line the preprocessor leaves as it was keeps its text,
spacing and comments; one it changes keeps its indentation. A launch configuration given in braces
(`<<<grid, {32, 32, 1}, 0, s>>>`) is written as the dim3 it initialises, which the grammar reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from cuco.errors import CucoError
from cuco.scaffold.size_expr import define_value

HEADERS = (".h", ".hh", ".hpp", ".hxx", ".cuh")
SOURCES = (".cu", ".cpp", ".cc", ".cxx", ".c++", ".c")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)(\(([^)]*)\))?\s*(.*)$")
# Headers of the libraries a candidate builds against, however a program includes them ("cuda_runtime.h").
LIBRARY_HEADER = re.compile(r"^(cuda|cu[A-Za-z]|nccl|cublas|curand|cufft|cusparse|cudnn|mpi|nvtx|nvml|thrust/|cub/|"
                            r"cooperative_groups|sm_\d|device_|vector_|driver_|crt/|math_|host_)")
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
LINE_DIRECTIVE = re.compile(r"^\s*#\s*(line\b|\d)")  # `#line 40 "gen.cu"`, or the `# 40 "gen.cu"` form
LINEMARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"')
LAUNCH = re.compile(r"<<<(.*?)>>>")
PREPROCESS_SECONDS = 60  # a preprocessor that takes longer is stuck on the program (an include cycle, say)


@dataclass(frozen=True)
class Origin:
    """Where a line of the unit was written."""

    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Unit:
    """The program as one text, line by line, with each line's origin."""

    lines: list[str]
    origins: list[Origin]
    files: list[Path]  # as given, the file with main() last
    warnings: list[str] = field(default_factory=list)
    unwritten: dict[str, str] = field(default_factory=dict)  # helpers main() calls that stay calls: why
    written: dict[Path, list[str]] = field(default_factory=dict)  # each file's lines as the user wrote them
    written_out: list[str] = field(default_factory=list)  # helpers written out where main() calls them
    defines: list[str] = field(default_factory=list)  # the -D the program was read with
    constants: dict[str, int] = field(default_factory=dict)  # integer #defines of the headers it includes, not given

    def reading(self) -> list[str]:
        """How the program was read, where that is more than one file as written: for the user, one line each."""
        out = []
        if len(self.files) > 1:
            out.append(f"read {', '.join(p.name for p in self.files)} as one program")
        if self.defines:
            out.append(f"read with {' '.join(f'-D {d}' for d in self.defines)}: the seed is that build of it")
        if self.written_out:
            out.append("written out where main() calls them: " + ", ".join(f"{n}()" for n in self.written_out))
        return out

    @property
    def raw(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()

    @property
    def main_file(self) -> Path:
        return self.files[-1]

    def origin(self, line: int) -> Origin:
        """Where line `line` (from 1) of the unit was written."""
        if 1 <= line <= len(self.origins):
            return self.origins[line - 1]
        return Origin(self.main_file, line)

    def as_written(self, line: int) -> str:
        """Line `line` of the unit as the user wrote it (before its macros were expanded or a helper written out)."""
        o = self.origin(line)
        lines = self.written.get(o.path, [])
        return lines[o.line - 1] if 1 <= o.line <= len(lines) else ""

    def changed(self, **fields) -> Unit:
        """This unit with some of its fields replaced (its lines and their origins, what it was told)."""
        return replace(self, **fields)


def _read(path: Path) -> list[str]:
    if not path.is_file():
        raise CucoError(str(path), "a folder, not a program's file" if path.is_dir() else "no such file")
    if path.suffix.lower() not in HEADERS + SOURCES:
        raise CucoError(str(path), f"cuco init reads CUDA C++ sources ({', '.join(SOURCES + HEADERS)}), not "
                                   f"{path.suffix or 'a file without a suffix'}")
    raw = path.read_bytes()
    if b"\0" in raw:
        raise CucoError(str(path), "not a text file")
    try:
        return raw.decode().splitlines()
    except UnicodeDecodeError as exc:  # a byte read as another would change the program cuco writes out
        line = raw.count(b"\n", 0, exc.start) + 1
        raise CucoError(f"{path}:{line}", f"not UTF-8 (byte {raw[exc.start]:#04x}): save it as UTF-8") from None


def _defines_main(lines: list[str]) -> bool:
    return any(re.match(r"^\s*(int|auto)\s+main\s*\(", ln) for ln in lines)


def read_sources(paths: list[Path]) -> Unit:
    """The files joined: headers first, then the other files in the order given, the one defining main() last."""
    if not paths:
        raise CucoError("--from", "name the program's files")
    names: dict[str, Path] = {}
    for p in paths:
        if p.name in names and names[p.name] != p:
            raise CucoError(str(p), f"two files named {p.name} ({names[p.name]}): cuco keeps the program's files "
                                    "side by side, by name")
        names[p.name] = p
    unique = list(dict.fromkeys(paths))
    texts = {p: _read(p) for p in unique}
    ordered = sorted(unique, key=lambda p: (p.suffix.lower() not in HEADERS, _defines_main(texts[p])))
    lines, origins = [], []
    for p in ordered:
        lines += texts[p]
        origins += [Origin(p, i) for i in range(1, len(texts[p]) + 1)]
    return Unit(lines, origins, ordered, written=texts)


def _logical(lines: list[str], i: int) -> int:
    """The index after the directive starting at line i (a backslash at a line's end continues it)."""
    j = i
    while j < len(lines) and lines[j].rstrip().endswith("\\"):
        j += 1
    return j + 1


def _directive(lines: list[str], i: int) -> str:
    return " ".join(ln.rstrip().rstrip("\\") for ln in lines[i:_logical(lines, i)])


def _kept_as_written(texts: list[list[str]]) -> set[str]:
    """The program's macros that stay unexpanded: integer constants and check macros around one call."""
    body = "\n".join(ln for lines in texts for ln in lines)
    out = set()
    for lines in texts:
        for i, ln in enumerate(lines):
            m = DEFINE.match(_directive(lines, i)) if DEFINE.match(ln) else None
            if m is None:
                continue
            name, params, value = m.group(1), m.group(3), m.group(4).strip()
            if params is None:
                if define_value(value) is not None:
                    out.add(name)
            elif len([p for p in params.split(",") if p.strip()]) == 1 and \
                    re.search(rf"\b{name}\s*\(\s*[A-Za-z_][\w:]*\s*\(", body):
                out.add(name)
    return out


class _Preprocessor:
    """The unit given to the C preprocessor: headers the program includes copied beside it, what stays as
    written blanked out, includes pointed at the copies."""

    def __init__(self, unit: Unit, include_dirs: list[Path], folder: Path) -> None:
        self.unit, self.include_dirs, self.folder = unit, include_dirs, folder
        self.given = {p.resolve() for p in unit.files}
        self.headers: dict[Path, list[str]] = {}  # the program's own headers that were not given, found on the way
        self.copies: dict[Path, Path] = {}
        self._collect(unit.lines, unit.origins)
        self.unexpanded = _kept_as_written([unit.lines, *self.headers.values()])

    def find(self, name: str, beside: Path) -> Path | None:
        for folder in [beside, *self.include_dirs]:
            p = (folder / name).resolve()
            if p.is_file():
                return p
        return None

    def _collect(self, lines: list[str], origins: list[Origin] | None, beside: Path | None = None) -> None:
        for i, ln in enumerate(lines):
            m = INCLUDE.match(ln)
            if m is None or m.group(1) != '"':
                continue
            where = origins[i].path.parent if origins is not None else beside
            found = self.find(m.group(2), where)
            if found is None and origins is not None and not LIBRARY_HEADER.match(m.group(2)) and \
                    Path(m.group(2)).name not in {p.name for p in self.unit.files}:
                raise CucoError(str(origins[i]), f'includes "{m.group(2)}", which is neither beside it nor in an '
                                                 "include folder: give it too (--from), or its folder (-I); the "
                                                 "seed is built from what cuco reads")
            if found is not None and found not in self.given and found not in self.headers:
                self.headers[found] = found.read_text(errors="replace").splitlines()
                self._collect(self.headers[found], None, found.parent)

    def blanked(self, lines: list[str], beside) -> tuple[list[str], dict[int, tuple[int, str]]]:
        """The lines as the preprocessor gets them, and those that stay as the user wrote them where the
        preprocessor keeps them (not inside an `#if` it drops): the first line of each -> the index after its last
        and what shows it was kept (a marker put in its place, or the name of the header copy it includes)."""
        out, kept, i = list(lines), {}, 0
        while i < len(lines):
            ln = lines[i]
            m, d = INCLUDE.match(ln), DEFINE.match(ln)
            end = i + 1
            if m is not None:
                where = beside(i)
                found = self.find(m.group(2), where) if m.group(1) == '"' else None
                if found is not None and found in self.headers:
                    copy = self.copy(found)
                    out[i] = f'#include "{copy}"'
                    kept[i] = (i + 1, copy.name)
                elif found is None:  # a system header, or one not found: not read
                    out[i] = _marker(i)
                    kept[i] = (i + 1, _marker(i))
                else:  # a file of the unit: its text is there already
                    out[i] = ""
            elif d is not None and d.group(1) in self.unexpanded:
                end = _logical(lines, i)
                out[i:end] = [_marker(i)] + [""] * (end - i - 1)
                kept[i] = (end, _marker(i))
            elif PRAGMA_ONCE.match(ln) or LINE_DIRECTIVE.match(ln):  # a `#line` would move the lines cuco maps back
                out[i] = ""
            i = end
        return out, kept

    def copy(self, header: Path) -> Path:
        if header not in self.copies:
            target = self.folder / "include" / f"{len(self.copies)}_{header.name}"
            self.copies[header] = target
            target.parent.mkdir(exist_ok=True)
            lines, _ = self.blanked(self.headers[header], lambda i: header.parent)
            target.write_text("\n".join(lines) + "\n")
        return self.copies[header]


def _run(command: list[str], unit: Unit, input_name: str) -> str:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=PREPROCESS_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise CucoError(str(unit.main_file), f"the C preprocessor did not finish in {PREPROCESS_SECONDS} s") from None
    if proc.returncode != 0:
        first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip() or "failed")
        m = re.match(rf"^.*?{re.escape(input_name)}:(\d+):(?:\d+:)?\s*(?:fatal )?error:\s*(.*)$", first)
        if m:
            raise CucoError(str(unit.origin(int(m.group(1)))), f"the C preprocessor stops here: {m.group(2)}")
        raise CucoError(str(unit.main_file), f"the C preprocessor stops: {first.strip()}")
    return proc.stdout


def _by_line(output: str, input_name: str, count: int) -> tuple[list[str | None], set[str]]:
    """The preprocessor's output for each line of its input (None where it wrote nothing), and the names of the
    files it entered."""
    out: list[str | None] = [None] * count
    current, line, entered = None, 0, set()
    for ln in output.splitlines():
        m = LINEMARKER.match(ln)
        if m is not None:
            current, line = Path(m.group(2)).name, int(m.group(1))
            entered.add(current)
            continue
        if current == input_name and 1 <= line <= count:
            out[line - 1] = ln if out[line - 1] is None else out[line - 1] + " " + ln
        line += 1
    return out, entered


def _marker(i: int) -> str:
    return f"__cuco_line_kept_{i}__"


def _same(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def preprocessor() -> str | None:
    return shutil.which("cpp")


def expand_macros(unit: Unit, include_dirs: list[Path], defines: list[str]) -> Unit:
    """The unit with the program's own macros expanded (see the module's docstring); unchanged, with a warning,
    where this machine has no C preprocessor."""
    cpp = preprocessor()
    if cpp is None:
        unit.warnings.append("no C preprocessor (cpp) on this machine: the program's macros were read as written")
        return unit.changed(lines=[_dim3(ln) for ln in unit.lines])
    for d in defines:
        if not re.fullmatch(r"[A-Za-z_]\w*(=.*)?", d):
            raise CucoError("--define", f"{d!r}: a define is NAME or NAME=VALUE")
    for folder in include_dirs:
        if not folder.is_dir():
            raise CucoError("--include-dir", f"{folder}: no such folder")
    with tempfile.TemporaryDirectory(prefix="cuco-cpp-") as tmp:
        pre = _Preprocessor(unit, include_dirs, Path(tmp))
        lines, kept = pre.blanked(unit.lines, lambda i: unit.origins[i].path.parent)
        name = unit.main_file.name
        source = Path(tmp) / name
        source.write_text("\n".join(lines) + "\n")
        # C++ with comments kept; no system folder is searched (the unit's system includes are blanked out); nvcc's
        # own macros defined, since the seed is compiled by nvcc as CUDA C++.
        command = [cpp, "-C", "-x", "c++", "-std=c++17", "-nostdinc", "-w", "-D__CUDACC__", "-D__NVCC__",
                   *[f"-I{d}" for d in include_dirs], *[f"-D{d}" for d in defines], str(source)]
        output, entered = _by_line(_run(command, unit, name), name, len(lines))
        constants = _constants(list(pre.headers.values()))
    expanded, i = [], 0
    while i < len(lines):
        original, got = unit.lines[i], output[i]
        if i in kept:
            end, sign = kept[i]
            shown = sign in entered or (got is not None and sign in got)
            expanded += unit.lines[i:end] if shown else [""] * (end - i)
            i = end
            continue
        if got is not None and _same(got, original):
            expanded.append(original)
        elif got is None or not got.strip():
            expanded.append("")
        else:
            expanded.append(original[:len(original) - len(original.lstrip())] + got.strip())
        i += 1
    return unit.changed(lines=[_dim3(ln) for ln in expanded], constants=constants, defines=list(defines))


def _constants(texts: list[list[str]]) -> dict[str, int]:
    """The integer constants the headers #define (`#define DEFAULT_TOKENS 2048`): sizes the program starts from."""
    out = {}
    for lines in texts:
        for i, ln in enumerate(lines):
            m = DEFINE.match(_directive(lines, i)) if DEFINE.match(ln) else None
            if m is None or m.group(3) is not None:
                continue
            found = define_value(m.group(4))
            if found is not None:
                out[m.group(1)] = found
    return out


def _dim3(line: str) -> str:
    """A launch configuration's braced dimensions as dim3's (`{32, 32, 1}` -> `dim3{32, 32, 1}`)."""
    return LAUNCH.sub(lambda m: "<<<" + re.sub(r"(^|,)(\s*)\{", r"\1\2dim3{", m.group(1)) + ">>>", line)
