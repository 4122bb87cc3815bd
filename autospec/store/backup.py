"""``autospec db backup`` / ``autospec db restore``: the store and its artifacts, portably.

No ``pg_dump`` (nor its version matching the server's) is needed: every autospec table is read
through SQLAlchemy with the models' column types and written as JSON Lines, so a backup taken
from SQLite restores into PostgreSQL and back. A backup is a directory::

    backup.json              format, migration revision, source, row counts, artifacts
    tables/<table>.jsonl     one JSON object a row, primary-key order
    artifacts/<version>/     each registered version's artifact files (manifest included)

Values (:mod:`autospec.store.backup_format`): ``LargeBinary`` columns (token ids) as base64,
timestamps as ISO 8601 UTC, JSON as JSON, the rest as is. The tables are read in one
transaction (``REPEATABLE READ`` on PostgreSQL), so the copy is consistent while replicas
keep writing. It is written under a partial name and renamed into place once on disk
(:func:`autospec.durable.rename_into_place`).

:func:`restore` refuses a backup of another revision than this code's head (restore it with
the autospec that took it, then ``autospec db upgrade``), a target store at another revision,
and a target store that holds anything (beyond the built-in version the migrations register)
unless ``force``. Before it writes anything, it reads every table file, each row parsed and
each table's rows counted against ``backup.json`` (a file cut short or missing rows is
refused: :mod:`autospec.store.restore_rows`), and checks every artifact against the SHA-256
the registry records. It copies the artifacts into a staging folder in the configured
artifact directory (:mod:`autospec.store.restore_artifacts`), then in one transaction
replaces every table's rows, in foreign-key order, resets PostgreSQL's id sequences, records
the restore in the audit log (a ``note`` event), and last renames the staged artifacts into
place (on disk before the COMMIT); a failure before the COMMIT puts back what was there —
into a database that held no table, the restore first makes the schema, and a failure drops
it again (:func:`_unmake_schema`).
Rows' ``artifact_uri`` point into the configured artifact directory afterwards, a version
the backup holds no artifact of (pruned or missing) too: where its artifact would be, so
this store reports it missing. Rows the target database refuses (a string longer than its
column or a NUL in text, which SQLite keeps and PostgreSQL does not) are a
:class:`StoreError` naming the table, row and column; the transaction rolls back.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Row, delete, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from autospec.durable import rename_into_place
from autospec.file_modes import copy_as_created
from autospec.store.artifacts import artifact_sha256, inside, local_path
from autospec.store.backup_format import FORMAT, INDEX, encoder, order, tables, writable
from autospec.store.db import describe, ping, redact, writer_engine
from autospec.store.errors import ArtifactError, Conflict, SchemaOutdated, StoreError
from autospec.store.models import BUILTIN_VERSION, metadata, utcnow
from autospec.store.registry import check_actor
from autospec.store.restore_artifacts import Staged, listed, plan
from autospec.store.restore_rows import check_tables, insert_tables, reset_sequences

log = logging.getLogger(__name__)

_BATCH = 1000

Progress = Callable[[str, int], None]
"""Called with (table or ``artifacts``, how many written/restored) as each one is done."""


@dataclass
class Outcome:
    """What a backup or restore did: rows a table, artifacts copied, where."""

    path: str
    database: str
    revision: str
    tables: dict[str, int] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    missing_artifacts: list[str] = field(default_factory=list)
    replaced: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "database": self.database, "revision": self.revision,
                "tables": self.tables, "rows": sum(self.tables.values()),
                "artifacts": self.artifacts, "missing_artifacts": self.missing_artifacts,
                "replaced": self.replaced}


# -- backup ----------------------------------------------------------------------------------


def backup(engine: Engine, path: str | Path, *, progress: Progress | None = None) -> Outcome:
    """Write the store at ``engine`` (and its artifacts) to the new directory ``path``."""
    from autospec.store.migrate import current_revision, head_revision

    dest = _new_directory(Path(path))
    ping(engine)
    revision, head = current_revision(engine), head_revision()
    if revision != head:
        raise SchemaOutdated(
            f"database {describe(engine.url)} is at revision {revision!r}, this autospec backs "
            f"up revision {head!r}; back it up with the autospec that runs against it, or run "
            f"`autospec db upgrade` first")
    partial = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        (partial / "tables").mkdir(parents=True)
    except OSError as exc:
        raise StoreError(f"cannot write a backup under {dest.parent}: {exc.strerror}") from None
    outcome = Outcome(path=str(dest), database=describe(engine.url), revision=head)
    try:
        conn_engine = engine
        if engine.dialect.name == "postgresql":
            conn_engine = engine.execution_options(isolation_level="REPEATABLE READ")
        with conn_engine.connect() as conn, conn.begin():
            for table in tables():
                encode = encoder(table)
                count = 0
                with (partial / "tables" / f"{table.name}.jsonl").open("w", encoding="utf-8") as fh:
                    rows = conn.execution_options(yield_per=_BATCH).execute(
                        select(table).order_by(*order(table)))
                    for row in rows:
                        fh.write(json.dumps(encode(row), separators=(",", ":")) + "\n")
                        count += 1
                outcome.tables[table.name] = count
                if progress:
                    progress(table.name, count)
            speculators = metadata.tables["speculators"]
            registered = conn.execute(select(speculators.c.version, speculators.c.artifact_uri,
                                             speculators.c.sha256, speculators.c.meta)).all()
        artifacts = _back_up_artifacts(registered, partial, outcome)
        if progress:
            progress("artifacts", len(outcome.artifacts))
        index = {"format": FORMAT, "revision": head, "created_at": utcnow().isoformat(),
                 "source": outcome.database, "dialect": engine.dialect.name,
                 "tables": outcome.tables, "artifacts": artifacts,
                 "missing_artifacts": outcome.missing_artifacts}
        (partial / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        if dest.exists():
            dest.rmdir()
        rename_into_place(partial, dest)  # a backup said to be taken outlasts a power loss
    except OSError as exc:  # a full disk, a copy or the rename refused: nothing is left
        shutil.rmtree(partial, ignore_errors=True)
        raise StoreError(f"cannot back up to {dest}: {_said(exc)}; nothing was written") \
            from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    log.info("backed up %s (%d rows, %d artifacts) to %s", outcome.database,
             sum(outcome.tables.values()), len(outcome.artifacts), dest)
    return outcome


def _said(exc: OSError) -> str:
    """What failed, in one line: copytree's first error (``shutil.Error`` lists them all),
    else the error and the file."""
    failures = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else None
    if isinstance(failures, list) and failures and len(failures[0]) == 3:
        return str(failures[0][2])  # (source, destination, why)
    return f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")


def _new_directory(dest: Path) -> Path:
    """``dest`` if a backup can be renamed into place there (nothing, or an empty directory);
    :class:`Conflict` otherwise."""
    if dest.is_symlink():  # dangling or not: the rename into place cannot replace it
        raise Conflict(f"{dest} already exists (a symbolic link); back up into a new directory")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise Conflict(f"{dest} already exists; back up into a new directory")
    return dest


def _back_up_artifacts(registered: Sequence[Row], partial: Path, outcome: Outcome) -> dict:
    """Copy each registered version's local artifact directory (checked against its
    SHA-256) under ``partial/artifacts``; the index's ``artifacts`` entries. A pruned or
    vanished artifact is listed in ``outcome.missing_artifacts``, a built-in one skipped."""
    artifacts = {}
    for version, uri, sha, meta in registered:
        source = local_path(uri)
        if source is None or uri.startswith("builtin:"):
            continue
        if (meta or {}).get("pruned") or not source.is_dir():
            outcome.missing_artifacts.append(version)
            continue
        if artifact_sha256(source) != sha:
            raise ArtifactError(f"artifact of {version!r} at {source} does not match the "
                                f"SHA-256 the registry records ({sha[:12]}…); not backed up")
        shutil.copytree(source, partial / "artifacts" / version,
                        copy_function=copy_as_created)  # readable as the table files are
        artifacts[version] = {"uri": uri, "sha256": sha, "path": f"artifacts/{version}"}
        outcome.artifacts.append(version)
    return artifacts


# -- restore ---------------------------------------------------------------------------------


def read_index(path: str | Path) -> dict[str, Any]:
    """The checked ``backup.json`` of the backup at ``path``."""
    index_path = Path(path) / INDEX
    if Path(path).is_file():  # a backup is a directory (it read '[Errno 20] Not a directory')
        raise StoreError(f"{path} is a file, not a backup's directory")
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError(f"{path} is not an autospec backup (no {INDEX})") from None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise StoreError(f"cannot read {index_path}: {exc}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise StoreError(f"{index_path}: expected backup format {FORMAT}")
    return index


def contents(engine: Engine) -> dict[str, int]:
    """Rows a table that a fresh store would not hold (the built-in version aside)."""
    with engine.connect() as conn:
        return {table.name: count for table in tables() if (count := _rows(conn, table))}


def restore(engine: Engine, path: str | Path, *, artifact_dir: Path | None = None,
            force: bool = False, actor: str = "cli",
            progress: Progress | None = None) -> Outcome:
    """Replace the store at ``engine`` (and the artifacts) with the backup at ``path``. Every
    check is made and every row read before anything is written; a restore that fails
    leaves the database and the artifact directory as they were."""
    from autospec.settings import get_settings
    from autospec.store.migrate import upgrade as migrate_upgrade

    check_actor(actor)  # the audit log's note names it: before anything changes
    source = Path(path)
    index = read_index(source)
    fresh, found = _checked_target(engine, source, index, force=force)
    artifacts, missing = listed(source, index)
    registered = check_tables(source, index.get("tables"),  # every row read, nothing written
                              {version: entry["sha256"] for version, entry in artifacts.items()})
    missing += [version for version, uri in registered.items()  # in neither list: missing too
                if version not in artifacts and version not in missing
                and not uri.startswith("builtin:")
                and local_path(uri) is not None]  # db backup skips a remote one (s3://)
    root = Path(artifact_dir or get_settings().resolved_artifact_dir)
    staged = Staged(source, root, plan(source, root, artifacts, force=force))
    outcome = Outcome(path=str(source), database=describe(engine.url),
                      revision=index["revision"], artifacts=list(artifacts),
                      missing_artifacts=missing,
                      replaced=found)
    # each version's row names its artifact in this store's directory; one the backup lacks
    # (pruned or missing) too, where it would be: reported missing there, not read elsewhere
    uris = {version: str(inside(root, version))
            for version in [*outcome.missing_artifacts, *artifacts]}
    staged.stage()
    if progress:
        progress("artifacts", len(outcome.artifacts))
    try:
        if fresh:
            migrate_upgrade(engine)
        _replace(engine, source, index, staged, uris, outcome, actor=actor, progress=progress)
    except BaseException as exc:
        try:
            staged.undo(exc)  # what the swap moved goes back; raises if it cannot
            staged.discard(failed=True)
        finally:
            if fresh:  # a database that was empty is left empty, not with a bare schema
                _unmake_schema(engine)
        raise
    staged.discard()  # what the artifacts replaced, set aside until the COMMIT
    log.info("restored %s into %s (%d rows, %d artifacts)", source, outcome.database,
             sum(outcome.tables.values()), len(outcome.artifacts))
    return outcome


#: the table alembic records the schema's revision in (its default name, as migrate.py uses)
_ALEMBIC_TABLE = "alembic_version"


def _unmake_schema(engine: Engine) -> None:
    """After a failed restore into a database that held nothing (no table): drop every table
    there (the restore's migration made them, alembic's version table included), so it is
    empty again. Where one holds rows a fresh store would not (something else wrote there
    meanwhile, or a COMMIT that raised landed after all), or the database cannot be read,
    everything stays, logged: nothing stored is dropped, and the restore's error is raised.
    Only those tables are dropped: one of another name (created there meanwhile by something
    else sharing the database) is not autospec's to drop."""
    where = describe(engine.url)
    ours = {table.name for table in tables()}
    made = {*metadata.tables, _ALEMBIC_TABLE}  # autospec_schema too
    try:
        present = MetaData()
        present.reflect(engine, only=lambda name, _: name in made)
        with engine.connect() as conn:
            held = {name: count for name, table in present.tables.items()
                    if name in ours and (count := _rows(conn, table))}
        if held:
            log.warning("the failed restore leaves the schema in %s: its tables hold rows "
                        "(%s)", where, held)
            return
        present.drop_all(engine)
    except SQLAlchemyError as exc:
        log.warning("the failed restore could not drop the schema it made in %s (%s); a "
                    "restore into it still works", where, redact(str(exc).splitlines()[0]))


