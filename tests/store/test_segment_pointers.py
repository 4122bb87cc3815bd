"""Per-segment live pointers: moved, rolled back and audited like the deployment's, kept by a
prune, and a segment without one follows the deployment."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from autospec import store
from autospec.store import prune
from autospec.store.errors import Conflict, NotFound, StoreError
from autospec.store.models import Event, Speculator
from tests.store.test_registry import register


def _state(session, version: str) -> str:  # type: ignore[no-untyped-def]
    return session.scalar(select(Speculator.state).where(Speculator.version == version))


def test_a_segment_pointer_moves_alone(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("a", "b", "c"):
            register(s, tmp_path, v)
        store.set_live(s, version="a", actor="t", reason="deployment")
        pointer = store.set_live(s, version="b", actor="op", reason="json does better",
                                 segment="json")
        assert (pointer.segment, pointer.version, pointer.generation) == ("json", "b", 1)
    with store.session_scope(engine) as s:
        assert store.get_live(s).version == "a"
        assert store.serving_version(s, segment="json") == "b"
        assert store.serving_version(s, segment="support") == "a"  # follows the deployment
        assert store.serving_version(s) == "a"
        assert [p.segment for p in store.list_segment_pointers(s)] == ["json"]
        assert (_state(s, "a"), _state(s, "b")) == ("live", "live")
        event = s.scalars(select(Event).where(Event.kind == "promotion")
                          .order_by(Event.id.desc())).first()
        assert (event.version, event.details) == ("b", {"segment": "json"})
        store.set_live(s, version="c", actor="op", reason="again", segment="json")
    with store.session_scope(engine) as s:
        pointer = store.rollback(s, actor="op", reason="worse", segment="json")
        assert (pointer.version, pointer.previous_version, pointer.generation) == ("b", "c", 3)
        assert _state(s, "c") == "rolled_back"
        assert store.get_live(s).version == "a"  # the deployment's pointer never moved


def test_a_version_live_somewhere_stays_live(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("a", "b"):
            register(s, tmp_path, v)
        store.set_live(s, version="a", actor="t", reason="x")
        store.set_live(s, version="a", actor="t", reason="x", segment="json")
        store.set_live(s, version="b", actor="t", reason="x")  # a still drafts json
        assert _state(s, "a") == "live"
        store.set_live(s, version="b", actor="t", reason="x", segment="json")
        assert _state(s, "a") == "retired"


def test_segment_pointer_errors(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        register(s, tmp_path, "a")
        with pytest.raises(NotFound, match="segment 'json' of deployment 'default'"):
            store.rollback(s, actor="t", reason="x", segment="json")
        store.set_live(s, version="a", actor="t", reason="x", segment="json")
        with pytest.raises(Conflict, match="no previous version"):
            store.rollback(s, actor="t", reason="x", segment="json")
        with pytest.raises(Conflict, match="already live for segment 'json'"):
            store.set_live(s, version="a", actor="t", reason="x", segment="json")
        with pytest.raises(StoreError, match="invalid segment"):
            store.set_live(s, version="a", actor="t", reason="x", segment="no spaces")


def test_prune_keeps_segment_versions(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as s:
        for v in ("a", "b", "c"):
            register(s, tmp_path, v)
        store.set_live(s, version="a", actor="t", reason="x")
        store.set_live(s, version="b", actor="t", reason="x", segment="json")
        store.set_live(s, version="c", actor="t", reason="x", segment="json")
        plan = prune.plan(s, keep=0, artifact_dir=tmp_path)
    assert any("segment json" in why for why in plan.kept["c"])
    assert any("previous of segment json" in why for why in plan.kept["b"])
