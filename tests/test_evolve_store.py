"""The candidate store, selection, the design space and the directive proposer (no evaluation needed)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import sqlite3

import pytest
from conftest import GEMM_AG, ROOT, WORKLOADS

from cuco.designspace import DesignPoint, Directive, Placement, violations
from cuco.designspace.dimensions import DIMENSIONS, ENUMS
from cuco.evolve.database import MIGRATIONS, Database
from cuco.evolve.novelty import code_hash
from cuco.evolve.proposers import ProposalContext, SearchStopped, point_key
from cuco.evolve.proposers.directive import DirectiveProposer
from cuco.evolve.selection import hill_climbing, power_law, weighted
from cuco.evolve.strategy import directive_for, materialize
from cuco.runner.results.record import EvalRecord
from cuco.workload import load_workload

CPU_WL = ROOT / "cuco" / "builtin" / "cpu_allgather_matmul"


def _add(db, code, label=None, island=0, parent=None):
    return db.add(code=code, code_hash=code_hash(code, "cuda"), language="cuda", parent_id=parent, island=island,
                  generation=0, proposer="test", phase="explore", directive=None, label=label)


def test_migrations_from_empty_and_idempotent(tmp_path):
    db = Database(tmp_path / "c.db")
    names = [r[0] for r in db.conn.execute("SELECT name FROM migrations")]
    assert names == [m[0] for m in MIGRATIONS]
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    again = Database(tmp_path / "c.db")
    assert again.upgrade_schema() == []


def test_lifecycle_requeue_best_archive(tmp_path):
    db = Database(tmp_path / "c.db")
    a, b, c = _add(db, "a", "p1"), _add(db, "b", "p1", island=1), _add(db, "c", "p2")
    db.start(a)
    db.start(b)
    db.finish(a, EvalRecord.from_dict({"ok": True, "level_reached": "L4"}), 0.5, 1.0, 0.5, 1.0)
    assert db.requeue_unfinished() == 1  # b was cut off
    assert [x.id for x in db.pending()] == [b, c]
    db.finish(b, EvalRecord.from_dict({"ok": True}), 0.8, 0.6, 0.5, 1.0)
    db.finish(c, EvalRecord.from_dict({"ok": False, "failed_level": "L2", "error": "x"}), None, None, None, 1.0)
    assert db.best().id == b and db.best(0).id == a
    assert [x.id for x in db.archive()] == [b]  # best per design point: p1 -> b; p2 failed
    assert db.failures_by_level() == {"L2": 1}
    db.migrate_into(b, 0)
    assert db.best(0).id == b
    assert json.loads(db.get(c).record)["error"] == "x"
    with pytest.raises(sqlite3.IntegrityError):
        _add(db, "a")  # the same code twice is refused by the store itself


def test_selection_policies():
    ranked = ["best", "second", "third", "fourth"]
    rng = random.Random(1)
    picks = [power_law(ranked, rng, 2.0) for _ in range(2000)]
    assert picks.count("best") > picks.count("second") > picks.count("fourth")
    assert hill_climbing(ranked, rng) == "best"
    picks = [weighted(ranked, rng, [1.0, 0.9, 0.1, 0.0], 0.1) for _ in range(2000)]
    assert picks.count("best") > picks.count("second") > picks.count("third")


def test_design_point_validation_and_json():
    p = DesignPoint("lsa", "stream_overlap", "chunk", "warp", 4)
    d = Directive(p, "try chunks", "ag_gemm")
    assert Directive.from_json(d.to_json()) == d
    with pytest.raises(ValueError, match="chunks"):
        DesignPoint("lsa", "deferred", "global", "cta", 3)
    assert violations(DesignPoint("gin", "deferred", "global", "cta", 1))
    assert not violations(DesignPoint("gin", "deferred", "global", "cta", 1), {"rdma_nic": True})
    assert violations(DesignPoint("lsa", "stream_overlap", "tile", "cta", 1))
    assert violations(DesignPoint("ce", "stream_overlap", "chunk", "warp", 1))


def test_strategy_points_and_materialize():
    spec = load_workload(GEMM_AG)
    st = spec.strategies["ag_gemm"]
    points = st.points()
    assert len(points) == 75 and all(not violations(p) for p in points)
    src = materialize(st, DesignPoint("ce", "stream_overlap", "chunk", "cta", 8))
    head = src.splitlines()[1:6]
    assert head == ["#define CUCO_BACKEND Ce", "#define CUCO_PLACEMENT StreamOverlap", "#define CUCO_SYNC Chunk",
                    "#define CUCO_ISSUER Cta", "#define CUCO_CHUNKS 8"]
    # workload.toml's requires, exported for the runner to check before cuco_setup
    needs = src[src.index("CUCO_EXPORT void cuco_needs"):]
    assert "needs->lsaTeam = 1;" in needs and "needs->sideStreams = 2;" in needs
    assert 'cuco_need_symmetric(needs, "a");' in needs and 'cuco_need_symmetric(needs, "a_gathered");' in needs
    # workload.toml is the only accept-list: a point outside it is refused before any source is written
    with pytest.raises(ValueError, match="does not accept backend gin"):
        materialize(st, DesignPoint("gin", "stream_overlap", "chunk", "cta", 8))
    cpu = load_workload(CPU_WL)
    py = materialize(cpu.strategies["overlap"], DesignPoint("nccl_host", "split_put_wait", "chunk", "cta", 2))
    # a Python strategy's own DESIGN line is the candidate's point, once; the file is valid Python as it is
    point = ('DESIGN = {"backend": "nccl_host", "chunks": 2, "issuer": "cta", "placement": "split_put_wait", '
             '"sync": "chunk"}')
    assert py.count("DESIGN = ") == 1 and point in py.splitlines() and compile(py, "x.py", "exec")
    import ast

    own = ast.parse(cpu.strategies["overlap"].path.read_text())
    assert any(isinstance(n, ast.Assign) and n.targets[0].id == "DESIGN" for n in own.body if isinstance(n, ast.Assign))


def test_design_point_header_names_every_value_of_every_dimension():
    """cuco_design_point.cuh's enums and dimensions.py are one definition: every value, in order, in CamelCase."""
    header = (ROOT / "cuco" / "cuda" / "include" / "cuco_design_point.cuh").read_text()
    enums = {m[1]: [v.strip() for v in m[2].split(",")] for m in re.finditer(r"enum class (\w+) \{([^}]*)\}", header)}
    cxx = {"backend": "Backend", "placement": "Placement", "sync": "Sync", "issuer": "Issuer"}
    for dim, kind in ENUMS.items():
        assert enums[cxx[dim]] == [v.cxx for v in kind], dim
    assert f"kMaxChunks = {max(DIMENSIONS['chunks'])};" in header


