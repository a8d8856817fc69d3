"""Evolve blocks: the regions of a program a search may change. Everything outside them is frozen.

The markers are comments (`// EVOLVE-BLOCK-START` in CUDA, `# EVOLVE-BLOCK-START` in Python), one per line;
blocks do not nest. The static checks, the patcher, the annotator and the prompts all read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

EVOLVE_START, EVOLVE_END = "EVOLVE-BLOCK-START", "EVOLVE-BLOCK-END"


@dataclass(frozen=True)
class Block:
    start: int  # character offset of the first character after the START marker's line
    end: int  # character offset of the END marker's line


def _scan(code: str) -> tuple[list[Block], list[str]]:
    """The well-formed blocks of CODE and what is wrong with its markers, in one pass."""
    blocks: list[Block] = []
    problems: list[str] = []
    start: int | None = None
    pos = 0
    for n, line in enumerate(code.splitlines(keepends=True), 1):
        if EVOLVE_START in line:
            if start is not None:
                problems.append(f"line {n}: {EVOLVE_START} inside another evolve block")
            start = pos + len(line)
        elif EVOLVE_END in line:
            if start is None:
                problems.append(f"line {n}: {EVOLVE_END} without a start")
            else:
                blocks.append(Block(start, pos))
                start = None
        pos += len(line)
    if start is not None:
        problems.append(f"{EVOLVE_START} never closed")
    return blocks, problems


def evolve_blocks(code: str) -> list[Block]:
    return _scan(code)[0]


def marker_problems(code: str) -> list[str]:
    """Nested, unopened or unclosed markers: a program with any of them is rejected before it is built."""
    return _scan(code)[1]


def frozen_parts(code: str) -> list[str]:
    """The text outside the evolve blocks, in order (markers included)."""
    parts, prev = [], 0
    for b in evolve_blocks(code):
        parts.append(code[prev:b.start])
        prev = b.end
    parts.append(code[prev:])
    return parts
