"""Fixtures for training tests: a tiny random-init target and a store holding its traffic.

The traffic is the tiny target's own greedy continuations of random prompts (so the
logged outputs are what the target says, as in production), written through the
store's synchronous ``write_requests`` with increasing timestamps.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import torch

from autospec import store
from autospec.engine.target import Target

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


@torch.inference_mode()
def greedy_traffic(target: Target, n: int, *, seed: int = 0, prompt_len: int = 8,
                   output_len: int = 24) -> list[tuple[list[int], list[int]]]:
    """``n`` (prompt, greedy output) pairs of ``target`` for random prompts."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, target.info.vocab_size - 1, (n, prompt_len), generator=gen)
    out = target.model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                max_new_tokens=output_len, min_new_tokens=output_len,
                                do_sample=False, pad_token_id=0)
    return [(p.tolist(), o[prompt_len:].tolist()) for p, o in zip(prompts, out, strict=True)]


def log_traffic(engine, pairs: list[tuple[list[int], list[int]]], *, start: datetime = T0,
                opted_out: bool = False, segment: str = "default") -> None:
    records = [store.RequestRecord(prompt_ids=p, output_ids=o, opted_out=opted_out,
                                   segment=segment, created_at=start + timedelta(seconds=i))
               for i, (p, o) in enumerate(pairs)]
    store.write_requests(engine, records)


@pytest.fixture(scope="session")
def traffic(tiny) -> list[tuple[list[int], list[int]]]:
    return greedy_traffic(tiny, 60)


@pytest.fixture
def db(sqlite_url: str):
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()


@pytest.fixture
def db_with_traffic(db, traffic):
    log_traffic(db, traffic)
    return db