def _rows(conn: Any, table: Any) -> int:
    """The rows of ``table`` a fresh store would not hold (the built-in version aside)."""
    query = select(func.count()).select_from(table)
    if table.name == "speculators":
        query = query.where(table.c.version != BUILTIN_VERSION)
    return conn.scalar(query) or 0


def _checked_target(engine: Engine, source: Path, index: dict[str, Any], *,
                    force: bool) -> tuple[bool, dict[str, int]]:
    """(the store at ``engine`` is fresh: no schema, the restore makes it; the rows it holds).
    Refused: a backup or a store at another revision than this code's, a store that holds
    anything unless ``force``."""
    from autospec.store.migrate import _is_empty, check_schema, current_revision, head_revision

    head = head_revision()
    if index.get("revision") != head:
        raise SchemaOutdated(
            f"backup {source} was taken at migration revision {index.get('revision')!r}, this "
            f"autospec expects {head!r}: restore it with the autospec that took it, then run "
            f"`autospec db upgrade`")
    ping(engine)
    where = describe(engine.url)
    if current_revision(engine) is None and _is_empty(engine):
        return True, {}
    check_schema(engine)  # at head (or names what to do)
    if current_revision(engine) != head:
        raise SchemaOutdated(f"database {where} is not at revision {head!r}; restore into "
                             f"a store this autospec migrated (`autospec db upgrade`)")
    found = contents(engine)
    if found and not force:
        listed = ", ".join(f"{name}: {count}" for name, count in found.items())
        raise Conflict(f"database {where} is not empty ({listed}); pass --force to "
                       f"replace its contents with the backup")
    return False, found


