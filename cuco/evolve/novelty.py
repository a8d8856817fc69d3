"""Rejection of duplicates: exact ones by a hash of the normalised code.

Normalising drops comments and whitespace, so a copy that differs only in layout or in the comment
naming its directive is still a duplicate. Near duplicates of LLM-written code (embedding similarity)
belong to the LLM proposers; for strategy kernels the same design point gives the same code.
"""

from __future__ import annotations

import hashlib
import re


def normalize(code: str, language: str) -> str:
    if language == "cuda":
        code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
        code = re.sub(r"//[^\n]*", "", code)
    else:
        code = re.sub(r"(?m)^\s*#[^\n]*", "", code)  # whole-line comments only: '#' inside strings stays
    return re.sub(r"\s+", " ", code).strip()


def code_hash(code: str, language: str) -> str:
    return hashlib.sha256(normalize(code, language).encode()).hexdigest()
