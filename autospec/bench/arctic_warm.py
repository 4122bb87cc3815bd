"""``--vllm-suffix-warm N``: vLLM's own ``suffix`` method shown the traffic autospec learnt from.

vLLM's suffix method (Arctic Inference) drafts from a cache of the responses its engine has
served. autospec's suffix version drafts from an index of the store's logged traffic. For a
like-for-like comparison the bench first has the ``vllm/arctic`` application answer the
store's newest ``N`` logged requests (their prompt token ids, greedy, as many tokens as the
logged answer), so its cache holds the same answers the live version was built from, before
any measured request.
"""

from __future__ import annotations

from typing import Any

import requests

from autospec import store
from autospec.bench.progress import BenchProgress
from autospec.bench.serve import _batch


def warm_bodies(database_url: str, n: int) -> list[dict[str, Any]]:
    """Completion bodies of the store's newest ``n`` usable logged requests, oldest first."""
    engine = store.open_store(database_url)
    try:
        with store.session_scope(engine) as session:
            window = store.traffic_window(session, limit=n, heldout_fraction=0.0)
    finally:
        engine.dispose()
    return [{"prompt": ex.prompt_ids, "max_tokens": len(ex.output_ids), "temperature": 0}
            for ex in window.train if ex.output_ids]


def _complete(session: requests.Session, url: str, body: dict[str, Any]) -> int:
    r = session.post(f"{url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def warm(url: str, bodies: list[dict[str, Any]], progress: BenchProgress,
         clients: int = 8) -> dict[str, Any]:
    """Have the application at ``url`` answer ``bodies``; what was sent."""
    with progress.stage(f"showing vLLM's suffix method the store's {len(bodies)} logged "
                        f"requests ({clients} clients)"):
        tokens, took = _batch(url, bodies, clients, _complete)
        progress.done(f"vllm/arctic answered {len(tokens)} logged requests, {sum(tokens)} "
                      f"tokens in {took:.0f} s")
    return {"requests": len(tokens), "tokens": sum(tokens)}
