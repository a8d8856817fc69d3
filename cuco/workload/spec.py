"""The workload format: workload.toml, reference.py, seed.cu and optional candidates, validated on load.

Every error names the file, the key and the reason in one line (CucoError), and unknown keys are
rejected rather than ignored: a misspelled tolerance must not silently fall back to a default.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from cuco.dtypes import DTYPES
from cuco.errors import CucoError
from cuco.language import SUFFIX
from cuco.machine import SAFE_ENV
from cuco.tomlconfig import Section as _Section
from cuco.tomlconfig import load_dataclass as _load_dataclass
from cuco.workload.contract import check_contract
from cuco.workload.expr import ExprError, eval_expr, names_in

if TYPE_CHECKING:
    from cuco.designspace import DesignPoint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# input: fresh every run, delivered inside the timed region, checked unchanged; inout: delivered the same way,
# updated in place by the run and verified (an in-place all-reduce's buffer); parameter: drawn once per shape
# (weights), never poisoned, checked unchanged; output: poisoned, verified; scratch: poisoned.
ROLES = ("input", "inout", "parameter", "output", "scratch")
DELIVERED = ("input", "inout")  # drawn by make_inputs for every run, written into the buffer as its clock starts
VERIFIED = ("output", "inout")  # what reference returns: compared after every run the judge checks
ATOL_SCALES = ("tensor", "row")
OUTPUT_TOLERANCE = ("rtol", "atol", "norm_rtol", "atol_scale")  # keys an output buffer may set for itself


@dataclass(frozen=True)
class BufferSpec:
    """One buffer every rank holds; its shape is expressions over the shape parameters and `world`."""

    name: str
    role: str
    dtype: str
    shape: tuple[str | int, ...]
    symmetric: bool = False
    # An output's own [tolerance] keys (rtol, atol, norm_rtol, atol_scale), over the workload's.
    tolerance: tuple[tuple[str, float | str], ...] = ()

    def dims(self, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(eval_expr(d, env) for d in self.shape)

    def nbytes(self, env: dict[str, int]) -> int:
        n = DTYPES[self.dtype].size
        for d in self.dims(env):
            n *= d
        return n


@dataclass(frozen=True)
class Shape:
    name: str
    params: dict[str, int]

    def env(self, world: int) -> dict[str, int]:
        return {**self.params, "world": world}

    def label(self) -> str:
        return ",".join(str(v) for v in self.params.values())


@dataclass(frozen=True)
class Tolerance:
    """Elementwise |out-ref| <= rtol*|ref| + atol*rms(ref), and ||out-ref|| / ||ref|| <= norm_rtol."""

    rtol: float = 0.02
    atol: float = 0.02
    norm_rtol: float = 0.01
    determinism: str = "bitwise"  # "bitwise": two runs on the same inputs must agree exactly; "tolerance"
    # What atol is a fraction of: the rms of the whole output ("tensor"), or of each vector along its last
    # dimension ("row": for outputs whose rows differ in size by orders, as attention's over few or many keys).
    atol_scale: str = "tensor"


@dataclass(frozen=True)
class Timing:
    warmup: int = 5
    iters: int = 30
    trials: int = 2  # correctness trials, each on fresh random inputs
    l2_flush: bool = True
    timeout_s: float = 300.0  # watchdog: whole evaluation of one candidate
    bound_slack: float = 0.05  # a median below the speed of light * (1 - slack) is rejected as impossible
    # The CPU has no speed of light: the library bound stands in, and its own measurement moves by half from
    # one run to the next (benchmarks/results/cpu_bound_noise.md: 0.216 to 0.417 ms), so a program at the true
    # bound may sit 48% under a high one; 1.5x that.
    cpu_bound_slack: float = 0.72


@dataclass(frozen=True)
class Bounds:
    flops: str = "0"  # per rank
    # The least bytes a rank must read from and write to its own memory (inputs and weights read once, outputs
    # written once): the HBM term of the speed of light.
    hbm_bytes: str = "0"
    comm_bytes: str = "0"  # bytes each rank must receive over its peer links
    # Of those, bytes that exist only once the compute is over (the last layer's output): added to the bound.
    serial_comm_bytes: str = "0"


BOUND_KEYS = tuple(f.name for f in fields(Bounds))


WORKLOAD_INCLUDE = "include"  # a workload's own headers: on its programs' include path, and theirs alone


def workload_includes(root: Path) -> tuple[Path, ...]:
    d = root / WORKLOAD_INCLUDE
    return (d.resolve(),) if d.is_dir() else ()


@dataclass(frozen=True)
class Requirements:
    """What a CUDA strategy needs from the runner ([strategies.X] requires): the materialised program exports it
    as cuco_needs (cuco.h), and the runner checks it before cuco_setup, so a strategy needs no checks of its own."""

    lsa_team: bool = False  # every rank in one LSA team (one NVLink domain)
    side_streams: int = 0
    symmetric: tuple[str, ...] = ()  # buffers it reaches through their windows
    # The placements whose points use the side streams (every point where empty): a point at another placement
    # asks for none, so its runs do not pay for joining them.
    side_streams_at: tuple[str, ...] = ()

    def sides_at_placement(self, placement: str) -> int:
        return self.side_streams if not self.side_streams_at or placement in self.side_streams_at else 0


@dataclass(frozen=True)
class StrategySpec:
    """A parameterised strategy kernel: the design points (per dimension) it accepts, its only accept-list."""

    name: str
    path: Path
    accepts: dict[str, tuple]  # dimension -> accepted values
    includes: tuple[Path, ...] = ()  # its workload's own header folder, where it has one
    # Compile-time definitions every point of it gets beside the point's own (a derived strategy's CTA count).
    defines: tuple[tuple[str, str], ...] = ()
    # (dimension, value, macro): the macro is defined at the points with that value (a derived strategy's knobs).
    point_defines: tuple[tuple[str, str, str], ...] = ()
    requires: Requirements = field(default_factory=Requirements)
    # Combinations it does not take although each value is accepted: a point whose dimensions all hold one of the
    # values listed (dimension -> values) repeats another point's program (a derived strategy's).
    excludes: tuple[dict[str, tuple], ...] = ()
    # Fixed choices of its own beyond the five dimensions ([strategies.X] options), so that one kernel file serves
    # several strategies (ar_decode one-shot and two-shot): a Python strategy reads them from DESIGN, a CUDA one as
    # CUCO_OPT_<NAME>.
    options: tuple[tuple[str, bool | int], ...] = ()

    def excluded(self, point: DesignPoint) -> str | None:
        """Why POINT is one of the excluded combinations, or None."""
        for ex in self.excludes:
            if all(getattr(point, dim) in values for dim, values in ex.items()):
                return " with ".join(f"{dim} {getattr(point, dim)}" for dim in ex)
        return None

    def points(self, machine: dict | None = None) -> list[DesignPoint]:
        """Every design point it accepts that no global constraint rules out and it does not exclude, in a fixed
        order."""
        import itertools

        from cuco.designspace import DIMENSIONS, DesignPoint, violations

        combos = itertools.product(*(self.accepts[d] for d in DIMENSIONS))
        return [p for p in (DesignPoint(*c) for c in combos) if not violations(p, machine) and not self.excluded(p)]


@dataclass
class WorkloadSpec:
    name: str
    root: Path
    description: str
    world_size: int
    params: tuple[str, ...]
    shapes: list[Shape]
    small_shapes: list[Shape]
    buffers: dict[str, BufferSpec]
    tolerance: Tolerance
    timing: Timing
    bounds: Bounds
    candidates: dict[str, Path]
    baselines: list[str]
    strategies: dict[str, StrategySpec] = field(default_factory=dict)
    notes: str = ""
    source: Path = field(default=Path())
    nccl_env: dict[str, str] = field(default_factory=dict)
    # Candidates declared with NCCL settings of their own (name -> settings), applied over nccl_env.
    candidate_env: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def includes(self) -> tuple[Path, ...]:
        """Folders of headers the workload's CUDA programs may include beside cuco's (its `include/`)."""
        return workload_includes(self.root)

    @property
    def reference_path(self) -> Path:
        return self.root / "reference.py"

    @property
    def seed_path(self) -> Path | None:
        """The host-driven starting point: the candidate named "seed"."""
        return self.candidates.get("seed")

    def tolerance_for(self, output: str) -> Tolerance:
        """The workload's [tolerance] with the output's own keys over it."""
        return replace(self.tolerance, **dict(self.buffers[output].tolerance))

    def shape(self, name: str) -> Shape:
        for s in self.shapes + self.small_shapes:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.shapes + self.small_shapes)
        raise CucoError(str(self.source), f"no shape named {name!r} (known: {known})")

    def check_world(self, world: int) -> None:
        """Every buffer of every shape must have whole dimensions at this world size, and every bound a whole value
        at each full shape (all are timed): found on loading, not as a traceback once a candidate has run."""
        for shape in self.shapes + self.small_shapes:
            for buf in self.buffers.values():
                try:
                    buf.dims(shape.env(world))
                except ExprError as exc:
                    raise CucoError(
                        str(self.source), f"buffers.{buf.name}.shape at shape {shape.name!r}, world {world}: {exc}"
                    ) from None
        for shape in self.shapes:
            self.check_bounds(shape, world)

    def check_bounds(self, shape: Shape, world: int | None = None) -> None:
        """The [bounds] formulas must divide exactly at a shape that is timed (a small one too, where it is timed:
        on the CPU, or named by --shape); a CucoError naming workload.toml, the key and the shape if not."""
        world = self.world_size if world is None else world
        for key in BOUND_KEYS:
            try:
                eval_expr(getattr(self.bounds, key), shape.env(world))
            except ExprError as exc:
                raise CucoError(str(self.source), f"bounds.{key} at shape {shape.name!r}, world {world}: {exc}") \
                    from None


def _load_shapes(top: _Section, key: str, params: tuple[str, ...], required: bool) -> list[Shape]:
    top.used.add(key)
    raw = top.data.get(key, [])
    if required and not raw:
        raise top.fail(key, f"missing required key (at least one [[{key}]] table)")
    if not isinstance(raw, list):
        raise top.fail(key, f"expected an array of tables ([[{key}]])")
    shapes = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise top.fail(f"{key}[{i}]", f"expected a table with name and {', '.join(params)}, got {entry!r}")
        sec = _Section(entry, top.path, f"{key}[{i}].")
        name = sec.get("name", str)
        values = {p: sec.get(p, int) for p in params}
        for p, v in values.items():
            if v <= 0:
                raise sec.fail(p, f"must be positive, got {v}")
        sec.done()
        shapes.append(Shape(name, values))
    return shapes


def _load_requirements(sec: _Section, buffers: dict[str, BufferSpec]) -> Requirements:
    req = Requirements(sec.get("lsa_team", bool, False), sec.get("side_streams", int, 0),
                       tuple(sec.get("symmetric", list[str], [])))
    sec.done()
    for name in req.symmetric:
        if name not in buffers:
            raise sec.fail("symmetric", f"{name!r} is not a buffer of this workload")
        if not buffers[name].symmetric:
            raise sec.fail("symmetric", f"buffer {name!r} is not declared symmetric ([buffers.{name}] symmetric)")
    if req.side_streams < 0:
        raise sec.fail("side_streams", f"cannot be negative, got {req.side_streams}")
    return req


def _load_options(sec: _Section) -> tuple[tuple[str, bool | int], ...]:
    from cuco.designspace.dimensions import DIMENSIONS

    options = []
    for name in sec.data:
        if not name.isidentifier() or name in DIMENSIONS:
            raise sec.fail(name, "an option is a name of its own (an identifier, not one of the five dimensions)")
        options.append((name, sec.get(name, (bool, int))))
    sec.done()
    return tuple(options)


def _load_strategies(ssec: _Section, root: Path, buffers: dict[str, BufferSpec]) -> dict[str, StrategySpec]:
    from cuco.designspace.dimensions import DIMENSIONS

    out = {}
    for sname in ssec.data:
        sec = ssec.table(sname)
        rel = sec.get("file", str)
        if not (root / rel).is_file():
            raise sec.fail("file", f"strategy file {rel!r} does not exist")
        accepts = {}
        for dim, allowed in DIMENSIONS.items():
            values = sec.get(dim, list)
            for v in values:
                if v not in allowed:
                    raise sec.fail(dim, f"{v!r} is not a value of {dim} (known: {', '.join(map(str, allowed))})")
            if not values:
                raise sec.fail(dim, "accepts no value")
            accepts[dim] = tuple(values)
        options = _load_options(sec.table("options"))
        requires = _load_requirements(sec.table("requires"), buffers)
        if requires != Requirements() and not rel.endswith(".cu"):
            raise sec.fail("requires", "is checked through cuco_needs (cuco.h): CUDA strategies only")
        sec.done()
        out[sname] = StrategySpec(sname, root / rel, accepts, workload_includes(root), requires=requires,
                                  options=options)
    ssec.done()
    return out


def _load_nccl_env(sec: _Section) -> dict[str, str]:
    """[nccl_env]: NCCL settings every candidate of the workload runs under, each with the reason beside it.

    For seeds that NCCL mishandles on the runner's buffers: NCCL 2.28.9's send/recv into the runner's
    NCCL_WIN_COLL_SYMMETRIC windows received nothing from the peer until NCCL_LOCAL_REGISTER=0."""
    env = {}
    for key in sec.data:
        value = sec.get(key, (str, int, bool))
        if not key.startswith("NCCL_"):
            raise sec.fail(key, "only NCCL_* variables may be set here")
        if key in SAFE_ENV:
            raise sec.fail(key, "set by the runner for every program; a workload may not change it")
        env[key] = str(int(value) if isinstance(value, bool) else value)
    return env


def _read_toml(root: Path) -> tuple[Path, dict]:
    path = root / "workload.toml"
    if not root.is_dir():
        raise CucoError(str(root), "workload directory does not exist")
    if not path.is_file():
        raise CucoError(str(path), "missing workload.toml")
    try:
        return path, tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CucoError(str(path), f"not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CucoError(str(path), f"not valid TOML: {exc}") from None


def _load_buffer(sec: _Section, name: str, params: tuple[str, ...]) -> BufferSpec:
    role = sec.get("role", str)
    if role not in ROLES:
        raise sec.fail("role", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    dtype = sec.get("dtype", str)
    if dtype not in DTYPES:
        raise sec.fail("dtype", f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    dims = sec.get("shape", list)
    for d in dims:
        if not isinstance(d, (str, int)) or isinstance(d, bool):
            raise sec.fail("shape", f"each dimension must be an integer or an expression string, got {d!r}")
        if isinstance(d, str):
            try:
                unknown = names_in(d) - set(params) - {"world"}
            except ExprError as exc:
                raise sec.fail("shape", str(exc)) from None
            if unknown:
                raise sec.fail("shape", f"unknown parameter {sorted(unknown)[0]!r} in {d!r}")
    symmetric = sec.get("symmetric", bool, False)
    if symmetric and role == "parameter":
        raise sec.fail("symmetric", "a parameter is the judge's memory, mapped by the candidate's process; it cannot "
                                    "be a window (copy it into a symmetric scratch buffer in setup)")
    tolerance = tuple((key, sec.get(key, str if key == "atol_scale" else float)) for key in OUTPUT_TOLERANCE
                      if key in sec.data)
    if tolerance and role not in VERIFIED:
        raise sec.fail(tolerance[0][0], "only an output (or an inout buffer) has a tolerance")
    if dict(tolerance).get("atol_scale", "tensor") not in ATOL_SCALES:
        raise sec.fail("atol_scale", f"expected one of {', '.join(ATOL_SCALES)}")
    sec.done()
    return BufferSpec(name, role, dtype, tuple(dims), symmetric, tolerance)


def _load_buffers(top: _Section, params: tuple[str, ...]) -> dict[str, BufferSpec]:
    bsec = top.table("buffers", required=True)
    buffers = {name: _load_buffer(bsec.table(name), name, params) for name in bsec.data}
    bsec.done()
    if not any(b.role in VERIFIED for b in buffers.values()):
        raise top.fail("buffers", "at least one buffer must have role = \"output\" (or \"inout\": updated in place)")
    return buffers


def _load_measurement(top: _Section, params: tuple[str, ...]) -> tuple[Tolerance, Timing, Bounds]:
    """[tolerance], [timing] and [bounds]: how outputs are compared, how times are taken, what they are held to."""
    tolerance = _load_dataclass(Tolerance, top.table("tolerance"))
    if tolerance.determinism not in ("bitwise", "tolerance"):
        raise top.fail("tolerance.determinism", "expected \"bitwise\" or \"tolerance\"")
    if tolerance.atol_scale not in ATOL_SCALES:
        raise top.fail("tolerance.atol_scale", f"expected one of {', '.join(ATOL_SCALES)}")
    timing = _load_dataclass(Timing, top.table("timing"))
    if timing.trials < 2:
        raise top.fail("timing.trials", "at least 2 trials on fresh inputs are required")
    bounds = _load_dataclass(Bounds, top.table("bounds"))
    for key in BOUND_KEYS:
        try:
            unknown = names_in(getattr(bounds, key)) - set(params) - {"world"}
        except ExprError as exc:
            raise top.fail(f"bounds.{key}", str(exc)) from None
        if unknown:
            raise top.fail(f"bounds.{key}", f"unknown parameter {sorted(unknown)[0]!r}")
    return tolerance, timing, bounds


def _load_candidates(top: _Section, root: Path) -> tuple[dict[str, Path], list[str], dict[str, dict[str, str]]]:
    """[candidates]: name = "file", or name = { file = "file", nccl_env = { NCCL_X = ... } } for a program that
    runs under NCCL settings of its own (the same seed under another protocol, as a baseline), beside
    [nccl_env]."""
    csec = top.table("candidates")
    candidates, envs = {}, {}
    for cname in csec.data:
        if isinstance(csec.data[cname], dict):
            sub = csec.table(cname)
            rel = sub.get("file", str)
            envs[cname] = _load_nccl_env(sub.table("nccl_env"))
            sub.done()
        else:
            rel = csec.get(cname, str)
        cpath = root / rel
        if not cpath.is_file():
            raise csec.fail(cname, f"candidate file {rel!r} does not exist")
        if cpath.suffix not in SUFFIX.values():
            raise csec.fail(cname, f"candidate must be a .cu or .py file, got {rel!r}")
        candidates[cname] = cpath
    baselines = top.get("baselines", list, [])
    for b in baselines:
        if b not in candidates:
            raise top.fail("baselines", f"{b!r} is not a key of [candidates]")
    return candidates, list(baselines), envs


def load_workload(root: Path, world_size: int | None = None) -> WorkloadSpec:
    """Load and validate a workload directory; world_size overrides the file's default."""
    root = Path(root)
    path, data = _read_toml(root)
    top = _Section(data, path, "")
    name = top.get("name", str)
    description = top.get("description", str, "")
    world = top.get("world_size", int, 2)
    params = tuple(top.get("params", list))
    if not params or not all(isinstance(p, str) and p.isidentifier() and p != "world" for p in params):
        raise top.fail("params", "expected a non-empty list of identifiers (not 'world')")
    shapes = _load_shapes(top, "shapes", params, required=True)
    small = _load_shapes(top, "small_shapes", params, required=False)
    buffers = _load_buffers(top, params)
    tolerance, timing, bounds = _load_measurement(top, params)
    candidates, baselines, candidate_env = _load_candidates(top, root)
    strategies = _load_strategies(top.table("strategies"), root, buffers)
    nccl_env = _load_nccl_env(top.table("nccl_env"))
    top.done()
    if not (root / "reference.py").is_file():
        raise CucoError(str(root / "reference.py"), "missing reference.py")
    check_contract(root / "reference.py")
    notes_path = root / "notes.md"
    spec = WorkloadSpec(name=name, root=root, description=description,
                        world_size=world if world_size is None else world_size, params=params, shapes=shapes,
                        small_shapes=small, buffers=buffers, tolerance=tolerance, timing=timing, bounds=bounds,
                        candidates=candidates, baselines=baselines, strategies=strategies,
                        notes=notes_path.read_text() if notes_path.is_file() else "", source=path, nccl_env=nccl_env,
                        candidate_env=candidate_env)
    if spec.world_size < 1:
        raise CucoError(str(path), f"world_size: must be at least 1, got {spec.world_size}")
    spec.check_world(spec.world_size)
    return spec
