"""The candidate database: every proposal and evaluation of a run, in SQLite (WAL), and nothing else speaks SQL.

Each state change is one transaction, so a run killed at any moment (SIGKILL included) leaves the
database consistent: finished evaluations are kept with their results, a proposal whose evaluation
was cut off is still 'pending' or 'running' and is evaluated again on resume, never a finished one.
Schema changes are an append-only list of named migrations, recorded in the database.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cuco.runner.results.record import EvalRecord

MIGRATIONS: list[tuple[str, str]] = [
    ("001_candidates", """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE candidates (
            id INTEGER PRIMARY KEY,
            proposal_index INTEGER NOT NULL UNIQUE,   -- the k-th proposal of the run (0: the seed)
            code TEXT NOT NULL,
            code_hash TEXT NOT NULL UNIQUE,           -- exact duplicates are rejected before insertion
            language TEXT NOT NULL,                   -- cuda | python
            parent_id INTEGER REFERENCES candidates(id),
            island INTEGER NOT NULL,
            generation INTEGER NOT NULL,
            proposer TEXT NOT NULL,
            phase TEXT NOT NULL,                      -- seed | explore | exploit
            directive TEXT,                           -- JSON (cuco.designspace.Directive)
            label TEXT,                               -- the design point, readable
            status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'done')),
            ok INTEGER,
            level_reached TEXT,
            failed_level TEXT,
            score REAL,                               -- higher is better: efficiency = bound / time
            median_ms REAL,
            bound_ms REAL,
            error TEXT,
            diagnostics TEXT,
            record TEXT,                              -- JSON evaluation record
            created_at TEXT NOT NULL,
            started_at TEXT,
            finished_at TEXT,
            eval_seconds REAL
        );
        CREATE INDEX candidates_island ON candidates(island, status, score);
        CREATE TABLE island_members (              -- migrants: a candidate shared into another island
            candidate_id INTEGER NOT NULL REFERENCES candidates(id),
            island INTEGER NOT NULL,
            PRIMARY KEY (candidate_id, island)
        );
    """),
    ("002_llm_calls", """
        CREATE TABLE llm_calls (
            id INTEGER PRIMARY KEY,
            candidate_id INTEGER REFERENCES candidates(id),  -- the candidate the call produced, if any
            kind TEXT NOT NULL,                               -- diff | rewrite | crossover
            provider TEXT NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok', 'rejected', 'error')),
            error TEXT,                                       -- why the reply was rejected or the call failed
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL NOT NULL DEFAULT 0,
            seconds REAL,
            prompt TEXT,
            reply TEXT,
            created_at TEXT NOT NULL
        );
    """),
    ("003_meta_summaries", """
        CREATE TABLE meta_summaries (
            id INTEGER PRIMARY KEY,
            after_evaluations INTEGER NOT NULL UNIQUE,  -- written once this many evaluations had finished
            text TEXT NOT NULL,
            recommendations TEXT NOT NULL,              -- JSON list, at most 5
            created_at TEXT NOT NULL
        );
    """),
    ("004_embeddings", """
        CREATE TABLE embeddings (
            candidate_id INTEGER PRIMARY KEY REFERENCES candidates(id),
            model TEXT NOT NULL,
            vector BLOB NOT NULL                      -- float32, unit length
        );
    """),
]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _open_readonly(path: Path) -> sqlite3.Connection:
    """A connection that never writes. A WAL store closed cleanly (no -shm file beside it) in a folder that cannot
    be written cannot be read under mode=ro alone (SQLite must create the -shm file); nothing is writing it then,
    so it is read as immutable."""
    uri = f"file:{quote(str(path.absolute()))}?mode=ro"
    try:
        return _readable(sqlite3.connect(uri, uri=True, isolation_level=None))
    except sqlite3.OperationalError:
        return _readable(sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None))


def _readable(conn: sqlite3.Connection) -> sqlite3.Connection:
    """The connection, once a first read has worked (SQLite opens files lazily); closed if it did not."""
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        conn.close()
        raise
    return conn


@dataclass(frozen=True)
class Candidate:
    id: int
    proposal_index: int
    code: str
    code_hash: str
    language: str
    parent_id: int | None
    island: int
    generation: int
    proposer: str
    phase: str
    directive: str | None
    label: str | None
    status: str
    ok: bool | None
    level_reached: str | None
    failed_level: str | None
    score: float | None
    median_ms: float | None
    bound_ms: float | None
    error: str | None
    diagnostics: str | None
    record: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    eval_seconds: float | None


class Database:
    def __init__(self, path: Path, readonly: bool = False) -> None:
        """`readonly`: for what only reads a run (cuco report, cuco ui), so that a run directory it may not write
        (a copied result, a read-only mount) opens too; it sets nothing and migrates nothing."""
        self.path = Path(path)
        if readonly:
            self.conn = _open_readonly(self.path)
            return
        self.conn = sqlite3.connect(self.path, isolation_level=None)  # explicit transactions below
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")  # a finished evaluation survives a power cut too
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.upgrade_schema()

    def close(self) -> None:
        self.conn.close()

    # ---- schema ---------------------------------------------------------------------------------
    def upgrade_schema(self) -> list[str]:
        self.conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
        done = {r[0] for r in self.conn.execute("SELECT name FROM migrations")}
        applied = []
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            with self.transaction():
                for stmt in (s for s in sql.split(";") if s.strip()):
                    self.conn.execute(stmt)
                self.conn.execute("INSERT INTO migrations VALUES (?, ?)", (name, _now()))
            applied.append(name)
        return applied

    def missing_migrations(self) -> list[str]:
        """The migrations this store lacks (an older cuco wrote it): read without applying them."""
        try:
            done = {r[0] for r in self.conn.execute("SELECT name FROM migrations")}
        except sqlite3.OperationalError:  # no table at all: not a store of cuco evolve
            done = set()
        return [name for name, _ in MIGRATIONS if name not in done]

    def transaction(self):
        db = self

        class _Tx:
            def __enter__(self):
                db.conn.execute("BEGIN IMMEDIATE")

            def __exit__(self, typ, exc, tb):
                db.conn.execute("COMMIT" if typ is None else "ROLLBACK")
                return False

        return _Tx()

    # ---- meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def set_meta(self, key: str, value: Any) -> None:
        with self.transaction():
            self.conn.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                              (key, json.dumps(value)))

    # ---- candidates -----------------------------------------------------------------------------
    def has_code(self, code_hash: str) -> bool:
        return self.conn.execute("SELECT 1 FROM candidates WHERE code_hash = ?", (code_hash,)).fetchone() is not None

    def add(self, *, code: str, code_hash: str, language: str, parent_id: int | None, island: int, generation: int,
            proposer: str, phase: str, directive: str | None, label: str | None) -> int:
        with self.transaction():
            k = self.conn.execute("SELECT COALESCE(MAX(proposal_index) + 1, 0) FROM candidates").fetchone()[0]
            cur = self.conn.execute(
                "INSERT INTO candidates (proposal_index, code, code_hash, language, parent_id, island, generation, "
                "proposer, phase, directive, label, status, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?, 'pending', ?)",
                (k, code, code_hash, language, parent_id, island, generation, proposer, phase, directive, label,
                 _now()))
            return int(cur.lastrowid)

    def start(self, cid: int) -> None:
        with self.transaction():
            self.conn.execute("UPDATE candidates SET status = 'running', started_at = ? WHERE id = ?", (_now(), cid))

    def finish(self, cid: int, record: EvalRecord, score: float | None, median_ms: float | None,
               bound_ms: float | None, seconds: float) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE candidates SET status = 'done', ok = ?, level_reached = ?, failed_level = ?, score = ?, "
                "median_ms = ?, bound_ms = ?, error = ?, diagnostics = ?, record = ?, finished_at = ?, "
                "eval_seconds = ? WHERE id = ?",
                (int(bool(record.ok)), record.level_reached, record.failed_level, score,
                 median_ms, bound_ms, record.error, record.diagnostics, json.dumps(record.to_dict()), _now(),
                 seconds, cid))

    def requeue_unfinished(self) -> int:
        """Evaluations cut off by a kill go back to the queue; finished ones are never run again."""
        with self.transaction():
            return self.conn.execute("UPDATE candidates SET status = 'pending', started_at = NULL "
                                     "WHERE status = 'running'").rowcount

    def _rows(self, sql: str, args: tuple = ()) -> list[Candidate]:
        return [Candidate(**{**dict(r), "ok": None if r["ok"] is None else bool(r["ok"])})
                for r in self.conn.execute(sql, args)]

    def get(self, cid: int) -> Candidate:
        return self._rows("SELECT * FROM candidates WHERE id = ?", (cid,))[0]

    def all(self) -> list[Candidate]:
        return self._rows("SELECT * FROM candidates ORDER BY proposal_index")

    def seed(self) -> Candidate | None:
        """The candidate the search started from."""
        rows = self._rows("SELECT * FROM candidates WHERE proposer = 'seed' ORDER BY proposal_index LIMIT 1")
        return rows[0] if rows else None

    def pending(self) -> list[Candidate]:
        return self._rows("SELECT * FROM candidates WHERE status = 'pending' ORDER BY proposal_index")

    def count(self, status: str | None = None) -> int:
        if status is None:
            return self.conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        return self.conn.execute("SELECT COUNT(*) FROM candidates WHERE status = ?", (status,)).fetchone()[0]

    def scored(self, island: int | None = None) -> list[Candidate]:
        """Finished, correct candidates, best first; with an island: its own members and its migrants."""
        if island is None:
            return self._rows("SELECT * FROM candidates WHERE status = 'done' AND ok = 1 AND score IS NOT NULL "
                              "ORDER BY score DESC, id")
        return self._rows(
            "SELECT * FROM candidates WHERE status = 'done' AND ok = 1 AND score IS NOT NULL AND "
            "(island = ? OR id IN (SELECT candidate_id FROM island_members WHERE island = ?)) ORDER BY score DESC, id",
            (island, island))

    def best(self, island: int | None = None) -> Candidate | None:
        rows = self.scored(island)
        return rows[0] if rows else None

    def archive(self) -> list[Candidate]:
        """The best candidate of each distinct design point: diverse elites for inspirations."""
        return self._rows(
            "SELECT * FROM candidates c WHERE status = 'done' AND ok = 1 AND score IS NOT NULL AND id = ("
            " SELECT id FROM candidates d WHERE d.status = 'done' AND d.ok = 1 AND d.score IS NOT NULL AND"
            " COALESCE(d.label, d.code_hash) = COALESCE(c.label, c.code_hash) ORDER BY d.score DESC, d.id LIMIT 1)"
            " ORDER BY score DESC, id")

    def migrate_into(self, cid: int, island: int) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR IGNORE INTO island_members VALUES (?, ?)", (cid, island))

    def log_call(self, *, kind: str, provider: str, model: str, status: str, error: str | None = None,
                 input_tokens: int = 0, output_tokens: int = 0, cost_usd: float = 0.0, seconds: float | None = None,
                 prompt: str | None = None, reply: str | None = None) -> int:
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO llm_calls (kind, provider, model, status, error, input_tokens, output_tokens, cost_usd, "
                "seconds, prompt, reply, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (kind, provider, model, status, error, input_tokens, output_tokens, cost_usd, seconds, prompt, reply,
                 _now()))
            return int(cur.lastrowid)

    def link_calls(self, cid: int, call_ids: list[int]) -> None:
        with self.transaction():
            self.conn.executemany("UPDATE llm_calls SET candidate_id = ? WHERE id = ?", [(cid, c) for c in call_ids])

    def llm_totals(self) -> dict[str, Any]:
        row = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), "
                                "COALESCE(SUM(cost_usd), 0) FROM llm_calls").fetchone()
        by_status = {r[0]: r[1] for r in self.conn.execute("SELECT status, COUNT(*) FROM llm_calls GROUP BY status")}
        return {"calls": row[0], "input_tokens": row[1], "output_tokens": row[2], "cost_usd": row[3], **by_status}

    def proposal_costs(self) -> list[sqlite3.Row]:
        """One row per proposal (a candidate's calls, retries included, or one call that made none): the model, its
        dollars, the candidate's status, ok and score, and its parent's score; meta calls left out."""
        return self.conn.execute(
            "SELECT l.model, l.candidate_id, SUM(l.cost_usd) AS cost, c.status, c.ok, c.score, p.score AS parent "
            "FROM llm_calls l LEFT JOIN candidates c ON c.id = l.candidate_id "
            "LEFT JOIN candidates p ON p.id = c.parent_id WHERE l.kind != 'meta' "
            "GROUP BY l.model, COALESCE(l.candidate_id, -l.id)").fetchall()

    def llm_calls(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.conn.execute("SELECT * FROM llm_calls ORDER BY id")]

    def add_summary(self, after: int, text: str, recommendations: list[str]) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR IGNORE INTO meta_summaries (after_evaluations, text, recommendations, "
                              "created_at) VALUES (?, ?, ?, ?)", (after, text, json.dumps(recommendations), _now()))

    def latest_summary(self) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM meta_summaries ORDER BY after_evaluations DESC LIMIT 1").fetchone()
        return None if row is None else {**dict(row), "recommendations": json.loads(row["recommendations"])}

    def add_embedding(self, cid: int, model: str, vector) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)", (cid, model, vector.tobytes()))

    def missing_embeddings(self, model: str) -> list[Candidate]:
        return self._rows("SELECT * FROM candidates WHERE id NOT IN (SELECT candidate_id FROM embeddings "
                          "WHERE model = ?) ORDER BY id", (model,))

    def nearest(self, vector, model: str) -> tuple[float, int | None]:
        """The most similar stored candidate: (cosine similarity, id)."""
        import numpy as np

        best, best_id = -1.0, None
        for cid, blob in self.conn.execute("SELECT candidate_id, vector FROM embeddings WHERE model = ?", (model,)):
            sim = float(np.dot(np.frombuffer(blob, dtype=np.float32), vector))
            if sim > best:
                best, best_id = sim, cid
        return best, best_id

    def failures_by_level(self) -> dict[str, int]:
        return {r[0]: r[1] for r in self.conn.execute(
            "SELECT failed_level, COUNT(*) FROM candidates WHERE status = 'done' AND ok = 0 GROUP BY failed_level")}

    def iter_done(self) -> Iterator[Candidate]:
        yield from self._rows("SELECT * FROM candidates WHERE status = 'done' ORDER BY finished_at, id")
