"""load_workload validation: every bad workload.toml gives one CucoError line naming the file, the key and why."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from cuco.errors import CucoError
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload.expr import ExprError, eval_expr
from cuco.workload.spec import load_workload

REPO = Path(__file__).resolve().parents[1]
GEMM_ALLGATHER = REPO / "cuco" / "builtin" / "gemm_allgather"

# A small valid workload; tests derive broken ones from it with mutate().
BASE = """\
name = "tiny"
description = "a tiny test workload"
world_size = 2
params = ["M", "K"]
baselines = ["base"]

[[shapes]]
name = "s8"
M = 8
K = 4

[[small_shapes]]
name = "s4"
M = 4
K = 2

[buffers.a]
role = "input"
dtype = "f32"
shape = ["M / world", "K"]
symmetric = true

[buffers.c]
role = "output"
dtype = "f32"
shape = ["M", "K"]

[tolerance]
rtol = 0.02

[timing]
warmup = 1
iters = 2
trials = 2

[bounds]
flops = "2 * M * K"
comm_bytes = "(world - 1) * (M / world) * K * 4"

[candidates]
base = "cand.py"
other = "kernels/other.cu"
"""


REFERENCE = """\
def make_inputs(p, world, rank, gen, device):
    raise NotImplementedError


def reference(p, world, rank, inputs):
    raise NotImplementedError
