"""`cuco init`: a workload directory around the user's own host-driven program, in one step.

A standalone program (its own main() that creates the communicator) is converted first (scaffold/standalone/):
the seed is its step in the candidate ABI, and the program itself is kept beside it as original.cu (its files in
original/, where it has several: a host .cpp and its kernels' .cu, say). The directory
is written next to its final place and moved there only once the workload loads: a failed scaffold leaves nothing
behind, and an existing directory is never touched.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cuco.errors import CucoError, CucoFailure
from cuco.language import is_cuda
from cuco.scaffold.infer import Scaffold, infer
from cuco.scaffold.program import Program
from cuco.scaffold.reference_file import reference_py
from cuco.scaffold.standalone import Conversion, convert, refine
from cuco.scaffold.standalone import read_program as read_standalone
from cuco.scaffold.toml_file import workload_toml

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_NAME = 100  # a folder's name, with room for the staging folder's prefix and suffix under a file system's 255


@dataclass
class Created:
    root: Path
    scaffold: Scaffold
    todos: int  # lines of workload.toml marked TODO
    warnings: list[str] = field(default_factory=list)
    reading: list[str] = field(default_factory=list)  # how a standalone program was read, one line each
    converted: bool = False  # seed.cu is cuco's conversion of a standalone program, not the user's own file


def read_program(program: Path) -> tuple[Program, bytes]:
    """The program parsed, or one line naming the file and the line the grammar stops at."""
    if not program.is_file():
        raise CucoError(str(program), "a folder, not a program's file" if program.is_dir() else "no such file")
    if not is_cuda(program):
        raise CucoError(str(program), "cuco init wraps a CUDA C++ (.cu) program")
    raw = program.read_bytes()
    if b"\0" in raw:
        raise CucoError(str(program), "not a text file")
    parsed = Program(program, raw)
    bad = parsed.syntax_error()
    if bad is not None:
        line, excerpt = bad
        raise CucoError(f"{program}:{line}", f"cannot parse as CUDA C++ near {excerpt!r} (the analysis needs the "
                                             "whole program; a macro the grammar does not know can cause this)")
    return parsed, raw


def _analysis(program: Path, raw: bytes, partial: bool = False):
    """The program's analysis; `partial`: a file with neither main() nor cuco_run(), which may be one of several."""
    from cuco.fastpath.analyze import AnalysisError, NoCommunication, analyze

    try:
        return analyze(program, raw)
    except NoCommunication:
        if not partial:
            raise CucoError(str(program), "no NCCL call found: cuco init takes a program whose ranks communicate with "
                                          "NCCL from the host") from None
        raise CucoError(str(program), "no NCCL call, no main() and no cuco_run(): cuco init takes a program whose "
                                      "ranks communicate with NCCL from the host, its own main() with every file it "
                                      "needs (--from host.cpp --from kernels.cu), or a seed with cuco_run()") from None
    except AnalysisError as exc:
        raise CucoError("", str(exc)) from None


def _write(sc: Scaffold, files: list[Path], seed: bytes | None, where: Path) -> None:
    """seed.cu is the program itself, or, for a converted one, the seed written for it beside the original."""
    where.mkdir()
    if seed is None:
        shutil.copyfile(files[0], where / "seed.cu")
    else:
        (where / "seed.cu").write_bytes(seed)
        if len(files) == 1:
            shutil.copyfile(files[0], where / "original.cu")
        else:
            (where / "original").mkdir()
            for f in files:
                shutil.copyfile(f, where / "original" / f.name)
    (where / "workload.toml").write_text(workload_toml(sc))
    (where / "reference.py").write_text(reference_py(sc))


def _loads(where: Path) -> str | None:
    from cuco.workload.spec import load_workload

    try:
        load_workload(where)
    except CucoError as exc:
        return str(exc)
    return None


def _converted(name: str, program: Path, conv: Conversion) -> tuple[Scaffold, bytes]:
    """The scaffold of the seed converted from a standalone program, and that seed."""
    seed = conv.source.encode()
    converted = Program(program, seed)
    bad = converted.syntax_error()
    if bad is not None:
        raise CucoFailure(f"{program.name} (converted):{bad[0]}", f"the seed cuco wrote does not parse near {bad[1]!r}")
    sc = infer(name, program, _analysis(program, seed), converted)
    refine(sc, conv)
    return sc, seed


def _standalone(files: list[Path], include_dirs: list[Path], defines: list[str]) -> tuple[Conversion | None, list]:
    """The conversion of a standalone program (None for one with cuco_run, or without main()), and its files in
    the order the unit joins them."""
    unit, root = read_standalone(files, include_dirs, defines)
    conv = convert(unit.main_file, unit.raw, root, unit)
    if conv is None and len(files) > 1:
        raise CucoError(str(unit.main_file), "several files are read as one standalone program (its own main(), "
                                             "which creates the communicator); a program with cuco_run() is one .cu "
                                             "file")
    return conv, unit.files


def create_workload(name: str, program: Path | list[Path], parent: Path, include_dirs: list[Path] | None = None,
                    defines: list[str] | None = None) -> Created:
    """PARENT/NAME with seed.cu (the program, or the step of a standalone one in the candidate ABI, with the
    program as original.cu), workload.toml (its analysis) and reference.py (stubs to write). A standalone program
    may come in several files, read with the include folders and defines given."""
    if not NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise CucoError(repr(name[:80]), f"a workload name is at most {MAX_NAME} letters, digits, '_', '.' and '-', "
                                         "starting with a letter or digit")
    target = parent / name
    if target.exists():
        raise CucoError(str(target), "already exists; cuco init never overwrites (choose another NAME or --dir)")
    if parent.exists() and not parent.is_dir():
        raise CucoError(str(parent), "not a directory (--dir)")
    files = [program] if isinstance(program, Path) else list(program)
    conv, files = _standalone(files, list(include_dirs or []), list(defines or []))
    if conv is None:  # the program is a seed already: the scaffold is its analysis
        parsed, raw = read_program(files[0])
        sc, seed = infer(name, files[0], _analysis(files[0], raw, "cuco_run" not in parsed.functions), parsed), None
    else:
        sc, seed = _converted(name, files[-1], conv)
    if not sc.buffers:  # a workload moves data: one without buffers would not load
        raise CucoError(str(files[-1]), "no buffer of the step can be followed to where it is allocated (cudaMalloc "
                                        "or ncclMemAlloc of a pointer main() declares, or a helper of main()'s that "
                                        "returns one): cuco cannot make a workload without buffers"
                        if conv is not None else "the program names no workload buffer (cuco_buffer(ctx, \"x\"))")
    try:
        parent.mkdir(parents=True, exist_ok=True)  # only once the program is understood: a refusal leaves nothing
    except OSError as exc:
        raise CucoError(str(parent), f"cannot make the folder (--dir): {exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=parent) as tmp:
            staged = Path(tmp) / name
            _write(sc, files, seed, staged)
            problem = _loads(staged)
            if problem is not None:  # named as the workload will be, not by the staging folder that goes with it
                raise CucoError(str(files[-1]), "cuco init cannot scaffold a workload that loads "
                                                f"({problem.replace(str(staged), str(target))})")
            staged.rename(target)
    except OSError as exc:  # a folder it may not write to, a full disk
        raise CucoError(str(parent), f"cannot write the workload there (--dir): {exc.strerror or exc}") from None
    todos = sum("TODO" in line for line in (target / "workload.toml").read_text().splitlines())
    return Created(target, sc, todos, list(sc.warnings), conv.reading if conv is not None else [], conv is not None)
