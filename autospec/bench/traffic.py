"""The traffic ``autospec bench train`` trains on: one domain's prompts answered greedily by
the target, logged through the store's :class:`~autospec.store.TrafficWriter` into a SQLite
database cached under ``<cache dir>/bench-traffic/`` (keyed by target revision, dtype,
domain, count, length and seed), so reruns skip this step. Prompts are answered in
left-padded batches with Hugging Face ``generate`` (greedy, the target's own numerics): ~2×
the throughput of one-at-a-time decoding on two cores. Every row is what the target said.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import torch

from autospec.engine.target import Target
from autospec.settings import get_settings

log = logging.getLogger(__name__)


def traffic_db_path(target: Target, domain: str, requests: int, max_new: int,
                    seed: int) -> Path:
    """Where the cached traffic database of these settings lives."""
    key = f"{target.info.target_id}:{target.info.revision}:{target.dtype}:{domain}:" \
          f"{requests}:{max_new}:{seed}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return get_settings().cache_dir / "bench-traffic" / f"{domain}-{requests}-{digest}.db"


@torch.inference_mode()
def generate_traffic(target: Target, url: str, *, domain: str, requests: int, max_new: int,
                     seed: int = 0, batch_size: int = 16) -> int:
    """Answer ``requests`` prompts of ``domain`` greedily and log them at ``url``; rows."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.text import Text

    from autospec.store import TrafficWriter, open_store
    from autospec.workloads import domain_prompts

    tok = target.tokenizer
    chats = domain_prompts(domain, requests, seed)
    prompts = [target.encode_chat(m) for m in chats]
    eos = set(target.info.eos_token_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.info.eos_token_ids[0]
    engine = open_store(url, upgrade=True)
    written, tokens, began = 0, 0, time.perf_counter()
    console = Console(stderr=True)
    with TrafficWriter(engine) as writer, Progress(console=console) as progress:
        task = progress.add_task(f"logging {domain} traffic", total=requests)
        for start in range(0, requests, batch_size):
            batch = prompts[start : start + batch_size]
            started = time.perf_counter()
            outputs = _greedy_batch(target, batch, max_new, pad)
            ms = (time.perf_counter() - started) * 1000 / len(batch)
            for chat, ids, out in zip(chats[start:], batch, outputs, strict=False):
                out = _cut_at_eos(out, eos)
                writer.record(prompt_text=chat[-1]["content"], prompt_ids=ids,
                              output_ids=out, output_text=target.decode(out), segment=domain,
                              temperature=0.0, latency_ms=ms,
                              finish_reason="stop" if out and out[-1] in eos else "length")
                written, tokens = written + 1, tokens + len(out)
            progress.advance(task, len(batch))
            if not console.is_terminal:  # a log file gets a line per batch instead of a bar
                rate = tokens / (time.perf_counter() - began)
                console.print(Text(f"  {written}/{requests} {domain} requests logged "
                                   f"({rate:.0f} tokens/s)"))
        writer.flush()
    engine.dispose()
    return written


def _greedy_batch(target: Target, prompts: list[list[int]], max_new: int,
                  pad: int) -> list[list[int]]:
    """Greedy continuations of left-padded ``prompts`` (each up to ``max_new`` tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    out = target.model.generate(input_ids=ids.to(target.device),
                                attention_mask=mask.to(target.device),
                                max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
    return [row[width:].tolist() for row in out]


def _cut_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[: i + 1]
    return ids


def ensure_traffic(target: Target, *, domain: str, requests: int, max_new: int,
                   seed: int = 0) -> str:
    """The URL of a cached traffic database with these settings (generated once)."""
    path = traffic_db_path(target, domain, requests, max_new, seed)
    url = f"sqlite:///{path}"
    if path.exists():
        log.info("using cached traffic %s", path)
        return url
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial.db")
    for stale in path.parent.glob(tmp.name + "*"):
        stale.unlink()
    started = time.perf_counter()
    generate_traffic(target, f"sqlite:///{tmp}", domain=domain, requests=requests,
                     max_new=max_new, seed=seed)
    tmp.rename(path)
    log.info("logged %d requests in %.0fs into %s", requests, time.perf_counter() - started,
             path)
    return url
