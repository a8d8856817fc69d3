"""L0: forbidden calls, required entry points and evolve-block integrity, on both languages."""

from __future__ import annotations

import pytest

from conftest import GEMM_AG
from cuco.runner.static_checks import check_source

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
    text = GOOD_CU.replace("return 0; }\nCUCO_EXPORT int cuco_teardown", snippet + " return 0; }\nCUCO_EXPORT int cuco_teardown")
    rep = check_source(_write(tmp_path, "bad.cu", text))
    assert not rep.ok
    assert any(word in p for p in rep.problems), rep.problems


def test_missing_entry_point(tmp_path):
    rep = check_source(_write(tmp_path, "bad.cu", GOOD_CU.replace("cuco_teardown", "teardown")))
    assert any("cuco_teardown" in p for p in rep.problems)


@pytest.mark.parametrize("body,word", [
    ("import time\ndef run(ctx):\n    time.sleep(1)\n", "time.sleep"),
    ("import sys\ndef run(ctx):\n    sys.exit(0)\n", "sys.exit"),
    ("import reference\ndef run(ctx):\n    pass\n", "reference"),
    ("import os\ndef run(ctx):\n    os.environ['X']\n", "os.environ"),
    ("def setup(ctx):\n    pass\n", "run()"),
])
def test_forbidden_python(tmp_path, body, word):
    rep = check_source(_write(tmp_path, "bad.py", body))
    assert not rep.ok and any(word in p for p in rep.problems), rep.problems


@pytest.mark.parametrize("text,ok", [
    ("// EVOLVE-BLOCK-START\nx\n// EVOLVE-BLOCK-END\n", True),
    ("// EVOLVE-BLOCK-START\nx\n", False),
    ("// EVOLVE-BLOCK-END\n", False),
    ("// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-START\n// EVOLVE-BLOCK-END\n// EVOLVE-BLOCK-END\n", False),
])
def test_evolve_block_integrity(tmp_path, text, ok):
    rep = check_source(_write(tmp_path, "k.cu", text + GOOD_CU))
    assert rep.ok == ok, rep.problems