def _replace(engine: Engine, source: Path, index: dict[str, Any], staged: Staged,
             uris: dict[str, str], outcome: Outcome, *, actor: str,
             progress: Progress | None) -> None:
    """One transaction: every table's rows replaced by the backup's, PostgreSQL's sequences
    reset, the restore's note, and last the artifacts swapped in (on disk before the rows
    naming them commit). A COMMIT that raises may have landed all the same (the connection
    lost while its answer was on the way): a fresh connection looks for the note."""
    restore_id = uuid.uuid4().hex
    committing = False
    try:
        with writer_engine(engine).begin() as conn:
            for table in reversed(tables()):
                conn.execute(delete(table))
            outcome.tables = insert_tables(conn, source, index.get("tables"), uris, progress)
            if conn.dialect.name == "postgresql":
                reset_sequences(conn, tables())
            _record(conn, actor=actor, source=source, index=index, outcome=outcome,
                    restore_id=restore_id)
            staged.swap()
            committing = True
    except Exception as exc:
        if not committing:
            raise
        landed = _landed(engine, restore_id)
        if landed:
            log.warning("the restore's COMMIT raised (%s), but it landed", exc)
            return
        if landed is None:
            said = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
            raise StoreError(
                f"the restore's COMMIT failed ({redact(said)}) and whether it landed could "
                f"not be checked; the artifact directory is put back as it was: if `autospec "
                f"history` shows this restore, run it again with --force to put its "
                f"artifacts in place") from exc
        raise


def _landed(engine: Engine, restore_id: str) -> bool | None:
    """Whether the restore whose note carries ``restore_id`` is in the store (None: the
    store cannot be read)."""
    events = metadata.tables["events"]
    try:
        with engine.connect() as conn:
            notes = conn.execute(select(events.c.details).where(events.c.kind == "note")
                                 .order_by(events.c.id.desc()).limit(50)).scalars().all()
    except SQLAlchemyError:
        return None
    return any(isinstance(d, dict) and d.get("restore_id") == restore_id for d in notes)


def _record(conn: Any, *, actor: str, source: Path, index: dict[str, Any], outcome: Outcome,
            restore_id: str) -> None:
    events = metadata.tables["events"]
    conn.execute(insert(writable(events)).values(
        created_at=utcnow(), kind="note", actor=actor,
        reason=f"store restored from backup {source} (taken {index.get('created_at')} from "
               f"{redact(str(index.get('source')))})",  # older backups kept a ?password= there
        details={"type": "restore", "backup": str(source), "revision": outcome.revision,
                 "rows": sum(outcome.tables.values()), "artifacts": len(outcome.artifacts),
                 "replaced": outcome.replaced, "restore_id": restore_id}))
