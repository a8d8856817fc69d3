"""The machine's ceilings as `cuco doctor` measures and saves them, with their method and share of the datasheet.

    python benchmarks/ceilings.py [--out DIR]        # on a GPU machine; two GPUs add the peer link
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import record

sys.path.insert(0, str(record.ROOT))
from cuco.machine import load_machine  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(record.ROOT) / "benchmarks" / "results")
    args = ap.parse_args()
    proc = record.cuco("doctor", "--json")
    if proc.returncode != 0:
        return proc.returncode
    machine = load_machine()
    ceilings = machine.get("ceilings") or {}
    info = record.meta(machine)
    lines = [f"# The machine's ceilings, {info['device']}", "",
             f"{info['date']}, commit {info['commit']}, `{info['command']}`."
             + (f" Not saved: {machine['ceilings_refused']}." if machine.get("ceilings_refused") else ""), "",
             "| ceiling | measured | datasheet | share | method |", "|---|---|---|---|---|"]
    for key, c in ceilings.items():
        share = f"{c['share']:.0%}" if c.get("share") else "-"
        sheet = c.get("datasheet") or "-"
        lines.append(f"| {key} | {c['value']:.0f} {c['unit']} | {sheet} | {share} | {c['method']} |")
    gpu = (info.get("gpu") or "gpu").replace(" ", "_")
    record.save(args.out, f"ceilings-{gpu}", info,
                {"ceilings": ceilings, "refused": machine.get("ceilings_refused")}, lines)
    print(json.dumps(ceilings, indent=1)[:2000])
    return 0 if ceilings and not machine.get("ceilings_refused") else 1


if __name__ == "__main__":
    sys.exit(main())
