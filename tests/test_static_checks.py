"""L0: forbidden calls, required entry points and evolve-block integrity, on both languages; Python on its syntax
tree (each forbidden kind of construct, and honest code that must pass)."""

from __future__ import annotations

import ast
import codecs
from pathlib import Path

import pytest
from conftest import GEMM_AG, ROOT

from cuco.runner.build.static_checks import check_source, python_text
from cuco.runner.processes.loaded import CandidateError, PyContext, PythonCandidate

GOOD_CU = """#include "cuco.h"
// timing with cudaEventElapsedTime is the runner's job (a comment: not a call)
CUCO_EXPORT int cuco_setup(cuco_ctx_t* ctx) { return 0; }
CUCO_EXPORT int cuco_run(cuco_ctx_t* ctx) { const char* s = "exit(1)"; (void)s; return 0; }
CUCO_EXPORT int cuco_teardown(cuco_ctx_t* ctx) { return 0; }
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_candidates_pass_l0():
    import tomllib

    data = tomllib.loads((GEMM_AG / "workload.toml").read_text())
    for rel in data["candidates"].values():
        rep = check_source(GEMM_AG / rel)
        assert rep.ok, (rel, rep.problems)


def test_comments_and_strings_do_not_trigger(tmp_path):
    assert check_source(_write(tmp_path, "ok.cu", GOOD_CU)).ok


@pytest.mark.parametrize("snippet,word", [
    ("float ms; cudaEventElapsedTime(&ms, a, b);", "cudaEventElapsedTime"),
    ("exit(1);", "exit"),
    ("usleep(10);", "usleep"),
    ("cudaStream_t s; cudaStreamCreate(&s);", "cudaStreamCreate"),
    ("ncclComm_t c; ncclCommInitRank(&c, 2, id, 0);", "ncclCommInitRank"),
    ("const char* v = getenv(\"X\");", "getenv"),
])
def test_forbidden_cuda_calls(tmp_path, snippet, word):
    tail = " return 0; }\nCUCO_EXPORT int cuco_teardown"
    text = GOOD_CU.replace(tail.lstrip(), snippet + tail)
    rep = check_source(_write(tmp_path, "bad.cu", text))
    assert not rep.ok
    assert any(word in p for p in rep.problems), rep.problems


def test_missing_entry_point(tmp_path):
    rep = check_source(_write(tmp_path, "bad.cu", GOOD_CU.replace("cuco_teardown", "teardown")))
    assert any("cuco_teardown" in p for p in rep.problems)


@pytest.mark.parametrize("body,word", [
    ("import time\ndef run(ctx):\n    time.sleep(1)\n", "import 'time'"),
    ("import sys\ndef run(ctx):\n    sys.exit(0)\n", "import 'sys'"),
    ("import reference\ndef run(ctx):\n    pass\n", "import 'reference'"),
    ("import os\ndef run(ctx):\n    os.environ['X']\n", "import 'os'"),
    ("def setup(ctx):\n    pass\n", "run()"),
])
def test_forbidden_python(tmp_path, body, word):
    rep = check_source(_write(tmp_path, "bad.py", body))
    assert not rep.ok and any(word in p for p in rep.problems), rep.problems


@pytest.mark.parametrize("snippet,line,what", [
    # imports, at any depth, aliased or from-imported
    ("import time", 1, "import 'time'"),
    ("from time import perf_counter as pc", 1, "import 'time'"),
    ("import ctypes.util", 1, "import 'ctypes'"),
    ("from subprocess import run as go", 1, "import 'subprocess'"),
    ("import torch.multiprocessing as mp", 1, "import 'multiprocessing'"),
    ("from torch.utils import cpp_extension", 1, "import 'cpp_extension'"),
    ("from cuco.runner import judge", 1, "import 'cuco'"),
    ("from cuco import kernels", 1, "import 'cuco'"),
    ("import cuco.kernels.gemm", 1, "import 'cuco.kernels.gemm' without 'as'"),
    ("from cuco.kernels import gemm\nj = gemm.os", 2, "attribute '.os'"),
    ("from reference import run as ref", 1, "import 'reference'"),
    ("from . import reference", 1, "relative import"),
    ("import __main__", 1, "import '__main__'"),
    ("def f():\n    import signal\n    signal.alarm(0)", 2, "import 'signal'"),
    # builtins, called or aliased
    ("def f():\n    exit(0)", 2, "name 'exit'"),
    ("def f():\n    quit()", 2, "name 'quit'"),
    ("def f():\n    return eval('1')", 2, "name 'eval'"),
    ("g = exec", 1, "name 'exec'"),
    ("m = __import__('os')", 1, "name '__import__'"),
    ("def f():\n    return open('/etc/passwd').read()", 2, "name 'open'"),
    ("def f():\n    breakpoint()", 2, "name 'breakpoint'"),
    ("def f():\n    return globals()['x']", 2, "name 'globals'"),
    ("def f():\n    return vars(f)", 2, "name 'vars'"),
    ("b = __builtins__", 1, "name '__builtins__'"),
    # attributes
    ("def f(e0, e1):\n    return e0.elapsed_time(e1)", 2, "attribute '.elapsed_time'"),
    ("def f(t):\n    return t.perf_counter_ns()", 2, "attribute '.perf_counter_ns'"),
    ("def f():\n    return f.__globals__", 2, "attribute '.__globals__'"),
    ("def f():\n    return ().__class__.__subclasses__()", 2, "attribute '.__subclasses__'"),
    ("import torch\nx = torch.serialization.os", 2, "attribute '.os'"),
    ("def f(fr):\n    return fr.f_back.f_globals", 2, "attribute '.f_back'"),
    ("def f(m):\n    m.environ['X'] = '1'", 2, "attribute '.environ'"),
    ("import torch\nx = torch.__loader__.get_data('reference.txt')", 2, "attribute '.__loader__'"),
    ("from cuco.kernels import gemm\nx = gemm.__spec__", 2, "attribute '.__spec__'"),
    ("def f(m):\n    m.system('ls')", 2, "attribute '.system'"),
    ("def f(m):\n    m._exit(0)", 2, "attribute '._exit'"),
    ("import torch\ntorch.ops.load_library('x.so')", 2, "attribute '.load_library'"),
    ("def f(m):\n    return getattr(m, 'perf_counter')()", 2, "attribute 'perf_counter' (through getattr)"),
    ("def f(m, k):\n    return getattr(m, k)", 2, "getattr() with a computed name"),
    ("import torch\nx = torch.__dict__['ex' + 'ec']", 2, "attribute '.__dict__'"),
    ("def f(m):\n    return m.__dict__['open']", 2, "attribute '.__dict__'"),
    ("x = len.__self__", 1, "attribute '.__self__'"),
    ("x = ().__class__.__mro__", 1, "attribute '.__mro__'"),
    ("import operator\nf = operator.attrgetter('sys')", 2, "attribute '.attrgetter'"),
    ("from operator import attrgetter", 1, "import 'attrgetter'"),
    # strings
    ("P = '../reference.py'", 1, "string mentioning 'reference.py'"),
    ("P = b'/proc/self/maps'", 1, "string mentioning '/proc/'"),
    ("K = '__glo' 'bals__'", 1, "string mentioning '__globals__'"),
])
def test_forbidden_python_constructs(tmp_path, snippet, line, what):
    rep = check_source(_write(tmp_path, "c.py", snippet + "\n\n\ndef run(ctx):\n    pass\n"))
    assert not rep.ok
    assert rep.problems[0].startswith(f"c.py:{line}: forbidden {what}: "), rep.problems
    assert len(rep.problems[0].splitlines()) == 1


HONEST_PY = '''"""An honest candidate: a docstring that says exit(0), time.perf_counter and os.environ is only text."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy
import torch
import torch.distributed as dist
import triton
import triton.language as tl
from cuco.kernels import gemm as cuco_gemm
import cuco.kernels.gemm as kernels_gemm


