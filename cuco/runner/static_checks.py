"""L0: checks that need no compiler. A candidate may not time itself, exit, sleep, or call the reference."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EVOLVE_START, EVOLVE_END = "EVOLVE-BLOCK-START", "EVOLVE-BLOCK-END"

# (pattern, why) -- matched on source with comments and string literals removed.
FORBIDDEN_CUDA = [
    (r"\bcudaEventElapsedTime\b|\bclock_gettime\b|\bgettimeofday\b|std::chrono", "timing is the runner's job"),
    (r"\b(exit|_exit|abort|quick_exit)\s*\(", "a candidate may not end the process"),
    (r"\b(sleep|usleep|nanosleep)\s*\(|this_thread::sleep", "no sleeping on the host"),
    (r"\bcudaDeviceReset\b", "the runner owns the device"),
    (r"\bcudaStreamCreate\w*\s*\(", "use ctx->stream and ctx->sideStreams: only those are gated and timed"),
    (r"\bncclCommInit\w*\b|\bncclCommDestroy\b|\bncclCommSplit\b", "use ctx->comm: the runner owns the communicator"),
    (r"\bgetenv\s*\(", "candidates must not read the environment"),
]
FORBIDDEN_PY = [
    (r"\btime\.(perf_counter|time|monotonic|sleep|process_time)\b|\belapsed_time\b|cuda\.Event\b",
     "timing is the runner's job"),
    (r"\b(sys\.exit|os\._exit|os\.abort|quit|exit)\s*\(", "a candidate may not end the process"),
    (r"\bimport\s+reference\b|\bfrom\s+reference\b|reference\.py", "a candidate may not call the reference"),
    (r"\bos\.environ\b|\bgetenv\b", "candidates must not read the environment"),
]
REQUIRED_CUDA = ["cuco_setup", "cuco_run", "cuco_teardown"]
REQUIRED_PY = ["run"]


@dataclass
class StaticReport:
    ok: bool
    problems: list[str]


def _strip_c(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def _strip_py(text: str) -> str:
    text = re.sub(r'("""|\'\'\')(?:.|\n)*?\1', lambda m: "\n" * m.group(0).count("\n"), text)
    text = re.sub(r"#[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', '""', text)


def evolve_blocks_ok(text: str) -> list[str]:
    problems, depth = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        if EVOLVE_START in line:
            if depth:
                problems.append(f"line {n}: {EVOLVE_START} inside another evolve block")
            depth += 1
        elif EVOLVE_END in line:
            if not depth:
                problems.append(f"line {n}: {EVOLVE_END} without a start")
            depth = max(0, depth - 1)
    if depth:
        problems.append(f"{EVOLVE_START} never closed")
    return problems


def check_source(path: Path) -> StaticReport:
    text = path.read_text(errors="replace")
    is_cuda = path.suffix == ".cu"
    code = _strip_c(text) if is_cuda else _strip_py(text)
    problems = evolve_blocks_ok(text)
    for pattern, why in FORBIDDEN_CUDA if is_cuda else FORBIDDEN_PY:
        for m in re.finditer(pattern, code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{path.name}:{line}: forbidden {m.group(0).strip()!r}: {why}")
    for name in REQUIRED_CUDA if is_cuda else REQUIRED_PY:
        pat = rf"\b{name}\s*\(" if is_cuda else rf"^def\s+{name}\s*\("
        if not re.search(pat, code, flags=re.M):
            problems.append(f"{path.name}: defines no {name}()")
    return StaticReport(not problems, problems)
