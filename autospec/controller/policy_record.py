"""The policy in force: what a controller runs with, recorded in the store for ``status``.

A controller (``controller run|once|watch``) records the YAML of its policy as a ``policy``
audit event of its deployment when it starts, unless the newest one recorded is the same
text. ``autospec status`` without ``--policy`` reads that newest record, so an operator sees
the thresholds the running controller applies, not the shipped default; before any
controller has run it falls back to the shipped ``default`` and says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from autospec import store
from autospec.controller.policy import Policy, load_policy, parse_policy


@dataclass(frozen=True)
class PolicyInForce:
    """A policy and where it was read: ``recorded`` (by a controller, with when and who),
    ``given`` (``--policy``) or ``shipped-default`` (nothing recorded yet)."""

    policy: Policy
    origin: str
    source: str
    recorded_at: datetime | None = None
    recorded_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.policy.name, "origin": self.origin, "source": self.source,
                "recorded_at": self.recorded_at, "recorded_by": self.recorded_by}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_policy(engine: Engine, *, policy: Policy, text: str, source: str,
                  actor: str) -> bool:
    """Record ``text`` as ``policy.deployment``'s policy in force; False when the newest
    record already holds the same text (nothing written)."""
    sha = digest(text)
    with store.session_scope(engine) as session:
        newest = _newest(session, policy.deployment)
        if newest is not None and (newest.details or {}).get("sha256") == sha:
            return False
        store.record_event(session, kind="policy", actor=actor, deployment=policy.deployment,
                           reason=f"controller runs policy {policy.name!r} from {source}",
                           details={"name": policy.name, "source": source, "sha256": sha,
                                    "text": text})
    return True


def policy_in_force(engine: Engine | None, *, deployment: str,
                    given: str | None = None) -> PolicyInForce:
    """``given`` (a shipped name or a path) when set (``engine`` is not read); else the
    newest policy a controller of ``deployment`` recorded; else the shipped default."""
    if given is not None:
        return PolicyInForce(load_policy(given), "given", given)
    assert engine is not None, "the store is read unless a policy is given"
    with store.session_scope(engine, readonly=True) as session:
        newest = _newest(session, deployment)
        if newest is not None:
            details = newest.details or {}
            source = str(details.get("source", "?"))
            return PolicyInForce(
                parse_policy(str(details.get("text", "")), source=f"recorded policy ({source})"),
                "recorded", source, newest.created_at, newest.actor)
    return PolicyInForce(load_policy("default"), "shipped-default", "policies/default.yaml")


def _newest(session, deployment: str):  # type: ignore[no-untyped-def]
    events = store.list_events(session, kinds=["policy"], deployment=deployment, limit=1)
    return events[0] if events else None