@dataclass
class Plan:
    chunks: int = 2


class Pipeline:
    def exit(self):  # a method named exit is the candidate's own
        return None


def exit(code):  # so is a top-level function: the bare name below calls this one
    return code


@functools.lru_cache(None)
def split(n: int, parts: int) -> int:
    return math.ceil(n / parts)


def run(ctx):
    # time.perf_counter() and sys.exit() in a comment do not count
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    e = torch.cuda.Event()
    e.record(s1)
    s2.wait_event(e)
    s2.synchronize()
    Pipeline().exit()
    exit(0)
    ctx.state["msg"] = "see reference_impl for the maths"
    return getattr(ctx, "rank", 0), numpy.zeros(1), dist, triton, tl, Plan(), cuco_gemm.gemm, kernels_gemm
'''


def test_honest_python_passes(tmp_path):
    rep = check_source(_write(tmp_path, "ok.py", HONEST_PY))
    assert rep.ok, rep.problems


def test_bare_exit_without_own_definition_is_refused(tmp_path):
    text = HONEST_PY.replace("def exit(code):", "def exit_code(code):")
    rep = check_source(_write(tmp_path, "bad.py", text))
    assert not rep.ok and "forbidden name 'exit'" in rep.problems[0], rep.problems


def test_syntax_error_is_left_to_l1(tmp_path):
    assert check_source(_write(tmp_path, "s.py", "import time\ndef run(ctx)\n    pass\n")).ok
    assert check_source(ROOT / "tests" / "faults" / "no_compile.py").ok
    rep = check_source(_write(tmp_path, "s.py", "def setup(ctx)\n    pass\n"))
    assert not rep.ok and "defines no run()" in rep.problems[0]
    rep = check_source(_write(tmp_path, "s.py", "# EVOLVE-BLOCK-START\ndef run(ctx)\n"))
    assert not rep.ok and "never closed" in rep.problems[0]


def test_run_must_be_a_top_level_function(tmp_path):
    rep = check_source(_write(tmp_path, "n.py", "class C:\n    def run(self, ctx):\n        pass\n"))
    assert not rep.ok and rep.problems == ["n.py: defines no run()"]


def _python_candidates() -> list[Path]:
    """Every shipped Python candidate (seeds, candidates, strategies); reference.py files are not candidates."""
    return sorted(p for p in (ROOT / "cuco" / "builtin").glob("*/**/*.py") if p.name != "reference.py")


@pytest.mark.parametrize("path", _python_candidates(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_python_candidates_pass(path):
    rep = check_source(path)
    assert rep.ok, rep.problems


def test_materialised_python_strategy_passes(tmp_path):
    from cuco.evolve.strategy import materialize
    from cuco.workload import load_workload

    spec = load_workload(ROOT / "cuco" / "builtin" / "cpu_allgather_matmul")
    for strategy in spec.strategies.values():
        for i, point in enumerate(strategy.points()[:4]):
            rep = check_source(_write(tmp_path, f"p{i}.py", materialize(strategy, point)))
            assert rep.ok, rep.problems


def test_planted_timer_fault_fails_l0():
    rep = check_source(ROOT / "tests" / "faults" / "forbidden_timer.py")
    assert not rep.ok and "forbidden import 'time'" in rep.problems[0]


@pytest.mark.parametrize("text,ok", [
    ("// EVOLVE-BLOCK-START\nx\n// EVOLVE-BLOCK-END\n", True),
    ("// EVOLVE-BLOCK-START\nx\n", False),
    ("// EVOLVE-BLOCK-END\n", False),
    ("// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-END\n", False),
])
def test_evolve_block_integrity(tmp_path, text, ok):
    rep = check_source(_write(tmp_path, "k.cu", text + GOOD_CU))
    assert rep.ok == ok, rep.problems


RUN = b"\n\ndef run(ctx):\n    ctx.state['ran'] = True\n"
COOKIE_CHEAT = ROOT / "tests" / "anticheat" / "coding_cookie.py"


@pytest.mark.parametrize("data,what", [
    (b"# coding: utf-7\n", "c.py:1: forbidden coding declaration 'utf-7'"),
    (b"#!/usr/bin/env python\n# -*- coding: latin-1 -*-\n", "c.py:2: forbidden coding declaration 'latin-1'"),
    (codecs.BOM_UTF8 + b"# coding: utf-7\n", "c.py:1: forbidden coding declaration 'utf-7'"),
    (b"#\r# vim: set fileencoding=utf_16 :\r", "c.py:2: forbidden coding declaration 'utf_16'"),  # old Mac lines
    # the interpreter reads line 2's declaration only after a comment or blank line 1: refused all the same
    (b"x = 1\n# coding: utf-7\n", "c.py:2: forbidden coding declaration 'utf-7'"),
    (b"# coding: no-such-codec\n", "c.py:1: forbidden coding declaration 'no-such-codec'"),
    (codecs.BOM_UTF16_LE + "def run(ctx): pass\n".encode("utf-16-le"), "c.py:1: forbidden UTF-16 byte order mark"),
    (codecs.BOM_UTF32_BE + "def run(ctx): pass\n".encode("utf-32-be"), "c.py:1: forbidden UTF-32 byte order mark"),
    (b"x = 1\ny = 2\nz = '\xff'\n", "c.py:3: not UTF-8"),
])
def test_a_source_the_importer_would_decode_otherwise_is_refused(tmp_path, data, what):
    path = tmp_path / "c.py"
    path.write_bytes(data + RUN)
    rep = check_source(path)
    assert not rep.ok and len(rep.problems) == 1, rep.problems
    assert rep.problems[0].startswith(what) and "\n" not in rep.problems[0], rep.problems


@pytest.mark.parametrize("head", [
    b"", b"# -*- coding: utf-8 -*-\n", b"#!/usr/bin/env python\n# coding=UTF_8\n", b"# coding: utf8\n",
    b"# vim: fileencoding=utf-8-sig\n", codecs.BOM_UTF8, codecs.BOM_UTF8 + b"# coding: utf-8\n",
    b"\n\n# coding: utf-7 (line 3: the interpreter reads no declaration there)\n", "# \u00e9t\u00e9\n".encode(),
    b"x = 1  # coding: utf-7 (after code: no declaration)\n",
])
def test_utf8_sources_are_read_as_the_interpreter_reads_them(tmp_path, head):
    data = head + RUN
    assert ast.dump(ast.parse(python_text(data, "c.py"))) == ast.dump(ast.parse(data))
    path = tmp_path / "c.py"
    path.write_bytes(data)
    assert check_source(path).ok, check_source(path).problems
    path.write_bytes(head + b"import os\n" + RUN)  # and the checks still read the code after the declaration
    assert "forbidden import 'os'" in check_source(path).problems[0]


def _ctx() -> PyContext:
    return PyContext(0, 1, "cpu", None, None, [], {}, {})


def test_the_loader_runs_the_text_the_checks_read(tmp_path):
    """The planted cheat hides code in a comment that only UTF-7 decodes; the loader refuses it as L0 does."""
    def imports(source: str | bytes) -> list[str]:
        return [a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names]

    data = COOKIE_CHEAT.read_bytes()
    assert "threading" in imports(data) and "threading" not in imports(data.decode())
    with pytest.raises(CandidateError, match=r"^coding_cookie\.py:1: forbidden coding declaration 'utf-7'"):
        PythonCandidate(COOKIE_CHEAT, _ctx())
    path = tmp_path / "bom.py"
    path.write_bytes(codecs.BOM_UTF8 + b"# coding: utf-8\ndef f(x: int) -> None: ...\n" + RUN)
    cand = PythonCandidate(path, _ctx())
    cand.run()
    assert cand.ctx.state == {"ran": True}
    assert cand.module.__file__ == str(path) and cand.module.f.__code__.co_filename == str(path)
    assert cand.module.f.__annotations__["x"] is int  # the loader's own __future__ flags stay its own
