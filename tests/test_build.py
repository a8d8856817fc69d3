"""Real nvcc builds against the NCCL 2.28.9 device-API and cuBLAS headers (no GPU needed to compile)."""

from __future__ import annotations

import pytest
from conftest import GEMM_AG, ROOT

from cuco.runner.build.nvcc import build, build_harness
from cuco.runner.cascade import EvalOptions, evaluate
from cuco.workload import load_workload

pytestmark = pytest.mark.nvcc

def test_a_shipped_candidate_compiles_once():
    """A second build of the same program is the first's library (every shipped program's build and checks:
    tests/test_cuda_checks.py)."""
    spec = load_workload(GEMM_AG)
    res = build(spec.candidates["seed"])
    assert res.ok, res.log
    assert res.library is not None and res.library.stat().st_size > 0
    again = build(spec.candidates["seed"])
    assert again.cached and again.library == res.library


def test_harness_compiles():
    res = build_harness()
    assert res.ok, res.log


def test_gpu_fault_template_compiles_clean(tmp_path):
    src = tmp_path / "clean.cu"
    src.write_text((ROOT / "tests" / "faults" / "gpu_faults.cu.in").read_text())
    assert build(src).ok


def test_compile_error_is_kept_and_cached(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text('#include "cuco.h"\nCUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) { return undefined_name; }\n')
    res = build(src)
    assert not res.ok
    assert "undefined_name" in res.log and "broken.cu" in res.log
    again = build(src)
    assert again.cached and not again.ok and again.log == res.log


def test_changed_source_is_rebuilt(tmp_path):
    src = tmp_path / "k.cu"
    body = 'extern "C" int cuco_run(void* ctx) {{ return {}; }}\n'  # no header: two seconds a build, not eight
    src.write_text(body.format(0))
    first = build(src)
    src.write_text(body.format(1))
    second = build(src)
    assert first.ok and second.ok and first.library != second.library and not second.cached


def test_a_program_built_twice_at_once_is_compiled_once(tmp_path):
    """Two slots (or two test workers) building the same program: the second waits for the first's library."""
    from concurrent.futures import ThreadPoolExecutor

    src = tmp_path / "k.cu"
    src.write_text('extern "C" int cuco_run(void* ctx) { return 7; }\n')
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: build(src), range(2)))
    assert all(r.ok for r in results) and results[0].library == results[1].library
    assert sorted(r.cached for r in results) == [False, True]


def test_changed_library_header_changes_the_key(tmp_path, monkeypatch):
    """A cached library must not outlive an edit of a header it includes under the include folder, .cuh included:
    the key is taken over the preprocessed unit, which holds every included file's text."""
    import cuco.runner.build.nvcc as b

    (tmp_path / "cuco.h").write_text("// h\n")
    lib = tmp_path / "cuco_collectives.cuh"
    lib.write_text("// v1\nint v = 1;\n")
    monkeypatch.setattr(b, "INCLUDE_DIR", tmp_path)
    tc = b.find_toolchain()
    src = tmp_path / "k.cu"
    src.write_text('#include "cuco.h"\n#include "cuco_collectives.cuh"\n')
    first = b.build_key(b.preprocess(src, tc).text, ["nvcc"], tc)
    lib.write_text("// v2\nint v = 2;\n")
    assert b.build_key(b.preprocess(src, tc).text, ["nvcc"], tc) != first


def test_preprocessing_failure_is_a_build_failure(tmp_path):
    src = tmp_path / "pp.cu"
    src.write_text('#include "cuco.h"\n#error "no such configuration"\n')
    res = build(src)
    assert not res.ok and not res.cached and "pp.cu:2" in res.log and "no such configuration" in res.log


def test_libraries_link_the_cuda_runtime_shared():
    """The library's dynamic symbols are then its own imports (see cuda_checks.check_library_symbols)."""
    import subprocess

    res = build(load_workload(GEMM_AG).candidates["seed"])
    assert res.ok and res.library is not None
    needed = subprocess.run(["readelf", "-d", str(res.library)], capture_output=True, text=True).stdout
    assert "libcudart.so" in needed
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(res.library)], capture_output=True, text=True)
    assert " dlopen" not in undefined.stdout and " getenv" not in undefined.stdout


def test_cascade_stops_at_l1_for_cuda_fault_on_cpu(tmp_path):
    spec = load_workload(GEMM_AG)
    src = tmp_path / "no_compile.cu"
    src.write_text("#define CUCO_FAULT_NO_COMPILE\n" + (ROOT / "tests" / "faults" / "gpu_faults.cu.in").read_text())
    rec = evaluate(spec, src, EvalOptions(device="cpu"))
    assert not rec.ok and rec.failed_level == "L1" and rec.fault == "candidate"
    assert "nvcc build failed" in rec.error and "error" in rec.diagnostics


def test_cascade_builds_cuda_candidate_on_cpu_and_says_so():
    spec = load_workload(GEMM_AG)
    rec = evaluate(spec, spec.candidates["device_lsa"], EvalOptions(device="cpu"))
    assert rec.ok and rec.level_reached == "L1" and rec.fault is None
    assert rec.incomplete == "reached L1 (built); L2-L4 need 2 GPUs"
    assert rec.to_dict()["incomplete"] == rec.incomplete


def _exports(library) -> set[str]:
    import subprocess

    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_a_build_compiles_the_units_it_preprocessed(tmp_path, monkeypatch):
    """nvcc's own preprocessing is skipped: the units the build key is made of are what nvcc's later steps compile
    (here a unit of another program is handed in, and its export is what comes out). Where nvcc's dry run does not
    show its two preprocessing runs, nvcc compiles the source itself."""
    import cuco.runner.build.nvcc as b

    entry = '#include "cuco.h"\nCUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) { return 0; }\n'
    plain, marked = tmp_path / "plain.cu", tmp_path / "marked.cu"
    plain.write_text(entry)
    marked.write_text(entry + "CUCO_EXPORT int cuco_marker(void) { return 7; }\n")
    built = build(plain, pre=b.preprocess(marked))
    assert built.ok and built.log == "" and "cuco_marker" in _exports(built.library), built.log
    assert not list(built.library.parent.glob("nvcc-*"))  # nvcc's intermediates go with the build
    monkeypatch.setattr(b, "_dryrun_lines", lambda cmd: ())
    (tmp_path / "again.cu").write_text(entry + "// another key\n")
    alone = build(tmp_path / "again.cu")
    assert alone.ok and "cuco_run" in _exports(alone.library) and "cuco_marker" not in _exports(alone.library)
