"""Helpers for serving tests: a tiny random-init target *with* the default target's tokenizer,
speculator artifacts registered in a store, and an in-process server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autospec import store
from autospec.bench.soak.target import write_tiny_target
from autospec.engine.target import Target, _resolve
from autospec.serve.config import ServeConfig
from autospec.serve.server import LLMServer
from autospec.serve.versions import VersionManager
from autospec.speculators.checkpoint import save_speculator
from autospec.speculators.registry import new_speculator


def make_tiny_model_dir(out: Path, *, layers: int = 2, seed: int = 0) -> Path:
    """A 2-layer, 32-wide random-init Llama with SmolLM2's vocabulary and tokenizer files
    (tied embeddings, 512 positions): the soak's writer with the serving tests' settings."""
    return write_tiny_target(out, seed=seed, layers=layers, tied=True, max_positions=512,
                             tokenizer_dir=_resolve("smollm2-135m")[0])


def register_artifact(engine: Any, target: Target, root: Path, version: str,
                      kind: str = "ngram", **overrides: Any) -> Path:
    """Save a fresh ``kind`` speculator for ``target`` under ``root/version`` and register it."""
    directory = root / version
    sha = save_speculator(new_speculator(kind, target, **overrides), directory)
    with store.session_scope(engine) as session:
        store.register_speculator(session, version=version, kind=kind,
                                  target_id=target.info.target_id,
                                  target_revision=target.info.revision,
                                  artifact_uri=str(directory), sha256=sha)
    return directory


def promote(engine: Any, version: str, deployment: str = "default") -> None:
    with store.session_scope(engine) as session:
        store.set_live(session, version=version, actor="test", reason="test",
                       deployment=deployment)


def make_server(target: Target, db: Any, **config: Any) -> LLMServer:
    """An in-process server on ``target`` and store ``db`` (None: no store at all)."""
    cfg = ServeConfig(target=target.info.target_id, model_name="tiny", **config)
    versions = VersionManager(target=target, db=db, deployment=cfg.deployment,
                              k=cfg.speculator_k, speculation=cfg.speculation == "live",
                              poll_interval_s=cfg.poll_interval_s, actor="test-replica",
                              bands=cfg.bands)
    writer = store.TrafficWriter(db, flush_interval_s=0.01) \
        if db is not None and cfg.log_traffic else None
    server = LLMServer(target, versions, config=cfg, writer=writer)
    server.start()
    return server


def wait_for_rows(db: Any, n: int, *, timeout_s: float = 10.0, poll_s: float = 0.05) -> list[Any]:
    """The traffic rows once at least ``n`` are written (the writer is asynchronous), or
    those there are after ``timeout_s``."""
    import time

    from sqlalchemy import select

    from autospec.store.models import Request

    deadline = time.monotonic() + timeout_s
    while True:
        with store.session_scope(db, readonly=True) as session:
            rows = list(session.scalars(select(Request).order_by(Request.id)))
            session.expunge_all()
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(poll_s)


def slowed_forwards(target: Target, monkeypatch: Any, step_s: float) -> list[float]:
    """Make each of ``target``'s forwards take at least ``step_s``; the list returned gets
    each forward's start time (``time.monotonic``)."""
    forwards: list[float] = []
    real = target.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        forwards.append(time.monotonic())
        time.sleep(step_s)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, "forward", forward)
    return forwards
