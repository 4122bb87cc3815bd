"""``base_version`` finds the newest usable base of a kind for the target however many
other versions of that kind came after it (it read only the newest 1000: a deployment that
trains a non-live kind every cycle outgrows that, and training then started from scratch
without saying so). Real SQLite and PostgreSQL; a tiny random-init target's info."""

from __future__ import annotations

from datetime import timedelta

from autospec import store
from autospec.store.models import Speculator, utcnow
from autospec.train.run import base_version


def _row(i: int, tiny, **kw) -> Speculator:  # type: ignore[no-untyped-def]
    fields = dict(version=f"eagle3-{i:05d}", kind="eagle3", target_id=tiny.info.target_id,
                  target_revision=None, artifact_uri=f"/a/{i}", sha256="0" * 64,
                  created_at=utcnow() + timedelta(seconds=i), state="candidate", meta={})
    return Speculator(**{**fields, **kw})


def test_the_base_is_found_behind_more_than_a_thousand_newer_versions(engine, tiny) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(engine) as session:
        session.add(_row(0, tiny, meta={"base": True}))  # the base, oldest
        session.add(_row(1, tiny, meta={"base": True}, state="rejected"))  # not usable
        session.add(_row(2, tiny, meta={"base": True}, target_id="another-target"))
        session.add_all(_row(i, tiny, meta={"base": False} if i % 2 else None)
                        for i in range(3, 1104))
    with store.session_scope(engine, readonly=True) as session:
        assert base_version(session, "eagle3", tiny) == "eagle3-00000"
        assert base_version(session, "draft", tiny) is None
