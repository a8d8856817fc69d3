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
        if path.relative_to(PACKAGE).parts[0] == "builtin":
            continue  # the built-in workloads are data: references and candidates, not the framework
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations, never run."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING" for stmt in node.body for n in ast.walk(stmt)}


def _imports(tree: ast.Module) -> set[str]:
    found, skipped = set(), _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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
    ("cuco.workload", ("cuco.runner", "cuco.fastpath", "cuco.scaffold", "cuco.evolve", "cuco.report")),
    ("cuco.fastpath", ("cuco.evolve", "cuco.report", "cuco.scaffold")),
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            nxt = next((w for w in edges if w not in index or w in stack), None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif nxt in index:
                low[node] = min(low[node], index[nxt])
            else:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                work.append((nxt, iter(sorted(graph[nxt]))))
    return found


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules_or_packages():
    modules = {m: {i for i in _imports(t) if i in MODULES and i != m} for m, t in MODULES.items()}
    packages: dict[str, set[str]] = {}
    for m, deps in modules.items():
        packages.setdefault(_package(m), set()).update(_package(d) for d in deps if _package(d) != _package(m))
    for p in {d for deps in packages.values() for d in deps}:
        packages.setdefault(p, set())
    assert _cycles(modules) == [] and _cycles(packages) == []
    # the check sees a cycle where there is one
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


BENCHMARKS = {f"benchmarks.{p.stem}": ast.parse(p.read_text(), str(p))
              for p in sorted((ROOT / "benchmarks").glob("*.py"))}
EVERYTHING = {**MODULES, **BENCHMARKS}


def _imported(tree: ast.Module) -> set[str]:
    """Every module name an import statement of TREE names, whatever the package."""
    return {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_only_the_store_speaks_sql():
    assert len(BENCHMARKS) > 10
    speakers = sorted({mod for mod, tree in EVERYTHING.items() for node in ast.walk(tree)
                       if isinstance(node, ast.Attribute) and node.attr in ("execute", "executemany", "executescript")})
    assert speakers == ["cuco.evolve.database"], speakers
    # a benchmark reads a run through the store's API: it does not open the database itself
    assert [b for b, tree in BENCHMARKS.items() if "sqlite3" in _imported(tree)] == []


def test_only_the_command_line_imports_typer():
    assert sorted(m for m, tree in EVERYTHING.items() if any(i.split(".")[0] == "typer" for i in _imported(tree))) \
        == ["cuco.cli"]


def test_a_search_enters_through_one_front_door():
    """cuco.search builds the Evolution; the command line and the benchmarks call it (one benchmark runs the
    commands themselves, to compare `cuco eval` with `cuco evolve`)."""
    builders = sorted(m for m, tree in EVERYTHING.items() for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and getattr(n.func, "id", getattr(n.func, "attr", None)) == "Evolution")
    assert builders == ["cuco.search"], builders
    assert "cuco.search" in _imports(MODULES["cuco.cli"])
    commands = sorted(b for b, tree in BENCHMARKS.items() for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and any(isinstance(a, ast.Constant) and a.value == "evolve" for a in n.args))
    assert commands == ["benchmarks.eval_vs_evolve"], commands


# The names of a run directory's files and folders: cuco.evolve.rundir.RunDir names each one, nothing else joins them.
RUN_DIR_NAMES = {"cuco.db", "config.json", "summary.json", "report.html", "best", "derived", "evals", "baselines",
                 "rounds"}


def test_every_run_directory_path_comes_from_run_dir():
    joined = sorted({m for m, tree in EVERYTHING.items() if m != "cuco.evolve.rundir"
                    for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                     and isinstance(n.right, ast.Constant) and n.right.value in RUN_DIR_NAMES})
    # what cuco_home() holds is not a run directory: `cuco baseline`'s records, named by cuco.paths
    assert joined == ["cuco.paths"], joined


def test_the_dtype_table_matches_the_c_abi():
    import re

    from cuco.dtypes import DTYPES, c_code

    header = (PACKAGE / "cuda" / "include" / "cuco.h").read_text()
    enum = re.search(r"typedef enum \{([^}]*)\} cuco_dtype_t;", header).group(1)
    names = [part.split("=")[0].strip() for part in enum.split(",")]
    assert names == [d.c_enum for d in DTYPES.values()]
    assert "= 0" in enum.split(",")[0] and all("=" not in part for part in enum.split(",")[1:])
    assert [c_code(n) for n in DTYPES] == list(range(len(DTYPES)))


def test_results_hold_one_current_result_per_benchmark_at_their_top():
    """benchmarks/results/: each current result as <name>.json with its <name>.md; logs in logs/, replaced results in
    archive/; the notes and the index are Markdown alone."""
    top = ROOT / "benchmarks" / "results"
    files = {p.name for p in top.iterdir() if p.is_file()}
    assert {p.name for p in top.iterdir() if p.is_dir()} == {"archive", "logs"}
    assert not [f for f in files if not f.endswith((".json", ".md"))]
    unpaired = sorted(f for f in files if f.endswith(".md") and f.removesuffix(".md") + ".json" not in files)
    assert unpaired == ["README.md", "diagnose_ag_overlap.md", "notes-collectives.md"]
    assert all(f.removesuffix(".json") + ".md" in files for f in files if f.endswith(".json"))
