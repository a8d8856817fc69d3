"""The directive a reply states before its change: the design point it aims at and why, as JSON.

Parsed by the search (to label and deduplicate candidates) and by the fast path's judge alike.
"""

from __future__ import annotations

import json
import re

from cuco.designspace import DesignPoint, Directive, violations
from cuco.program.edits import PatchError

DIRECTIVE_RE = re.compile(r"<directive>(.*?)</directive>", re.S)


def parse_directive(reply: str) -> Directive:
    m = DIRECTIVE_RE.search(reply)
    if not m:
        raise PatchError("the reply has no <directive>{...}</directive> JSON before the change")
    try:
        data = json.loads(m.group(1))
    except json.JSONDecodeError as exc:
        raise PatchError(f"the directive is not valid JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(data, dict):
        raise PatchError("the directive must be a JSON object with keys point and text")
    point = data.get("point")
    if point is not None:
        try:
            point = DesignPoint(**point)
        except (TypeError, ValueError) as exc:
            raise PatchError(f"the directive's point is invalid: {exc}") from None
        bad = violations(point)
        if bad:
            raise PatchError(f"the directive's point is impossible: {bad[0]}")
    return Directive(point, str(data.get("text", "")))
