"""Applying a model's change to a program: only inside evolve blocks, and saying why when it can't.

A SEARCH/REPLACE edit must match text that lies entirely inside one evolve block; a full rewrite must
leave every frozen line (outside the blocks) exactly as it was. The error messages are written for the
model that gets them back: which block failed, and the closest text there is.
"""

from __future__ import annotations

import difflib
import re

from cuco.program.blocks import evolve_blocks, frozen_parts

EDIT_RE = re.compile(r"<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE", re.S)
FENCE_RE = re.compile(r"```[a-zA-Z+]*\n(.*?)```", re.S)


class PatchError(ValueError):
    """A reply that cannot be applied; the message goes back to the model."""


def _closest(haystack: str, needle: str) -> tuple[float, str]:
    lines, want = haystack.splitlines(), needle.splitlines() or [""]
    best, text = 0.0, ""
    for i in range(max(1, len(lines) - len(want) + 1)):
        window = "\n".join(lines[i:i + len(want)])
        ratio = difflib.SequenceMatcher(None, window, needle).ratio()
        if ratio > best:
            best, text = ratio, window
    return best, text


def apply_edits(code: str, reply: str) -> tuple[str, int]:
    """Apply every SEARCH/REPLACE edit of the reply, in order; returns the new code and the edit count."""
    edits = EDIT_RE.findall(reply)
    if not edits:
        if "<<<<<<< SEARCH" in reply:
            raise PatchError("a SEARCH block is malformed: each edit is <<<<<<< SEARCH, the old lines, =======, "
                             "the new lines, >>>>>>> REPLACE, each marker on its own line")
        raise PatchError("the reply has no SEARCH/REPLACE edit")
    for n, (search, replace) in enumerate(edits, 1):
        if not search.strip():
            raise PatchError(f"edit {n}: the SEARCH text is empty")
        blocks = evolve_blocks(code)
        if not blocks:
            raise PatchError("the program has no EVOLVE-BLOCK: nothing may be edited")
        hit = None
        for b in blocks:
            i = code.find(search, b.start, b.end)
            if i >= 0 and i + len(search) <= b.end:
                hit = i
                break
        if hit is None:
            if search in code:
                raise PatchError(f"edit {n}: the SEARCH text is outside the evolve blocks (frozen code may not change)")
            ratio, near = max((_closest(code[b.start:b.end], search) for b in blocks), key=lambda t: t[0])
            raise PatchError(f"edit {n}: the SEARCH text does not match the program exactly; the closest text in "
                             f"an evolve block ({ratio:.0%} similar) is:\n{near}")
        code = code[:hit] + replace + code[hit + len(search):]
    return code, len(edits)


def fenced_program(reply: str) -> str:
    """The longest fenced code block of the reply: the full program it gives."""
    fences = FENCE_RE.findall(reply)
    if not fences:
        raise PatchError("the reply has no fenced code block with the full program")
    new = max(fences, key=len)
    return new if new.endswith("\n") else new + "\n"


def apply_rewrite(code: str, reply: str) -> str:
    """The reply's fenced program replaces the old one if every frozen part is unchanged."""
    new = fenced_program(reply)
    old_frozen, new_frozen = frozen_parts(code), frozen_parts(new)
    if len(new_frozen) != len(old_frozen):
        raise PatchError(f"the rewrite has {len(new_frozen) - 1} evolve blocks; the program has "
                         f"{len(old_frozen) - 1}: keep every EVOLVE-BLOCK-START/END marker")
    for i, (a, b) in enumerate(zip(old_frozen, new_frozen)):
        if a.strip() != b.strip():
            diff = next((f"{x!r} became {y!r}" for x, y in zip(a.splitlines(), b.splitlines()) if x != y),
                        "lines were added or removed")
            raise PatchError(f"the rewrite changes frozen code outside the evolve blocks (part {i + 1}): {diff}")
    return new


def apply_change(code: str, reply: str) -> str:
    """Whatever form the reply took: SEARCH/REPLACE edits if it has any, else a full program."""
    if "<<<<<<< SEARCH" in reply:
        return apply_edits(code, reply)[0]
    return apply_rewrite(code, reply)
