"""Helpers for controller tests: a tiny target's own traffic, a fast test policy, a clock.

Traffic: a few distinct random prompts, each sent several times, answered greedily by the
tiny target (so logged outputs are the target's, as in production). Repeated prompts are
what a suffix speculator learns from, so a suffix candidate beats the built-in n-gram one
on the held-out part and the gate passes.
"""

from __future__ import annotations

import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import torch

from autospec import store
from autospec.controller.policy import Policy, parse_policy
from autospec.engine.target import Target

T0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=2)

TEST_POLICY = textwrap.dedent("""\
    name: test
    schedule: {interval: 1h, watch_interval: 1s}
    window: {min_fresh_requests: 20, max_requests: 200, heldout_fraction: 0.3}
    training: {kinds: [suffix], min_train_requests: 5}
    evaluation: {k: 4}
    gate: {min_heldout: 5, min_gain: 0.05, min_segment_requests: 1000}
    canary: {requests: 10, max_shortfall: 0.2}
    drift: {window: 1h, min_requests: 10, max_drop: 0.3, min_fresh_requests: 5, cooldown: 1h}
    lease: {ttl: 4s}
    """)


def fast_policy(**sections: dict[str, Any]) -> Policy:
    base = parse_policy(TEST_POLICY, source="test.yaml").model_dump()
    for name, values in sections.items():
        base[name] = {**base[name], **values}
    return Policy.model_validate(base)


def write_policy(path: Path, text: str = TEST_POLICY) -> Path:
    path.write_text(text)
    return path


@torch.inference_mode()
def greedy_traffic(target: Target, *, prompts: int = 4, repeats: int = 10, seed: int = 0,
                   prompt_len: int = 6, output_len: int = 20) -> list[tuple[list[int], list[int]]]:
    """``prompts × repeats`` (prompt, greedy output) pairs, interleaved."""
    gen = torch.Generator().manual_seed(seed)
    vocab = target.info.vocab_size - 1
    base = torch.randint(2, vocab, (prompts, prompt_len), generator=gen)
    out = target.model.generate(base, attention_mask=torch.ones_like(base),
                                max_new_tokens=output_len, min_new_tokens=output_len,
                                do_sample=False, pad_token_id=0)
    pairs = [(p.tolist(), o[prompt_len:].tolist()) for p, o in zip(base, out, strict=True)]
    return [pairs[i % prompts] for i in range(prompts * repeats)]


def log_traffic(engine: Any, pairs: list[tuple[list[int], list[int]]], *,
                start: datetime = T0, version: str | None = None,
                deployment: str = "default") -> None:
    records = [store.RequestRecord(prompt_ids=p, output_ids=o, speculator_version=version,
                                   created_at=start + timedelta(seconds=i),
                                   deployment=deployment)
               for i, (p, o) in enumerate(pairs)]
    store.write_requests(engine, records)


def live_requests(engine: Any, version: str, *, n: int, tau: float,
                  start: datetime | None = None, banded: bool = False, k: int = 4) -> None:
    """``n`` statistics-only requests served by ``version`` with acceptance length ``tau``
    at ``k`` (the test policy's; ``banded``: drafted with fewer tokens than its k by a
    concurrency band, as a replica records it)."""
    start = start or datetime.now(timezone.utc)
    steps = 10
    accepted = round((tau - 1) * steps)
    sampling = {"k": 0, "banded": True} if banded else {"k": k}
    records = [store.RequestRecord(speculator_version=version, num_drafts=steps,
                                   num_draft_tokens=steps * 4, num_accepted_tokens=accepted,
                                   opted_out=True, created_at=start + timedelta(milliseconds=i),
                                   sampling=sampling)
               for i in range(n)]
    store.write_requests(engine, records)


def segment_requests(engine: Any, version: str, segment: str, *, n: int, tau: float,
                     banded: bool = False, output_tokens: int | None = None,
                     tokens_per_s: float = 100.0) -> None:
    """``n`` statistics-only requests of ``segment`` served by ``version`` at acceptance
    ``tau``, 10 verify steps each (``banded``: a concurrency band drafted fewer tokens for
    them; ``output_tokens``: timed, decoded at ``tokens_per_s`` after a 50 ms TTFT)."""
    start = datetime.now(timezone.utc)
    steps = 10
    timed = {} if output_tokens is None else {
        "output_tokens": output_tokens, "ttft_ms": 50.0,
        "latency_ms": 50.0 + (output_tokens - 1) / tokens_per_s * 1e3}
    store.write_requests(engine, [store.RequestRecord(
        speculator_version=version, segment=segment, num_drafts=steps,
        num_draft_tokens=steps * 4, num_accepted_tokens=round((tau - 1) * steps),
        opted_out=True, sampling={"banded": True} if banded else None,
        created_at=start + timedelta(milliseconds=i), **timed) for i in range(n)])


def no_model() -> Target:
    """A controller's target loader for watches that must not load one."""
    import pytest

    pytest.fail("the watch loaded the target: no cycle here has fresh traffic to train on")


def pinned_elsewhere(engine: Any, tmp_path: Path) -> None:
    """Deployment promoted to ``b`` (shadow τ 2.8 over json τ 4.0 and chat τ 1.6, 20
    held-out requests each) while json's own pointer names ``s``: b drafts chat alone."""
    from tests.store.test_registry import register

    with store.session_scope(engine) as s:
        for v in ("inc", "b", "s"):
            register(s, tmp_path, v)
        store.set_live(s, version="inc", actor="t", reason="deployment")
        store.set_live(s, version="s", actor="op", reason="pin json", segment="json")
        ev = store.record_evaluation(s, candidate="b", incumbent="inc", decision="promote",
                                     tau_candidate=2.8, tau_incumbent=2.0, per_segment={
                                         "segments": {
                                             "json": {"num_requests": 20, "tau": {"b": 4.0}},
                                             "chat": {"num_requests": 20, "tau": {"b": 1.6}}}})
        s.flush()
        store.set_live(s, version="b", actor="controller", reason="cycle",
                       details={"shadow_tau": 2.8, "evaluation_id": ev.id})


def events(engine: Any, *kinds: str) -> list[Any]:
    with store.session_scope(engine, readonly=True) as session:
        return store.list_events(session, kinds=list(kinds) or None, limit=1000)


def live_version(engine: Any) -> str | None:
    with store.session_scope(engine, readonly=True) as session:
        pointer = store.get_live(session)
        return pointer.version if pointer else None


def make_tokenizer_model_dir(out: Path, *, seed: int = 0) -> Path:
    """A 2-layer, 32-wide random-init Llama with SmolLM2's vocabulary and tokenizer files.

    Unlike the serving tests' tiny model its embeddings are untied: the tied one answers
    every prompt with one repeated token, on which every speculator is perfect and no
    candidate can beat the incumbent. The soak's writer with 512 positions.
    """
    from autospec.bench.soak.target import write_tiny_target
    from autospec.engine.target import _resolve

    return write_tiny_target(out, seed=seed, tied=False, max_positions=512,
                             tokenizer_dir=_resolve("smollm2-135m")[0])