"""


def mutate(text: str, old: str, new: str) -> str:
    """Replace one exact, present fragment of the template (fails loudly if the template drifted)."""
    assert text.count(old) == 1, f"fragment not found exactly once in template: {old!r}"
    return text.replace(old, new)


def make_workload(tmp_path: Path, toml_text: str = BASE, *, reference: bool = True,
                  candidates: tuple[str, ...] = ("cand.py", "kernels/other.cu"), name: str = "wl") -> Path:
    """A workload directory under tmp_path: workload.toml, reference.py and the candidate files."""
    root = tmp_path / name
    root.mkdir(parents=True)
    (root / "workload.toml").write_text(toml_text)
    if reference:
        (root / "reference.py").write_text(REFERENCE)
    for rel in candidates:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("# candidate\n")
    return root


def load_error(root: Path, **kwargs) -> str:
    with pytest.raises(CucoError) as info:
        load_workload(root, **kwargs)
    msg = str(info.value)
    assert msg, "empty error message"
    assert "\n" not in msg and "\r" not in msg, f"error is not one line: {msg!r}"
    return msg


def test_base_template_is_valid(tmp_path):
    spec = load_workload(make_workload(tmp_path))
    assert spec.name == "tiny"
    assert spec.world_size == 2
    assert spec.params == ("M", "K")
    assert [s.name for s in spec.shapes] == ["s8"]
    assert [s.name for s in spec.small_shapes] == ["s4"]
    assert spec.buffers["a"].symmetric and not spec.buffers["c"].symmetric
    assert spec.buffers["a"].dims(spec.shape("s8").env(2)) == (4, 4)
    assert spec.timing.trials == 2 and spec.timing.iters == 2
    assert spec.tolerance.rtol == 0.02
    assert set(spec.candidates) == {"base", "other"}
    assert spec.baselines == ["base"]
    assert spec.nccl_env == {}


def test_nccl_env_reaches_every_rank_and_the_record(tmp_path):
    """A workload's [nccl_env] is in the environment of each rank's process, and the record says so."""
    root = tmp_path / "wl"
    shutil.copytree(ROOT / "cuco" / "builtin" / "cpu_allgather_matmul", root)
    toml = root / "workload.toml"
    toml.write_text(toml.read_text().replace("[timing]", '[nccl_env]\nNCCL_PROTO = "Simple"\n\n[timing]', 1))
    # The reference (trusted code, unlike candidates) runs inside each rank: it refuses to make inputs without it.
    ref = root / "reference.py"
    ref.write_text(ref.read_text() + "\n\n_make_inputs = make_inputs\n\n\ndef make_inputs(*args):\n"
                   "    import os\n\n    assert os.environ.get('NCCL_PROTO') == 'Simple', 'no [nccl_env] here'\n"
                   "    return _make_inputs(*args)\n")
    spec = load_workload(root)
    assert spec.nccl_env == {"NCCL_PROTO": "Simple"}
    rec = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", max_level="L2"))
    assert rec.ok, rec.error
    assert rec.nccl_env == {"NCCL_PROTO": "Simple"}


def test_a_candidate_declared_with_nccl_settings_runs_under_them_by_its_name_only(tmp_path):
    """The same program under another NCCL protocol, as a baseline: the workload declares the settings, and they
    apply when the candidate is evaluated by that name, never to the file as such."""
    root = tmp_path / "wl"
    shutil.copytree(ROOT / "cuco" / "builtin" / "cpu_allgather_matmul", root)
    toml = root / "workload.toml"
    toml.write_text(toml.read_text().replace("[candidates]\n", '[candidates]\nseed_ll = { file = "seed.py", '
                                             'nccl_env = { NCCL_PROTO = "LL" } }\n', 1))
    ref = root / "reference.py"
    ref.write_text(ref.read_text() + "\n\n_make_inputs = make_inputs\n\n\ndef make_inputs(*args):\n"
                   "    import os\n\n    assert os.environ.get('NCCL_PROTO') == 'LL', 'not under seed_ll settings'\n"
                   "    return _make_inputs(*args)\n")
    spec = load_workload(root)
    assert spec.candidate_env == {"seed_ll": {"NCCL_PROTO": "LL"}} and spec.candidates["seed_ll"] == spec.seed_path
    rec = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", max_level="L2", name="seed_ll"))
    assert rec.ok, rec.error
    assert rec.nccl_env == {"NCCL_PROTO": "LL"} and rec.candidate_name == "seed_ll"
    plain = evaluate(spec, spec.seed_path, EvalOptions(device="cpu", max_level="L2"))
    assert not plain.ok and "not under seed_ll settings" in (plain.error or "") + plain.diagnostics


# (test id, old fragment, new fragment, substrings the one-line error must contain: key and reason)
BAD_TOML = [
    # missing required keys
    ("missing-name", 'name = "tiny"\n', "", ["name", "missing required key"]),
    ("missing-params", 'params = ["M", "K"]\n', "", ["params", "missing required key"]),
    ("missing-shapes", '[[shapes]]\nname = "s8"\nM = 8\nK = 4\n', "", ["shapes", "missing required key"]),
    ("missing-buffers",
     '[buffers.a]\nrole = "input"\ndtype = "f32"\nshape = ["M / world", "K"]\nsymmetric = true\n\n'
     '[buffers.c]\nrole = "output"\ndtype = "f32"\nshape = ["M", "K"]\n', "",
     ["buffers", "missing required key"]),
    ("missing-buffer-role", 'role = "output"\n', "", ["buffers.c.role", "missing required key"]),
    ("missing-buffer-dtype", 'role = "output"\ndtype = "f32"\n', 'role = "output"\n',
     ["buffers.c.dtype", "missing required key"]),
    ("missing-shape-param", 'name = "s8"\nM = 8\nK = 4\n', 'name = "s8"\nM = 8\n',
     ["shapes[0].K", "missing required key"]),
    ("missing-shape-name", 'name = "s8"\nM = 8\n', "M = 8\n", ["shapes[0].name", "missing required key"]),
    # wrong types
    ("world-size-string", "world_size = 2\n", 'world_size = "two"\n', ["world_size", "expected int", "'two'"]),
    ("world-size-bool", "world_size = 2\n", "world_size = true\n", ["world_size", "expected int"]),
    ("shape-param-string", 'name = "s8"\nM = 8\n', 'name = "s8"\nM = "8"\n', ["shapes[0].M", "expected int", "str"]),
    ("small-shape-param-string", 'name = "s4"\nM = 4\n', 'name = "s4"\nM = "4"\n',
     ["small_shapes[0].M", "expected int"]),
    ("symmetric-string", "symmetric = true\n", 'symmetric = "yes"\n',
     ["buffers.a.symmetric", "expected bool", "'yes'"]),
    ("symmetric-parameter", 'role = "input"\n', 'role = "parameter"\n', ["buffers.a.symmetric", "window"]),
    ("name-int", 'name = "tiny"\n', "name = 7\n", ["name", "expected str"]),
    ("timing-iters-float", "iters = 2\n", "iters = 2.5\n", ["timing.iters", "expected int"]),
    ("buffer-shape-bool-dim", 'shape = ["M", "K"]', 'shape = ["M", true]', ["buffers.c.shape", "dimension"]),
    ("shape-param-not-positive", 'name = "s8"\nM = 8\n', 'name = "s8"\nM = 0\n', ["shapes[0].M", "positive"]),
    # unknown values
    ("unknown-dtype", 'dtype = "f32"\nshape = ["M", "K"]', 'dtype = "bf17"\nshape = ["M", "K"]',
     ["buffers.c.dtype", "unknown dtype", "bf17"]),
    ("unknown-role", 'role = "output"\n', 'role = "result"\n', ["buffers.c.role", "unknown role", "result"]),
    ("no-output-buffer", 'role = "output"\n', 'role = "scratch"\n', ["buffers", "output"]),
    ("bad-determinism", "rtol = 0.02\n", 'rtol = 0.02\ndeterminism = "sometimes"\n', ["tolerance.determinism"]),
    ("bad-atol-scale", "rtol = 0.02\n", 'rtol = 0.02\natol_scale = "column"\n', ["tolerance.atol_scale", "row"]),
    ("tolerance-of-an-input", "symmetric = true\n", "symmetric = true\natol = 0.1\n",
     ["buffers.a.atol", "only an output"]),
    ("output-atol-not-a-number", 'role = "output"\n', 'role = "output"\natol = "loose"\n', ["buffers.c.atol"]),
    ("output-bad-atol-scale", 'role = "output"\n', 'role = "output"\natol_scale = "cols"\n',
     ["buffers.c.atol_scale"]),
    # unknown keys are rejected, not ignored
    ("unknown-key-top", 'name = "tiny"\n', 'name = "tiny"\ncolour = "blue"\n', ["colour", "unknown key"]),
    ("unknown-key-timing", "iters = 2\n", "iters = 2\niterz = 3\n", ["timing.iterz", "unknown key"]),
    ("unknown-key-tolerance", "rtol = 0.02\n", "rtol = 0.02\nrtoll = 0.5\n", ["tolerance.rtoll", "unknown key"]),
    ("unknown-key-buffer", "symmetric = true\n", "symmetric = true\nsymetric = false\n",
     ["buffers.a.symetric", "unknown key"]),
    ("unknown-key-shape", 'name = "s8"\nM = 8\n', 'name = "s8"\nM = 8\nQ = 3\n', ["shapes[0].Q", "unknown key"]),
    ("unknown-key-bounds", 'flops = "2 * M * K"\n', 'flops = "2 * M * K"\nflop = "1"\n',
     ["bounds.flop", "unknown key"]),
    ("unknown-table", "[timing]\n", "[timeing]\nwarmup = 1\n\n[timing]\n", ["timeing", "unknown key"]),
    # expressions
    ("shape-expr-unknown-param", 'shape = ["M / world", "K"]', 'shape = ["Q / world", "K"]',
     ["buffers.a.shape", "unknown parameter", "'Q'"]),
    ("shape-expr-forbidden", 'shape = ["M / world", "K"]', 'shape = ["M ** 2", "K"]', ["buffers.a.shape"]),
    ("shape-expr-unparsable", 'shape = ["M / world", "K"]', 'shape = ["M /", "K"]', ["buffers.a.shape"]),
    ("bounds-unknown-param", 'flops = "2 * M * K"\n', 'flops = "2 * M * N"\n',
     ["bounds.flops", "unknown parameter", "'N'"]),
    # candidates and baselines
    ("candidate-missing-file", 'base = "cand.py"\n', 'base = "nope.py"\n',
     ["candidates.base", "nope.py", "does not exist"]),
    ("candidate-wrong-suffix", 'other = "kernels/other.cu"\n', 'other = "workload.toml"\n',
     ["candidates.other", ".cu or .py"]),
    ("baseline-not-candidate", 'baselines = ["base"]\n', 'baselines = ["base", "zzz"]\n',
     ["baselines", "'zzz'", "not a key"]),
    # timing
    ("trials-one", "trials = 2\n", "trials = 1\n", ["timing.trials", "at least 2"]),
    ("trials-zero", "trials = 2\n", "trials = 0\n", ["timing.trials", "at least 2"]),
    # [nccl_env]
    ("nccl-env-not-nccl", "[timing]\n", "[nccl_env]\nLD_PRELOAD = \"x.so\"\n\n[timing]\n",
     ["nccl_env.LD_PRELOAD", "only NCCL_"]),
    ("nccl-env-pinned", "[timing]\n", "[nccl_env]\nNCCL_NVLS_ENABLE = 1\n\n[timing]\n",
     ["nccl_env.NCCL_NVLS_ENABLE", "set by the runner"]),
    ("nccl-env-table-value", "[timing]\n", "[nccl_env]\nNCCL_ALGO = [1]\n\n[timing]\n", ["nccl_env.NCCL_ALGO"]),
    ("candidate-env-pinned", 'base = "cand.py"\n', 'base = { file = "cand.py", nccl_env = { NCCL_NVLS_ENABLE = 1 } }\n',
     ["candidates.base.nccl_env.NCCL_NVLS_ENABLE", "set by the runner"]),
    ("candidate-table-unknown-key", 'base = "cand.py"\n', 'base = { file = "cand.py", env = { A = "1" } }\n',
     ["candidates.base.env", "unknown key"]),
    ("candidate-table-no-file", 'base = "cand.py"\n', 'base = { nccl_env = { NCCL_PROTO = "LL" } }\n',
     ["candidates.base.file", "missing required key"]),
    # world size
    ("world-size-zero", "world_size = 2\n", "world_size = 0\n", ["world_size", "at least 1"]),
]


@pytest.mark.parametrize("old,new,expected", [c[1:] for c in BAD_TOML], ids=[c[0] for c in BAD_TOML])
def test_bad_workload_toml(tmp_path, old, new, expected):
    root = make_workload(tmp_path, mutate(BASE, old, new))
    msg = load_error(root)
    assert str(root / "workload.toml") in msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_shape_not_divisible_by_world(tmp_path):
    toml = mutate(BASE, "world_size = 2\n", "world_size = 4\n")
    toml = mutate(toml, 'name = "s8"\nM = 8\n', 'name = "s8"\nM = 6\n')
    root = make_workload(tmp_path, toml)
    msg = load_error(root)
    assert str(root / "workload.toml") in msg
    assert "buffers.a.shape" in msg
    assert "'s8'" in msg and "world 4" in msg
    assert "does not divide" in msg


def test_world_size_override_checks_divisibility(tmp_path):
    root = make_workload(tmp_path)  # M = 8 and 4: divisible by 2 and 4, not by 3
    assert load_workload(root, world_size=4).world_size == 4
    msg = load_error(root, world_size=3)
    assert str(root / "workload.toml") in msg and "buffers.a.shape" in msg and "does not divide" in msg


def test_a_bound_that_does_not_divide_is_refused_on_loading(tmp_path):
    """Every full shape is timed, so each bound must be whole there: said on loading (cuco check, eval and evolve
    all load), not as a traceback once a candidate has run."""
    root = make_workload(tmp_path, mutate(BASE, 'flops = "2 * M * K"', 'flops = "2 * M * K / 7"'))
    msg = load_error(root)
    assert str(root / "workload.toml") in msg and "bounds.flops at shape 's8', world 2" in msg, msg
    assert "does not divide exactly" in msg


def test_a_bound_is_checked_at_a_small_shape_where_it_is_timed(tmp_path):
    """A small shape is timed only on the CPU or when named: its bound is checked there, before anything runs, and
    the cascade's failure is the workload's."""
    root = make_workload(tmp_path, mutate(BASE, 'flops = "2 * M * K"', 'flops = "2 * M * K / 64"'))
    spec = load_workload(root)  # 64 at s8: whole; 16 / 64 at s4 is not
    with pytest.raises(CucoError, match=r"workload\.toml: bounds\.flops at shape 's4', world 2: .* does not divide"):
        spec.check_bounds(spec.shape("s4"))
    (root / "cand.py").write_text("def setup(ctx):\n    pass\n\n\ndef run(ctx):\n    pass\n\n\n"
                                  "def teardown(ctx):\n    pass\n")
    record = evaluate(spec, root / "cand.py", EvalOptions(device="cpu", shapes=["s4"], work_dir=tmp_path / "w"))
    assert not record.ok and record.fault == "workload" and record.failed_level == "L4", record.error
    assert "bounds.flops at shape 's4'" in record.error and not (tmp_path / "w").exists()


def test_invalid_toml_syntax(tmp_path):
    root = make_workload(tmp_path, BASE + "\n[buffers.d\nrole = 'input'\n")
    msg = load_error(root)
    assert str(root / "workload.toml") in msg
    assert "not valid TOML" in msg


def test_duplicate_key_is_invalid_toml(tmp_path):
    root = make_workload(tmp_path, mutate(BASE, 'name = "tiny"\n', 'name = "tiny"\nname = "again"\n'))
    msg = load_error(root)
    assert str(root / "workload.toml") in msg and "not valid TOML" in msg


def test_missing_reference_py(tmp_path):
    root = make_workload(tmp_path, reference=False)
    msg = load_error(root)
    assert str(root / "reference.py") in msg
    assert "missing reference.py" in msg


@pytest.mark.parametrize("old,new,where,words", [
    ("def reference(", "def reference_of(", "reference.py",
     "defines no reference(p, world, rank, inputs) (the outputs every candidate is checked against)"),
    ("def make_inputs(p, world, rank, gen, device)", "def make_inputs(p, world, rank, gen)", "reference.py:1",
     "make_inputs takes 4 arguments; the judge calls make_inputs(p, world, rank, gen, device)"),
    ("", "def compute_alone(p, world, rank, inputs, bufs, group):\n    pass\n", "reference.py:1",
     "compute_alone takes 6 arguments; the judge calls compute_alone(view)"),
    ("", "def comm_alone():\n    pass\n", "reference.py:1", "comm_alone takes 0 arguments"),
    ("def make_inputs(p, world, rank, gen, device)", "def make_inputs(p, world, rank, gen, device, x, y=1)",
     "reference.py:1", "make_inputs takes 6 to 7 arguments"),
    ("def reference(p, world, rank, inputs):", "def reference(p, world,", "reference.py:5", "invalid Python"),
])
def test_a_reference_that_breaks_the_contract_fails_the_load(tmp_path, old, new, where, words):
    """The judge's calls, held to reference.py's definitions when the workload loads: the function and its line."""
    root = make_workload(tmp_path)
    (root / "reference.py").write_text(mutate(REFERENCE, old, new) if old else new + REFERENCE)
    msg = load_error(root)
    assert msg.startswith(f"{root / where}: ") and words in msg, msg


@pytest.mark.parametrize("text", [
    REFERENCE.replace("def reference(p, world, rank, inputs):", "def reference(*args):"),
    REFERENCE.replace("def reference(p, world, rank, inputs):", "def reference(p, world, rank, inputs, extra=0):"),
    REFERENCE + "\ndef compute_alone(view):\n    pass\n\n\ndef make_parameters(p, world, rank, gen, device): ...\n",
    "from shared import make_inputs\n" + REFERENCE.split("\n\n\n")[1],
    REFERENCE.split("\n\n\n")[0] + "\n\n\nreference = make_inputs\n",
])
def test_a_reference_within_the_contract_loads(tmp_path, text):
    """Defaults and *args fit any call; a name imported or assigned is taken as defined (its callability is checked
    when the judge loads the module)."""
    root = make_workload(tmp_path)
    (root / "reference.py").write_text(text)
    assert load_workload(root).name == "tiny"


def test_missing_workload_toml(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    msg = load_error(root)
    assert str(root / "workload.toml") in msg and "missing workload.toml" in msg


def test_workload_directory_does_not_exist(tmp_path):
    root = tmp_path / "no_such_dir"
    msg = load_error(root)
    assert str(root) in msg
    assert "does not exist" in msg


def test_candidate_file_absent_on_disk(tmp_path):
    """The toml is fine but the file it names was never written."""
    root = make_workload(tmp_path, candidates=("cand.py",))
    msg = load_error(root)
    assert str(root / "workload.toml") in msg
    assert "candidates.other" in msg and "kernels/other.cu" in msg and "does not exist" in msg


# ---- inputs that once escaped as tracebacks ----


def test_non_utf8_workload_toml(tmp_path):
    root = make_workload(tmp_path)
    (root / "workload.toml").write_bytes(b'name = "\xff"\n')
    msg = load_error(root)
    assert str(root / "workload.toml") in msg


def test_shapes_entry_not_a_table(tmp_path):
    toml = mutate(BASE, '[[shapes]]\nname = "s8"\nM = 8\nK = 4\n', "")
    toml = mutate(toml, 'baselines = ["base"]\n', 'baselines = ["base"]\nshapes = [1]\n')
    msg = load_error(make_workload(tmp_path, toml))
    assert "shapes[0]" in msg


def test_world_size_override_zero_rejected(tmp_path):
    msg = load_error(make_workload(tmp_path), world_size=0)
    assert "world_size" in msg


# ---- the built-in workload ----


def test_gemm_allgather_loads():
    spec = load_workload(GEMM_ALLGATHER)
    assert spec.name == "gemm_allgather"
    assert spec.world_size == 2
    assert spec.params == ("M", "K", "N")
    assert len(spec.shapes) == 5
    assert [s.name for s in spec.shapes] == ["8k", "4k", "8k_ffn", "1k", "decode"]
    assert spec.buffers["a"].symmetric
    assert spec.buffers["a"].role == "input"
    assert spec.buffers["c"].role == "output"
    assert spec.buffers["c"].dims(spec.shape("8k").env(2)) == (8192, 4096)
    assert spec.buffers["a"].dims(spec.shape("8k").env(2)) == (4096, 8192)
    assert spec.buffers["c"].nbytes(spec.shape("8k").env(2)) == 8192 * 4096 * 2
    for b in spec.baselines:
        assert b in spec.candidates
    for path in spec.candidates.values():
        assert path.is_file()
    assert spec.reference_path.is_file()


def test_gemm_allgather_world_4_loads():
    spec = load_workload(GEMM_ALLGATHER, world_size=4)
    assert spec.world_size == 4
    assert spec.buffers["c"].dims(spec.shape("8k").env(4)) == (8192, 2048)


def test_gemm_allgather_world_3_rejected():
    msg = load_error(GEMM_ALLGATHER, world_size=3)
    assert str(GEMM_ALLGATHER / "workload.toml") in msg
    assert "buffers." in msg and "world 3" in msg and "does not divide" in msg


def test_unknown_shape_name_is_one_line():
    spec = load_workload(GEMM_ALLGATHER)
    with pytest.raises(CucoError) as info:
        spec.shape("nope")
    msg = str(info.value)
    assert "\n" not in msg and "'nope'" in msg and "8k" in msg


# ---- eval_expr ----


def test_eval_expr_exact_division():
    assert eval_expr("M / world", {"M": 8192, "world": 2}) == 4096
    assert isinstance(eval_expr("M / world", {"M": 8192, "world": 2}), int)


def test_eval_expr_comm_bytes():
    env = {"M": 8192, "K": 4096, "world": 4}
    assert eval_expr("(world - 1) * (M / world) * K * 2", env) == 3 * 2048 * 4096 * 2


def test_eval_expr_int_and_floor_division():
    assert eval_expr(7, {}) == 7
    assert eval_expr("M // 3", {"M": 10}) == 3
    assert eval_expr("M + 2 * K - 1", {"M": 1, "K": 5}) == 10


def test_eval_expr_non_exact_division_raises():
    with pytest.raises(ExprError, match="does not divide"):
        eval_expr("M / world", {"M": 6, "world": 4})


def test_eval_expr_division_by_zero_raises():
    with pytest.raises(ExprError):
        eval_expr("M / world", {"M": 6, "world": 0})


@pytest.mark.parametrize("text", ["__import__('os')", "M ** 2", "M.bit_length()", "[M]", "-M", "M % 2", "1.5 * M",
                                  "M if K else 1", "M +"])
def test_eval_expr_rejects(text):
    with pytest.raises(ExprError):
        eval_expr(text, {"M": 4, "K": 2})


def test_eval_expr_unknown_name():
    with pytest.raises(ExprError, match="'Q'"):
        eval_expr("Q / world", {"M": 4, "world": 2})


@pytest.mark.parametrize("new,expected", [
    ('symmetric = ["partial", "nope"]', ["requires.symmetric", "'nope' is not a buffer"]),
    ('symmetric = ["a"]', ["requires.symmetric", "buffer 'a' is not declared symmetric"]),
    ("side_streams = -1", ["requires.side_streams", "cannot be negative"]),
    ("side_stream = 1", ["requires.side_stream", "unknown key"]),
])
def test_a_strategys_requirements_are_checked_against_its_workload(tmp_path, new, expected):
    """What a strategy needs is declared once, in workload.toml; a need the workload cannot meet fails on load."""
    root = tmp_path / "rs"
    shutil.copytree(ROOT / "cuco" / "builtin" / "gemm_reducescatter", root)
    toml = root / "workload.toml"
    old = 'requires = { lsa_team = true, side_streams = 1, symmetric = ["partial"] }'
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, f"requires = {{ lsa_team = true, {new} }}"))
    msg = load_error(root)
    assert "strategies.rs_gemm." in msg and all(part in msg for part in expected), msg


def test_a_strategys_options_reach_its_program(tmp_path):
    """[strategies.X] options: fixed choices beside the five dimensions, so one kernel file serves two strategies
    (ar_decode one-shot and two-shot); a Python program reads them from DESIGN (as Python values), a CUDA one as
    CUCO_OPT_<NAME>."""
    from cuco.evolve.strategy import materialize

    spec = load_workload(ROOT / "cuco" / "builtin" / "gemm_allreduce")
    one, two = spec.strategies["ar_decode"], spec.strategies["ar_decode_two_shot"]
    assert one.path == two.path and (one.options, two.options) == ((), (("two_shot", True),))
    for strategy, want in ((one, None), (two, True)):
        lines = materialize(strategy, strategy.points()[0]).splitlines()
        scope: dict = {}
        exec("\n".join(ln for ln in lines if ln.startswith(("DESIGN = ", "DESIGN.update("))), scope)
        assert scope["DESIGN"].get("two_shot") is want and scope["DESIGN"]["chunks"] == 1
    cuda = dataclasses.replace(spec.strategies["ar_gemm"], options=(("ring", 3), ("fast", True)))
    src = materialize(cuda, cuda.points()[0])
    assert "#define CUCO_OPT_RING 3\n#define CUCO_OPT_FAST 1\n" in src


@pytest.mark.parametrize("new,expected", [("chunks = 2", "not one of the five dimensions"),
                                          ('two_shot = "yes"', "bool or int")])
def test_a_strategy_option_is_a_name_of_its_own_and_a_number(tmp_path, new, expected):
    root = tmp_path / "ar"
    shutil.copytree(ROOT / "cuco" / "builtin" / "gemm_allreduce", root)
    toml = root / "workload.toml"
    toml.write_text(toml.read_text().replace("options = { two_shot = true }", f"options = {{ {new} }}"))
    msg = load_error(root)
    assert "strategies.ar_decode_two_shot.options." in msg and expected in msg, msg


def test_a_candidate_is_given_the_side_streams_it_declares_and_the_main_stream_in_the_other_slots(tmp_path):
    """The runner gates and joins only the side streams a candidate declares (cuco_needs' sideStreams, a Python
    module's SIDE_STREAMS): work put in another slot lands on the main stream, timed all the same."""
    from types import SimpleNamespace

    from cuco.runner.processes.candidate_process import CandidateProcess
    from cuco.runner.processes.loaded import CandidateError, PyContext, PythonCandidate

    host = SimpleNamespace(side_streams=["side0", "side1"], stream="main")
    both = ["side0", "side1"]
    for declared, slots, gated in ((0, ["main", "main"], []), (1, ["side0", "main"], ["side0"]), (2, both, both),
                                   (3, both, both)):
        got = CandidateProcess.side_streams_for(host, SimpleNamespace(declared_side_streams=declared))
        assert got == (slots, gated), declared
    ctx = PyContext(0, 1, None, None, None, [], {}, {})
    for text, want in (("def run(ctx): pass\n", 0), ("SIDE_STREAMS = 1\ndef run(ctx): pass\n", 1)):
        (tmp_path / "c.py").write_text(text)
        assert PythonCandidate(tmp_path / "c.py", ctx).declared_side_streams == want
    (tmp_path / "c.py").write_text("SIDE_STREAMS = 'two'\ndef run(ctx): pass\n")
    with pytest.raises(CandidateError, match="SIDE_STREAMS must be a count of side streams, got 'two'"):
        _ = PythonCandidate(tmp_path / "c.py", ctx).declared_side_streams
