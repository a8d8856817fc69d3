"""A search's run directory, every path in it named here once: the store, the configuration it ran with, each
evaluation's folder, the baselines' and the final rounds', the best program, the derived strategies, the summary.
Built once where a search or a reader of one starts, and passed down."""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from cuco.errors import CucoError, CucoFailure
from cuco.evolve.database import MIGRATIONS, Database


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def of(cls, where: RunDir | Path | str) -> RunDir:
        return where if isinstance(where, RunDir) else cls(Path(where))

    def __str__(self) -> str:
        return str(self.root)

    @property
    def store(self) -> Path:
        """The SQLite store: candidates, their records, the search's state (cuco.evolve.database)."""
        return self.root / "cuco.db"

    @property
    def config(self) -> Path:
        """The run.toml settings the search ran with, as JSON."""
        return self.root / "config.json"

    @property
    def summary(self) -> Path:
        """What the search ended with (cuco.search.SearchResult.summary)."""
        return self.root / "summary.json"

    @property
    def best(self) -> Path:
        """The best program so far, its record and its row."""
        return self.root / "best"

    @property
    def best_record(self) -> Path:
        return self.best / "record.json"

    @property
    def derived(self) -> Path:
        """The strategies derived from the knobs of a program's rewrite (cuco.fastpath.knobs)."""
        return self.root / "derived"

    @property
    def report(self) -> Path:
        """`cuco report`'s page, by default."""
        return self.root / "report.html"

    def evaluation(self, candidate_id: int) -> Path:
        return self.root / "evals" / f"{candidate_id:05d}"

    def baseline(self, name: str) -> Path:
        return self.root / "baselines" / name

    def rounds(self, key: str) -> Path:
        """The alternating rounds that time the best against a rival (key: "best", "start", "baseline:NAME")."""
        return self.root / "rounds" / key.replace(":", "-")

    def create(self) -> RunDir:
        """The folder, created and proven writable: cuco's own failure, named, when it cannot be."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".cuco-write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise CucoFailure(str(self.root), f"cannot write the run directory: {exc.strerror or exc}") from None
        return self

    def open(self, readonly: bool = False) -> Database:
        """Its store; `readonly` for what only reads a run."""
        return Database(self.store, readonly=readonly)

    def readable(self) -> RunDir:
        """This, once its store opens read-only as one of cuco evolve's at the current schema; else the reason, as
        the user's error. Readers (report, ui, benchmarks) may be given a copy, or a mount they cannot write."""
        if not self.store.is_file():
            raise CucoError(str(self.root), "not a run directory of cuco evolve (no cuco.db)")
        try:
            db = self.open(readonly=True)
            try:
                missing = db.missing_migrations()
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            raise CucoError(str(self.store), f"cannot be read as a store of cuco evolve ({exc})") from None
        if missing == [name for name, _ in MIGRATIONS]:
            raise CucoError(str(self.store), "not a store of cuco evolve (it has none of its tables)")
        if missing:
            raise CucoError(str(self.store), f"written by an older cuco (its schema lacks {missing[0]}): the same cuco "
                                             "evolve command brings it up to date")
        return self