def test_design_point_holds_enums_and_reads_back_from_strings():
    p = DesignPoint("ce", "stream_overlap", "chunk", "cta", 8)
    assert p.placement is Placement.STREAM_OVERLAP and p == DesignPoint(*p.label().split("/")[:4], 8)
    assert f"{p.placement}" == "stream_overlap" and Directive.from_json(Directive(p).to_json()).point == p
    with pytest.raises(ValueError, match="placement: 'sideways'"):
        DesignPoint("ce", "sideways", "chunk", "cta", 8)


def test_novelty_ignores_comments_and_layout():
    assert code_hash("int x; // a\n", "cuda") == code_hash("int  x;   /* b */\n", "cuda")
    assert code_hash("x = a // b\n", "python") != code_hash("x = a\n", "python")
    assert code_hash("# note\nx = 1\n", "python") == code_hash("x = 1\n", "python")


@pytest.mark.parametrize("phase", ["explore", "exploit"])
def test_directive_proposer_stays_in_the_accepted_space(tmp_path, phase):
    spec = load_workload(GEMM_AG)
    allowed = {(n, p.label()) for n, s in spec.strategies.items() for p in s.points()}
    proposer = DirectiveProposer(spec)
    db = Database(tmp_path / "c.db")
    seed = db.get(_add(db, "seed", "nccl_host/deferred/global/cta/1"))
    parent = seed
    tried: set[str] = set()
    for k in range(30):
        prop = asyncio.run(proposer.propose(ProposalContext(parent, [], phase, random.Random(k), tried)))
        name, label = prop.directive.strategy, prop.directive.point.label()
        assert (name, label) in allowed and point_key(name, label) not in tried
        tried.add(point_key(name, label))
        cid = db.add(code=prop.code, code_hash=code_hash(prop.code, "cuda"), language="cuda", parent_id=parent.id,
                     island=0, generation=1, proposer="directive", phase=phase, directive=prop.directive.to_json(),
                     label=label)
        parent = db.get(cid)


def test_directive_proposer_needs_strategies(tmp_path):
    spec = load_workload(GEMM_AG)
    spec.strategies = {}
    with pytest.raises(ValueError, match="no strategy kernels"):
        DirectiveProposer(spec)


def test_directive_proposer_goes_on_in_another_strategy_when_the_parents_is_spent(tmp_path):
    """gemm_reducescatter ships several strategies: with every ring point tried, a ring parent still gets a proposal,
    from another strategy; only when all are spent does the search stop."""
    spec = load_workload(WORKLOADS / "gemm_reducescatter")
    proposer = DirectiveProposer(spec)
    db = Database(tmp_path / "c.db")
    points = spec.strategies["rs_ring"].points()
    directive = directive_for(spec.strategies["rs_ring"], points[0], "").to_json()
    parent = db.get(db.add(code="ring", code_hash=code_hash("ring", "cuda"), language="cuda", parent_id=None, island=0,
                           generation=0, proposer="test", phase="explore", directive=directive,
                           label=points[0].label()))
    tried = {point_key("rs_ring", p.label()) for p in points}
    prop = asyncio.run(proposer.propose(ProposalContext(parent, [], "exploit", random.Random(0), tried)))
    name = prop.directive.strategy
    assert name != "rs_ring" and point_key(name, prop.directive.point.label()) not in tried
    tried |= {point_key(n, p.label()) for n in spec.strategies if n != "rs_ring"
              for p in spec.strategies[n].points()}
    with pytest.raises(SearchStopped, match="every strategy"):
        asyncio.run(proposer.propose(ProposalContext(parent, [], "exploit", random.Random(0), tried)))
