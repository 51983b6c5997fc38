"""The service's durable state on SQLAlchemy Core: submissions, attempts, verdicts, bundle bytes.

One schema for both back ends: SQLite (the embedded default, a file path) and PostgreSQL (a
``postgresql+psycopg://`` URL, for a service spread over machines). The schema is owned by the
Alembic migrations in ``service/migrations`` and upgraded to the head revision when a store is
opened; the tables below mirror it (a test compares the two).

Tables:

- ``blobs``: a bundle archive per content hash, kept so a restarted service can run what is queued.
- ``submissions``: one row per submission, keyed by ``id``; ``hash`` is the bundle's content hash
  (for bytes that are no bundle, the SHA-256 of the bytes). ``state`` moves queued -> running ->
  done, or waiting -> done for a copy of bytes whose first submission is still queued or running
  (``first_id`` points at it). ``status`` is the final verdict (pass, fail, not run, invalid),
  ``reason`` its one line (``duplicate_of:<id>:<reason>``, ``copy_of:<id>``, ``not run: worker lost``).
- ``attempts``: one row per time a job was handed to a worker (``outcome`` running, done, worker lost,
  timed out, interrupted); ``(submission_id, number)`` is unique.
- ``verdicts``: the verify run of a submission's finished attempt (its JSON payload, HTML report,
  device); one per submission (the primary key), so a result can never be recorded twice.
- ``variants``: per slot and op row of a verdict, its status and timed speedup against the
  incumbent (median over timed profiles, with the lowest and highest) and the device: the
  leaderboard's rows.

Every write is one transaction; a submission and its first attempt are committed before either is
acknowledged.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa

__all__ = ["ServiceStore", "metadata", "store_url", "follower_outcome", "StoreConflict"]

metadata = sa.MetaData()

blobs = sa.Table(
    "blobs", metadata,
    sa.Column("hash", sa.String(64), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)
submissions = sa.Table(
    "submissions", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("hash", sa.String(64), nullable=False, index=True),
    sa.Column("submitter", sa.String(200)),
    sa.Column("received", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("status", sa.String(16)),
    sa.Column("reason", sa.Text),
    sa.Column("exit_code", sa.Integer),
    sa.Column("first_id", sa.Integer, sa.ForeignKey("submissions.id")),
    sa.Column("relation", sa.String(16)),
    sa.Column("bundle_id", sa.String(200)),
    sa.Column("options", sa.Text, nullable=False),
    sa.Column("finished", sa.Float),
)
attempts = sa.Table(
    "attempts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), nullable=False, index=True),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("worker", sa.String(200)),
    sa.Column("node", sa.String(200)),
    sa.Column("started", sa.Float, nullable=False),
    sa.Column("finished", sa.Float),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("message", sa.Text),
    sa.UniqueConstraint("submission_id", "number", name="uq_attempts_submission_number"),
)
verdicts = sa.Table(
    "verdicts", metadata,
    sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), primary_key=True),
    sa.Column("attempt_id", sa.Integer, sa.ForeignKey("attempts.id"), nullable=False, unique=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("exit_code", sa.Integer, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("device", sa.Text),
    sa.Column("elapsed", sa.Float),
    sa.Column("payload", sa.Text),
    sa.Column("report_html", sa.Text),
)
variants = sa.Table(
    "variants", metadata,
    sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), nullable=False, index=True),
    sa.Column("slot", sa.String(100), nullable=False),
    sa.Column("variant", sa.String(200), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("speedup", sa.Float),
    sa.Column("speedup_lo", sa.Float),
    sa.Column("speedup_hi", sa.Float),
    sa.Column("timed", sa.Integer, nullable=False),
    sa.Column("device", sa.Text),
    sa.UniqueConstraint("submission_id", "slot", "variant", name="uq_variants_row"),
)


class StoreConflict(RuntimeError):
    """A write lost a race it must not win (an attempt finished twice); nothing was written."""


def store_url(spec: str | Path) -> str:
    """A SQLAlchemy URL for ``spec``: a URL as given, else a SQLite file path."""
    s = str(spec)
    if "://" in s:
        return s
    p = Path(s)
    if p.parent and not p.parent.exists():
        raise ValueError(f"--store {s}: directory {p.parent} does not exist (create it first)")
    return f"sqlite:///{p.resolve()}"


def _upgrade(engine: sa.Engine) -> None:
    import logging

    from alembic import command
    from alembic.config import Config

    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines are not the service's output
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _row(r) -> dict[str, Any]:
    d = dict(r._mapping)
    if "options" in d and isinstance(d["options"], str):
        d["options"] = json.loads(d["options"])
    return d


class ServiceStore:
    """The service's tables at ``url`` (a SQLAlchemy URL or a SQLite path), migrated on open."""

    def __init__(self, url: str | Path):
        self.url = store_url(url)
        kw: dict[str, Any] = {}
        if self.url.startswith("sqlite"):
            kw["connect_args"] = {"timeout": 30, "check_same_thread": False}
        self.engine = sa.create_engine(self.url, **kw)
        if self.url.startswith("sqlite"):
            @sa.event.listens_for(self.engine, "connect")
            def _pragmas(dbapi, _record):  # concurrent readers beside the one writer; foreign keys enforced
                cur = dbapi.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()
        _upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # --- submissions ---------------------------------------------------------------------------

    def add_blob(self, conn, digest: str, data: bytes) -> None:
        if conn.execute(sa.select(blobs.c.hash).where(blobs.c.hash == digest)).first() is None:
            conn.execute(blobs.insert().values(hash=digest, data=data, size=len(data), created=time.time()))

    def blob(self, digest: str) -> bytes:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(blobs.c.data).where(blobs.c.hash == digest)).first()
        if row is None:
            raise KeyError(f"no archive stored for bundle {digest}")
        return bytes(row[0])

    def first_of(self, conn, digest: str, device: str = "cpu") -> dict | None:
        """The submission a new one with content ``digest`` for ``device`` is a copy of: the earliest
        that is still queued or running, or finished pass or fail (a 'not run' is no verdict: it runs
        again). A verdict holds for the device it was reached on only."""
        q = (sa.select(submissions).where(submissions.c.hash == digest, submissions.c.first_id.is_(None),
                                          sa.or_(submissions.c.state.in_(("queued", "running")),
                                                 submissions.c.status.in_(("pass", "fail"))))
             .order_by(submissions.c.id))
        return next((row for row in map(_row, conn.execute(q)) if row["options"].get("device", "cpu") == device), None)

    def insert_submission(self, conn, **values) -> int:
        values.setdefault("received", time.time())
        values["options"] = json.dumps(values.get("options") or {}, sort_keys=True)
        return int(conn.execute(submissions.insert().values(**values)).inserted_primary_key[0])

    def submission(self, sid: int) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(submissions).where(submissions.c.id == sid)).first()
        return _row(row) if row else None

    def submissions(self, state: str | None = None, after: int = 0, limit: int | None = None) -> list[dict]:
        q = sa.select(submissions).where(submissions.c.id > after).order_by(submissions.c.id)
        if state:
            q = q.where(submissions.c.state == state)
        if limit:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def queued(self) -> list[dict]:
        return self.submissions(state="queued")

    def finish(self, conn, sid: int, status: str, reason: str, exit_code: int) -> None:
        """Give submission ``sid`` its final status, and every copy waiting on it theirs."""
        now = time.time()
        conn.execute(submissions.update().where(submissions.c.id == sid)
                     .values(state="done", status=status, reason=reason, exit_code=exit_code, finished=now))
        for w in conn.execute(sa.select(submissions.c.id).where(submissions.c.first_id == sid,
                                                                submissions.c.state == "waiting")).all():
            conn.execute(submissions.update().where(submissions.c.id == w.id).values(
                state="done", finished=now, **follower_outcome(sid, status, reason, exit_code)))

    # --- attempts ------------------------------------------------------------------------------

    def start_attempt(self, sid: int, worker: str, node: str) -> tuple[int, int]:
        """A new attempt for a queued submission: ``(attempt id, its number)``; the submission is then running."""
        with self.engine.begin() as conn:
            n = conn.execute(sa.select(sa.func.count()).select_from(attempts)
                             .where(attempts.c.submission_id == sid)).scalar_one()
            aid = conn.execute(attempts.insert().values(submission_id=sid, number=n + 1, worker=worker, node=node,
                                                        started=time.time(), outcome="running")).inserted_primary_key[0]
            conn.execute(submissions.update().where(submissions.c.id == sid).values(state="running"))
        return int(aid), n + 1

    def attempts(self, sid: int | None = None) -> list[dict]:
        q = sa.select(attempts).order_by(attempts.c.id)
        if sid is not None:
            q = q.where(attempts.c.submission_id == sid)
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def _close_attempt(self, conn, aid: int, outcome: str, message: str | None) -> None:
        res = conn.execute(attempts.update().where(attempts.c.id == aid, attempts.c.outcome == "running")
                           .values(outcome=outcome, message=message, finished=time.time()))
        if res.rowcount != 1:
            raise StoreConflict(f"attempt {aid} is no longer running (finished already or interrupted)")

    def lose_attempt(self, sid: int, aid: int, outcome: str, message: str, max_attempts: int) -> bool:
        """Close attempt ``aid`` as lost (``outcome``: worker lost, timed out). Requeue the submission
        if it has attempts left, else finish it ``not run: <outcome>``. True if requeued."""
        with self.engine.begin() as conn:
            self._close_attempt(conn, aid, outcome, message)
            n = conn.execute(sa.select(sa.func.count()).select_from(attempts)
                             .where(attempts.c.submission_id == sid)).scalar_one()
            if n < max_attempts:
                conn.execute(submissions.update().where(submissions.c.id == sid).values(state="queued"))
                return True
            self.finish(conn, sid, "not run", f"not run: {outcome} ({n} attempts; last: {message})", 3)
            return False

    def record_verdict(self, sid: int, aid: int, verdict: dict, rows: list[dict]) -> None:
        """Close attempt ``aid`` as done with the verify run ``verdict`` (status, exit_code, reason,
        device, elapsed, payload, report_html) and its leaderboard ``rows``; finish the submission.
        One transaction; raises :class:`StoreConflict` (nothing written) if the attempt is not running."""
        with self.engine.begin() as conn:
            self._close_attempt(conn, aid, "done", None)
            conn.execute(verdicts.insert().values(submission_id=sid, attempt_id=aid, **verdict))
            for r in rows:
                conn.execute(variants.insert().values(submission_id=sid, **r))
            self.finish(conn, sid, verdict["status"], verdict["reason"], verdict["exit_code"])

    def resume(self) -> list[int]:
        """After a restart: attempts left running are interrupted, their submissions queued again.
        Returns the ids requeued."""
        with self.engine.begin() as conn:
            running = conn.execute(sa.select(attempts.c.id, attempts.c.submission_id)
                                   .where(attempts.c.outcome == "running")).all()
            for a in running:
                conn.execute(attempts.update().where(attempts.c.id == a.id).values(
                    outcome="interrupted", message="the service stopped while it ran", finished=time.time()))
            ids = [r.id for r in conn.execute(sa.select(submissions.c.id).where(submissions.c.state == "running"))]
            conn.execute(submissions.update().where(submissions.c.state == "running").values(state="queued"))
        return ids

    # --- reading -------------------------------------------------------------------------------

    def verdict(self, sid: int) -> dict | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(verdicts).where(verdicts.c.submission_id == sid)).first()
        return _row(row) if row else None

    def reported(self) -> set[int]:
        """The submissions whose verdict carries an HTML report."""
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(verdicts.c.submission_id).where(verdicts.c.report_html.is_not(None)))}

    def variant_rows(self) -> Iterator[dict]:
        q = (sa.select(variants, submissions.c.submitter, submissions.c.bundle_id, submissions.c.received)
             .join(submissions, submissions.c.id == variants.c.submission_id).order_by(variants.c.submission_id))
        with self.engine.connect() as conn:
            yield from (_row(r) for r in conn.execute(q).all())


def follower_outcome(first_id: int, status: str, reason: str, exit_code: int) -> dict:
    """What a byte-identical copy of submission ``first_id`` is answered, given the first's verdict:
    a PASS is credited to the first (``copy_of:<id>``), a FAIL replayed (``duplicate_of:<id>:<reason>``);
    a 'not run' is no verdict, so the copy is not run for the same reason."""
    if status == "pass":
        return dict(status="pass", relation="copy", reason=f"copy_of:{first_id}", exit_code=exit_code)
    return dict(status=status, relation="duplicate", reason=f"duplicate_of:{first_id}:{reason}", exit_code=exit_code)
