"""L1 on what the compiler sees and produces: planted CUDA candidates that get past the raw-source regexes, each
refused with its one-line reason; every shipped honest CUDA candidate passes all three checks; the build key
follows the headers a candidate includes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from cuco.runner.build import nvcc as b
from cuco.runner.build.cuda_checks import (
    check_and_build,
    check_library_symbols,
    check_preprocessed,
    line_directive_problems,
)
from cuco.runner.build.static_checks import check_source
from cuco.workload import load_workload

pytestmark = pytest.mark.nvcc

ENTRIES = """#include "cuco.h"
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) {
  RUN_BODY
  return 0;
}
"""


def _candidate(directory: Path, name: str, before: str, body: str) -> Path:
    path = directory / f"{name}.cu"
    path.write_text(before + ENTRIES.replace("RUN_BODY", body))
    return path


# name, text before the entry points, cuco_run's body, the reason expected, whether L0's regexes miss it.
PLANTED = [
    ("token_paste", "#define CAT(a, b) a##b\n", "cudaStream_t s; CAT(cudaStream, Create)(&s);",
     "forbidden 'cudaStreamCreate' (after preprocessing): use ctx->stream", True),
    ("getenv_macro", "#include <stdlib.h>\n#define ENV(x) get##env(x)\n", 'if (ENV("HOME")) return 1;',
     "forbidden 'getenv' (after preprocessing): candidates must not read", True),
    ("dlsym", "#include <dlfcn.h>\n", 'void* f = dlsym(RTLD_DEFAULT, "cuda" "Stream" "Create"); if (!f) return 1;',
     "forbidden 'dlsym' (after preprocessing): resolving functions at run time", True),
    ("std_thread", "#include <thread>\n", "std::thread t([] {}); t.join();",
     "forbidden 'std::thread' (after preprocessing): a candidate may not start processes or threads", True),
    ("python_api", 'extern "C" int PyRun_SimpleString(const char*);\n', 'PyRun_SimpleString("import os");',
     "forbidden 'PyRun_SimpleString' (after preprocessing): the Python C API", True),
    ("driver_entry_point", "",
     'void* p; cudaDriverEntryPointQueryResult q;\n'
     '  if (cudaGetDriverEntryPoint("cuStreamCreate", &p, cudaEnableDefault, &q)) return 1;',
     "forbidden 'cudaGetDriverEntryPoint' (after preprocessing): resolving functions at run time", True),
    ("exit_by_pointer", "#include <stdlib.h>\n", "void (*volatile bye)(int) = &exit; bye(0);",
     "forbidden 'exit' (after preprocessing): a candidate may not end the process", True),
    ("line_directive", '#line 1 "/usr/include/stdio.h"\n', "exit(0);", "forbidden line directive", False),
    ("gnu_line_marker", '# 1 "/usr/include/stdio.h" 1\n', "cudaStream_t s; cudaStreamCreate(&s);",
     "forbidden line directive", False),
    # the unit carries the raw string verbatim: its second line reads as a marker, and the code after the string's
    # end, on the same line, would be attributed to stdio.h
    ("raw_string_marker", "#define CAT(a, b) a##b\n",
     'const char* r = R"(\n# 1 "/usr/include/stdio.h" 1\n)"; cudaStream_t s; CAT(cudaStream, Create)(&s);',
     "forbidden raw string with a line starting with '#'", True),
]


@pytest.mark.parametrize("name,before,body,reason,evades_l0", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_candidate_is_refused_before_compiling(tmp_path, name, before, body, reason, evades_l0):
    src = _candidate(tmp_path, name, before, body)
    assert check_source(src).ok == evades_l0
    built, problems = check_and_build(src)
    assert problems and reason in problems[0], problems
    assert problems[0].startswith(f"{name}.cu:") and len(problems[0].splitlines()) == 1
    assert not built.ok and built.library is None and built.command == [] and built.static_problems == problems


def test_header_beside_the_candidate_is_not_seen(tmp_path):
    (tmp_path / "helper.h").write_text("static void bye() { exit(3); }\n")
    src = _candidate(tmp_path, "helper", '#include "helper.h"\n', "bye();")
    built, problems = check_and_build(src)
    assert problems and problems[0].startswith("helper.cu:1: includes 'helper.h', which is not there"), problems
    assert not built.ok


def test_include_outside_the_toolchain_is_refused_and_not_quoted(tmp_path):
    (tmp_path / "helper.h").write_text("static void bye() { exit(3); }\n")
    src = _candidate(tmp_path, "absolute", f'#include "{tmp_path / "helper.h"}"\n', "bye();")
    _, problems = check_and_build(src)
    assert problems == [f"absolute.cu: includes {tmp_path / 'helper.h'}: only the headers of cuco, its workload "
                        "(include/), CUDA, NCCL, cuBLAS and the system compiler may be included"]
    runner_file = ROOT / "cuco" / "runner" / "build" / "nvcc.py"
    src = _candidate(tmp_path, "not_a_header", f'#include "{runner_file}"\n', "")
    built, problems = check_and_build(src)
    assert problems and f"includes {runner_file}" in problems[0]
    assert "PREPROCESS_TIMEOUT_S" not in built.log  # the file's text stays out of the diagnostics


def test_toolchain_headers_may_name_what_the_candidate_may_not(tmp_path):
    """<thread> and <stdlib.h> declare exit, abort, std::thread...: only the candidate's own lines count, and a
    member named like a forbidden function (a cudaEvent_t `fork`) is not that function."""
    src = _candidate(tmp_path, "ok", "#include <thread>\n#include <stdlib.h>\nstruct S { cudaEvent_t fork, join; };\n",
                     'S s; (void)s.fork; const char* m = "exit(1) getenv dlsym"; (void)m;')
    rep = check_preprocessed(src)
    assert rep.ok, rep.problems


def test_a_workloads_own_headers_are_on_its_programs_path_alone(tmp_path):
    """MoE's layout header lives in its workload's include/: its programs build with it, others cannot reach it."""
    moe = load_workload(ROOT / "cuco" / "builtin" / "moe_deepseek_v3")
    src = _candidate(tmp_path, "moe", '#include "cuco_moe.cuh"\n', "")
    assert check_preprocessed(src, includes=moe.includes).ok
    rep = check_preprocessed(src)
    assert not rep.ok and "includes 'cuco_moe.cuh', which is not there" in rep.problems[0], rep.problems


def test_line_directives_are_found_through_splices_and_comments():
    assert line_directive_problems("#\\\n  line 3\n", "k.cu") and line_directive_problems("%: /* x */ 7\n", "k.cu")
    assert line_directive_problems('int a;\n#line 9 "x"\n', "k.cu")[0].startswith("k.cu:2:")
    assert not line_directive_problems('#include "cuco.h"\nconst char* s = "#line 1";\n// # 1 "x"\n', "k.cu")
    # a raw string is copied verbatim into the unit: a line of it starting with '#' would read as a marker
    fake = 'const char* r = R"(\n# 1 "/usr/include/stdio.h" 1\n)";\n'
    assert "forbidden raw string" in line_directive_problems(fake, "k.cu")[0]
    assert "forbidden raw string" in line_directive_problems(fake.replace("(\n#", "(\\\n#"), "k.cu")[0]
    assert not line_directive_problems('const char* r = R"(two\nlines)";\n', "k.cu")


# Planted candidates only the library check catches: nothing forbidden is named on their lines.
LIBRARY_PLANTED = [
    ("asm_label", 'extern "C" void* resolve(void*, const char*) __asm__("dl" "sym");\n',
     'if (!resolve((void*)0, "cudaStreamCreate")) return 1;', "candidate.so: imports dlsym: resolving functions"),
    ("thread_unqualified", "#include <thread>\nusing namespace std;\n", "thread t([] {}); t.join();",
     "candidate.so: imports std::thread::"),
    ("raw_syscall", "", 'long r; asm volatile("syscall" : "=a"(r) : "a"(39L) : "rcx", "r11", "memory"); (void)r;',
     "candidate.so: contains a 'syscall' instruction: raw system calls"),
    # exit under another name, reached from cuco_run: the linker keeps what the entry points reach
    ("exit_by_label", 'extern "C" void leave(int) __asm__("ex" "it");\n', "if (ctx->rank < 0) leave(1);",
     "candidate.so: imports exit: a candidate may not end the process"),
]


@pytest.mark.parametrize("name,before,body,reason", LIBRARY_PLANTED, ids=[p[0] for p in LIBRARY_PLANTED])
def test_planted_candidate_is_refused_after_compiling(tmp_path, name, before, body, reason):
    src = _candidate(tmp_path, name, before, body)
    assert check_preprocessed(src).ok
    built, problems = check_and_build(src)
    assert problems and problems[0].startswith(reason), problems
    assert not built.ok and built.library is None and built.command
    plain = b.build(src)  # the build alone hands the library out: the caller runs the checks
    assert plain.ok and check_library_symbols(plain.library).problems == problems


def test_a_device_function_is_not_the_candidate_ending_the_process(tmp_path):
    """nvcc gives every __device__ function a host stub that calls exit(); nothing on the host calls it, so the
    library keeps none of it, and an honest candidate with a device helper passes."""
    src = _candidate(tmp_path, "device_fn", "__device__ float twice(float v) { return 2.0f * v; }\n"
                                            "__global__ void k(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n",
                     "k<<<1, 32, 0, ctx->stream>>>((float*)0);")
    built, problems = check_and_build(src)
    assert problems == [] and built.ok, (problems, built.log)


def _honest() -> list[tuple[Path, tuple[Path, ...]]]:
    found = []
    for wl in sorted((ROOT / "cuco" / "builtin").glob("*/workload.toml")):
        spec = load_workload(wl.parent)
        found += [(p, spec.includes) for p in spec.candidates.values() if p.suffix == ".cu"]
    return found


@pytest.mark.parametrize("src,includes", _honest(), ids=[str(p.relative_to(ROOT)) for p, _ in _honest()])
def test_shipped_cuda_candidate_passes_all_checks(src, includes):
    built, problems = check_and_build(src, includes=includes)
    assert problems == [] and built.ok and built.library is not None, (problems, built.log)


def _cuda_strategies() -> list[tuple[str, str]]:
    found = []
    for wl in sorted((ROOT / "cuco" / "builtin").glob("*/workload.toml")):
        spec = load_workload(wl.parent)
        found += [(wl.parent.name, name) for name, s in spec.strategies.items() if s.path.suffix == ".cu"]
    return found


def test_gpu_fault_template_passes_all_checks(tmp_path):
    clean = tmp_path / "clean.cu"
    clean.write_text((ROOT / "tests" / "faults" / "gpu_faults.cu.in").read_text())
    built, problems = check_and_build(clean)
    assert problems == [] and built.ok, (problems, built.log)


@pytest.mark.parametrize("workload,name", _cuda_strategies(), ids=["/".join(p) for p in _cuda_strategies()])
def test_strategy_points_pass_all_checks(workload, name, tmp_path):
    """The last point of every CUDA strategy kernel, every dimension at its last value, builds and passes the checks
    (the GPU test builds and runs every point): the design point, the shared skeleton and the needs export compile
    together."""
    from cuco.evolve.strategy import materialize

    strategy = load_workload(ROOT / "cuco" / "builtin" / workload).strategies[name]
    src = tmp_path / f"{workload}-{name}.cu"
    src.write_text(materialize(strategy, strategy.points()[-1]))
    built, problems = check_and_build(src, includes=strategy.includes)
    assert problems == [] and built.ok, (src.name, problems, built.log)


def test_every_cuda_strategy_is_checked():
    assert len(_cuda_strategies()) > 5


def test_library_check_says_when_it_cannot_list_symbols(tmp_path, monkeypatch):
    import cuco.runner.build.cuda_checks as cc

    monkeypatch.setattr(cc.shutil, "which", lambda name: None)
    rep = check_library_symbols(tmp_path / "candidate.so")
    assert rep.problems == ["candidate.so: cannot list its dynamic symbols: neither nm nor readelf (binutils) is "
                            "installed"]


def test_build_key_follows_every_included_header(tmp_path, monkeypatch):
    include = tmp_path / "include"
    shutil.copytree(b.INCLUDE_DIR, include)
    (include / "extra.h").write_text("#define CUCO_EXTRA 1\n")
    monkeypatch.setattr(b, "INCLUDE_DIR", include)
    tc = b.find_toolchain()
    body = '#include "cuco.h"\n#include "extra.h"\nCUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) { return CUCO_EXTRA; }\n'
    src = tmp_path / "k.cu"
    src.write_text(body)
    template = b.nvcc_command(Path("SRC.cu"), Path("OUT.so"), tc, b.DEFAULT_ARCH)

    def key(path: Path) -> str:
        pre = b.preprocess(path, tc, b.DEFAULT_ARCH)
        assert pre.ok, pre.log
        return b.build_key(pre.text, template, tc)

    first = key(src)
    elsewhere = tmp_path / "other" / "renamed.cu"
    elsewhere.parent.mkdir()
    elsewhere.write_text(body)
    assert key(elsewhere) == first  # the key is the unit's, not the path's: a prebuilt point is found again
    (include / "extra.h").write_text("#define CUCO_EXTRA 2\n")
    assert key(src) != first
    (include / "extra.h").write_text("#define CUCO_EXTRA 1\n")
    (include / "cuco_collectives.cuh").write_text("// not included by k.cu\n")
    assert key(src) == first
