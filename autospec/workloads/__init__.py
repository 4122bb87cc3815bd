"""Domain prompt sets: varied chat requests of one kind of traffic, built from varied parts.

``domain_prompts(name, n, seed)`` returns ``n`` chat requests (each a list of
``{"role", "content"}`` messages: a system message naming the deployment's role, then
the user's message) for one domain of :data:`DOMAINS`. Every prompt is assembled from
independently drawn parts (who asks, about what, with which details, asking for which
kind of answer, in which tone), so prompts of one domain share vocabulary and style the
way real traffic of one product does, without being copies of one template.

The same ``(name, n, seed)`` gives the same prompts; a different seed gives another
draw from the same distribution (use one seed for training traffic and another for a
held-out or load-generation set). This module knows nothing of models or tokenizers.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from autospec.workloads import coding, extraction, support

Messages = list[dict[str, str]]

#: domain name -> builder of one request from a random source
DOMAINS: dict[str, Callable[[random.Random], Messages]] = {
    "support": support.build,
    "coding": coding.build,
    "json": extraction.build,
}


class UnknownDomain(ValueError):
    """A domain not in :data:`DOMAINS`; the message lists the known ones."""


def domain_prompts(name: str, n: int, seed: int = 0) -> list[Messages]:
    """``n`` chat requests of domain ``name``, reproducible from ``seed``; no exact repeats."""
    try:
        build = DOMAINS[name]
    except KeyError:
        raise UnknownDomain(
            f"unknown domain {name!r}; known domains: {', '.join(sorted(DOMAINS))}"
        ) from None
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"{name}:{seed}")
    seen: set[str] = set()
    prompts: list[Messages] = []
    tries = 0
    while len(prompts) < n:
        messages = build(rng)
        key = messages[-1]["content"]  # the user turn: no two requests ask the same
        tries += 1
        if key in seen and tries < 50 * n:  # the space is large; a repeat is rare
            continue
        seen.add(key)
        prompts.append(messages)
    return prompts


__all__ = ["DOMAINS", "Messages", "UnknownDomain", "domain_prompts"]
