"""The house rules, checked: short functions, no reaching into another module's private names, and the layering
DESIGN promises (the fast path without the search, programs without either, no cycle between packages)."""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT

PACKAGE = ROOT / "cuco"
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "workloads" in path.relative_to(PACKAGE).parts:
            continue  # workloads are data: references and candidates, not the framework
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


MODULES = _modules()


def _imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cuco")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cuco"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
    return found


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        mod = todo.pop()
        if mod in seen or mod not in MODULES:
            continue
        seen.add(mod)
        todo += list(_imports(MODULES[mod]))
    return seen


def test_no_function_is_longer_than_80_lines():
    long = [f"{mod}.{node.name}: {node.end_lineno - node.lineno + 1} lines" for mod, tree in MODULES.items()
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []


def test_no_module_reaches_into_another_modules_private_names():
    bad = []
    for mod, tree in MODULES.items():
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cuco"):
                bad += [f"{mod} imports {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
                aliases |= {a.asname or a.name: a.name for a in node.names if f"{node.module}.{a.name}" in MODULES}
            elif isinstance(node, ast.Import):
                aliases |= {a.asname or a.name: a.name for a in node.names if a.name.startswith("cuco")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in aliases):
                bad.append(f"{mod} reads {node.value.id}.{node.attr}")
    assert bad == []


@pytest.mark.parametrize("package,forbidden", [
    ("cuco.fastpath", ("cuco.evolve", "cuco.report")),
    ("cuco.program", ("cuco.evolve", "cuco.fastpath", "cuco.report", "cuco.runner")),
    ("cuco.runner", ("cuco.evolve", "cuco.fastpath", "cuco.report", "cuco.llm")),
    ("cuco.evolve", ("cuco.report", "cuco.fastpath", "cuco.cluster")),
    ("cuco.cluster", ("cuco.report", "cuco.fastpath", "cuco.llm")),
])
def test_layers_import_only_downwards(package, forbidden):
    # the graph is real: known edges are found, so an empty result is not a parse that found nothing
    assert {"cuco.evolve.run", "cuco.runner.cascade", "cuco.fastpath.pipeline"} <= _reachable("cuco.cli")
    for mod in (m for m in MODULES if m == package or m.startswith(package + ".")):
        reached = _reachable(mod)
        assert not [r for r in reached if r.startswith(forbidden)], (mod, sorted(r for r in reached
                                                                              if r.startswith(forbidden)))


def test_only_the_store_speaks_sql():
    speakers = sorted({mod for mod, tree in MODULES.items() for node in ast.walk(tree)
                       if isinstance(node, ast.Attribute) and node.attr in ("execute", "executemany", "executescript")})
    assert speakers == ["cuco.evolve.database"], speakers


def test_the_dtype_table_matches_the_c_abi():
    import re

    from cuco.dtypes import DTYPES, c_code

    header = (PACKAGE / "cuda" / "include" / "cuco.h").read_text()
    enum = re.search(r"typedef enum \{([^}]*)\} cuco_dtype_t;", header).group(1)
    names = [part.split("=")[0].strip() for part in enum.split(",")]
    assert names == [d.c_enum for d in DTYPES.values()]
    assert "= 0" in enum.split(",")[0] and all("=" not in part for part in enum.split(",")[1:])
    assert [c_code(n) for n in DTYPES] == list(range(len(DTYPES)))
