"""The policy's ``serving.k_bands`` reach the deployment: the controller writes them to the
deployment's row (audited once per change) at every cycle and watch; replicas read them with
the live pointer (tests/serve/test_load_served.py, test_vllm_server.py)."""

from __future__ import annotations

import pytest

from autospec import store
from autospec.controller.cycle import Controller
from autospec.controller.policy import PolicyError, parse_policy
from autospec.controller.watch import Watcher

from .helpers import fast_policy


def _deployment(db, tiny) -> None:  # type: ignore[no-untyped-def]
    with store.session_scope(db) as session:
        store.record_deployment(session, name="default", target="tiny",
                                target_id=tiny.info.target_id, target_revision="r",
                                dtype="float32", actor="replica")


def _bands(db) -> str | None:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        row = store.get_deployment(session, name="default")
        return row.k_bands if row else None


def _notes(db) -> list[dict]:  # type: ignore[no-untyped-def]
    with store.session_scope(db, readonly=True) as session:
        return [e.details for e in store.list_events(session, kinds=["note"])
                if e.details.get("type") == "k_bands"]


def test_the_controller_hands_the_policys_bands_to_the_replicas(db, tiny) -> None:  # type: ignore[no-untyped-def]
    policy = fast_policy(serving={"k_bands": "1-3: 5, 4-:0"})
    controller = Controller(db, policy, tiny)
    assert not controller.apply_serving()  # no replica recorded the deployment yet
    _deployment(db, tiny)
    assert Watcher(controller).run() is not None  # the watch applies them too
    assert _bands(db) == "1-3:5,4-:0"
    assert not controller.apply_serving()  # unchanged: nothing written, nothing audited
    assert _notes(db) == [{"type": "k_bands", "from": None, "to": "1-3:5,4-:0"}]
    Controller(db, fast_policy(), tiny).run_cycle()  # a policy without bands clears them
    assert _bands(db) is None
    assert [n["to"] for n in _notes(db)] == [None, "1-3:5,4-:0"]  # newest first
    _deployment(db, tiny)  # a replica restarting does not touch them
    assert _bands(db) is None


def test_bad_bands_in_a_policy_are_an_error_naming_them() -> None:
    with pytest.raises(PolicyError, match=r"serving\.k_bands"):
        parse_policy("serving:\n  k_bands: '2-:3'\n", source="p.yaml")
