"""The real `cuco` command on bad input: exit code 2, exactly one `error:` line on stderr, never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A workload whose workload.toml is fine except for what a case breaks.
GOOD_TOML = """\
name = "tiny"
params = ["M"]
baselines = ["base"]

[[shapes]]
name = "s"
M = 8

[buffers.c]
role = "output"
dtype = "f32"
shape = ["M"]

[candidates]
base = "cand.py"
"""


def _workload(tmp_path: Path, toml_text: str) -> Path:
    root = tmp_path / "wl"
    root.mkdir()
    (root / "workload.toml").write_text(toml_text)
    (root / "reference.py").write_text("def make_inputs(p, world, rank, gen, device): ...\n"
                                       "def reference(p, world, rank, inputs): ...\n")
    (root / "cand.py").write_text("# candidate\n")
    return root


def broken_toml_dir(tmp_path: Path) -> str:
    return str(_workload(tmp_path, GOOD_TOML + "\n[candidates\nother = 'x.py'\n"))


def no_name_dir(tmp_path: Path) -> str:
    return str(_workload(tmp_path, GOOD_TOML.replace('name = "tiny"\n', "")))


def txt_file(tmp_path: Path) -> str:
    p = tmp_path / "some_file.txt"
    p.write_text("not a kernel\n")
    return str(p)


def run_dir(tmp_path: Path) -> str:
    from cuco.evolve.database import Database

    (tmp_path / "run").mkdir()
    Database(tmp_path / "run" / "cuco.db").close()  # an empty store: what the flags are checked against
    return str(tmp_path / "run")


def _cpu_example_with(tmp_path: Path, *edits: tuple[str, str]) -> str:
    """The CPU example, copied into tmp_path, with each (old, new) edit made once in its workload.toml."""
    root = tmp_path / "edited"
    shutil.copytree(REPO / "cuco" / "builtin" / "cpu_allgather_matmul", root,
                    ignore=shutil.ignore_patterns("__pycache__"))
    text = (root / "workload.toml").read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    (root / "workload.toml").write_text(text)
    return str(root)


FLOPS = 'flops = "2 * M * K * (N / world)"'


def bound_not_whole(tmp_path: Path) -> str:
    """Its bound divides at no shape: every command that loads it says so."""
    return _cpu_example_with(tmp_path, (FLOPS, 'flops = "2 * M * K * N / 7"'))


def small_bound_not_whole(tmp_path: Path) -> str:
    """Its bound divides at the full shape (N = 510) and at 'tiny', not at the small shape 'odd'."""
    return _cpu_example_with(tmp_path, (FLOPS, 'flops = "2 * M * K * N / 5"'), ("N = 512", "N = 510"))


BOUND_WORDS = ["workload.toml", "bounds.flops", "world 2", "does not divide exactly"]

# (id, argv; a callable item is given tmp_path and returns the argument, substrings stderr must contain)
CASES = [
    ("ui-bad-host", ["ui", run_dir, "--host", "256.1.1.1"], ["--host", "256.1.1.1"]),
    ("eval-unknown-workload", ["eval", "no_such_workload", "x.py"], ["no_such_workload", "gemm_allgather"]),
    ("eval-missing-candidate", ["eval", "gemm_allgather", "does_not_exist.py"], ["does_not_exist.py", "torch_host"]),
    ("eval-invalid-toml", ["eval", broken_toml_dir, "x.py"], ["workload.toml", "not valid TOML"]),
    ("baseline-unknown-workload", ["baseline", "no_such_workload"], ["no_such_workload"]),
    ("baseline-missing-name", ["baseline", no_name_dir], ["workload.toml", "name", "missing required key"]),
    ("eval-bogus-option", ["eval", "gemm_allgather", "torch_host", "--bogus-option"], ["--bogus-option"]),
    ("eval-bad-level", ["eval", "gemm_allgather", "torch_host", "--level", "L9"], ["--level", "L9"]),
    ("eval-bad-shape", ["eval", "gemm_allgather", "torch_host", "--shape", "nope"], ["'nope'", "8k"]),
    ("eval-bad-device", ["eval", "gemm_allgather", "torch_host", "--device", "tpu"], ["--device", "tpu"]),
    ("eval-bad-gpus", ["eval", "gemm_allgather", "torch_host", "--gpus", "a,b"], ["--gpus", "a,b"]),
    ("doctor-bogus-option", ["doctor", "--bogus"], ["--bogus"]),
    ("eval-wrong-suffix", ["eval", "gemm_allgather", txt_file], ["some_file.txt", ".cu or .py"]),
    ("eval-world-zero", ["eval", "cpu_allgather_matmul", "seed", "--world", "0"], ["error: --world:", "at least 1"]),
    ("evolve-world-zero", ["evolve", "cpu_allgather_matmul", "--world", "-1"], ["error: --world:", "at least 1"]),
    ("check-bound-not-whole", ["check", bound_not_whole], [*BOUND_WORDS, "shape 'cpu'"]),
    ("eval-bound-not-whole", ["eval", bound_not_whole, "seed"], [*BOUND_WORDS, "shape 'cpu'"]),
    ("evolve-bound-not-whole", ["evolve", bound_not_whole, "--run-dir", lambda tmp: str(tmp / "run")],
     [*BOUND_WORDS, "shape 'cpu'"]),
    ("check-small-bound-not-whole", ["check", small_bound_not_whole], [*BOUND_WORDS, "shape 'odd'"]),
    ("eval-small-bound-not-whole", ["eval", small_bound_not_whole, "seed", "--shape", "odd"],
     [*BOUND_WORDS, "shape 'odd'"]),
    ("evolve-small-bound-not-whole", ["evolve", small_bound_not_whole, "--shape", "odd", "--run-dir",
                                      lambda tmp: str(tmp / "run")], [*BOUND_WORDS, "shape 'odd'"]),
]


def run_cuco(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["CUCO_HOME"] = str(home)
    for var in ("CUCO_WORKLOADS_PATH", "FORCE_COLOR", "PY_COLORS", "CLICOLOR_FORCE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "cuco", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("argv,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cli_error_is_one_line(tmp_path, argv, expected):
    home = tmp_path / "cuco_home"
    args = [a(tmp_path) if callable(a) else a for a in argv]
    proc = run_cuco(args, home)
    report = f"cuco {' '.join(args)}\n--- rc {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    assert "Traceback" not in proc.stdout and "Traceback" not in proc.stderr, report
    assert proc.returncode == 2, report
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, report
    line = lines[0]
    assert line.strip(), report
    assert line.startswith("error:"), report
    assert "\x1b[" not in line, report  # no colour codes when stderr is not a terminal
    for part in expected:
        assert part in line, f"{part!r} missing\n{report}"
    # Nothing ran, so nothing was recorded, and no run directory was made.
    assert not (home / "records").exists() or not any((home / "records").iterdir()), report
    assert not (tmp_path / "run").exists() or argv[0] == "ui", report


@pytest.mark.parametrize("command", [["eval", "cpu_allgather_matmul", "seed"], ["baseline", "cpu_allgather_matmul"],
                                     ["evolve", "cpu_allgather_matmul"], ["transform", "allreduce_sum"]])
def test_a_world_below_one_is_the_flags_fault_not_the_workloads(tmp_path, command):
    proc = run_cuco([*command, "--world", "0"], tmp_path / "home")
    assert proc.returncode == 2 and proc.stderr == "error: --world: must be at least 1, got 0\n", proc.stderr


def test_error_text_in_brackets_survives(tmp_path):
    """Messages quote TOML syntax such as [candidates] and [[shapes]]; the printer must not eat it as markup."""
    root = _workload(tmp_path, GOOD_TOML.replace('baselines = ["base"]', 'baselines = ["zzz"]'))
    proc = run_cuco(["baseline", str(root)], tmp_path / "cuco_home")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: {root / 'workload.toml'}: baselines: 'zzz' is not a key of [candidates]"
    ], proc.stderr


def test_non_utf8_workload_toml(tmp_path):
    root = _workload(tmp_path, GOOD_TOML)
    (root / "workload.toml").write_bytes(b'name = "\xff"\n')
    proc = run_cuco(["eval", str(root), "x.py"], tmp_path / "cuco_home")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error:"), proc.stderr


def test_a_baselines_file_that_is_not_one_is_named(tmp_path):
    home = tmp_path / "home"
    stored = home / "baselines" / "cpu_allgather_matmul-w2-cpu.json"
    stored.parent.mkdir(parents=True)
    stored.write_text("original")
    proc = run_cuco(["eval", "cpu_allgather_matmul", "seed", "--device", "cpu"], home)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {stored}: not a baselines file of cuco baseline"), proc.stderr
    assert "cuco baseline cpu_allgather_matmul" in proc.stderr and stored.read_text() == "original"


def test_eval_exit_status_says_whether_the_candidate_passed(tmp_path):
    """Scripts and CI rely on it: 1 for a candidate that fails (here at L2), 0 for one that passes."""
    base = ["eval", "gemm_allgather", "--device", "cpu", "--level", "L2", "--small-shape", "s_odd"]
    failed = run_cuco(base[:2] + [str(REPO / "tests" / "faults" / "wrong_rank1.py")] + base[2:], tmp_path / "h")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "out of tolerance" in failed.stdout
    passed = run_cuco(base[:2] + ["torch_host"] + base[2:], tmp_path / "h")
    assert passed.returncode == 0, passed.stdout + passed.stderr


def test_version_and_short_help():
    for args, words in ((["--version"], "cuco 0.1.0"), (["-h"], "Usage: cuco"), (["eval", "-h"], "--small-shape")):
        proc = subprocess.run([sys.executable, "-m", "cuco", *args], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0 and words in proc.stdout, (args, proc.stdout, proc.stderr)


def test_the_command_line_imports_torch_only_where_it_computes():
    """Choosing the device and fingerprinting a record ask the driver and the package metadata: the judges, forked
    from a zygote that imported torch once, are where it runs (two CPU-seconds saved per command)."""
    probe = ("import sys\nimport cuco.cli, cuco.search\nfrom cuco.machine import fingerprint, resolve_device\n"
             "print(resolve_device('auto', 1), resolve_device('cpu', 2), 'torch' in fingerprint(), "
             "'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.stdout.split() == ["cpu", "cpu", "True", "False"], proc.stdout + proc.stderr
