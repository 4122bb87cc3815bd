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

Every domain's prompt space is cut in two disjoint halves by a hash of the user turn
(:func:`part_of`): ``traffic`` (the default: what the demo, the load generator and the
benchmarks send as logged or held-out traffic) and ``synthetic`` (what ``autospec synth``
and ``autospec pretrain`` ask the target). Whatever the seeds, no synthetic prompt recurs
verbatim among traffic prompts, so a head trained on synthetic data is never measured on
prompts it was trained on.
"""

from __future__ import annotations

import hashlib
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


#: the two disjoint halves of every domain's prompt space
TRAFFIC = "traffic"
SYNTHETIC = "synthetic"
PARTS = (TRAFFIC, SYNTHETIC)


class UnknownDomain(ValueError):
    """A domain not in :data:`DOMAINS`; the message lists the known ones."""


def part_of(messages: Messages) -> str:
    """The half of the prompt space a request belongs to, from a hash of its user turn."""
    digest = hashlib.sha256(messages[-1]["content"].encode()).digest()
    return SYNTHETIC if digest[0] & 1 else TRAFFIC


def domain_prompts(name: str, n: int, seed: int = 0, part: str = TRAFFIC) -> list[Messages]:
    """``n`` chat requests of domain ``name`` from the ``part`` half of its prompt space,
    reproducible from ``seed``; no exact repeats."""
    try:
        build = DOMAINS[name]
    except KeyError:
        raise UnknownDomain(
            f"unknown domain {name!r}; known domains: {', '.join(sorted(DOMAINS))}"
        ) from None
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    rng = random.Random(f"{name}:{seed}")
    seen: set[str] = set()
    prompts: list[Messages] = []
    tries = 0
    while len(prompts) < n:
        messages = build(rng)
        if part_of(messages) != part:
            continue
        key = messages[-1]["content"]  # the user turn: no two requests ask the same
        tries += 1
        if key in seen and tries < 50 * n:  # the space is large; a repeat is rare
            continue
        seen.add(key)
        prompts.append(messages)
    return prompts


__all__ = ["DOMAINS", "PARTS", "SYNTHETIC", "TRAFFIC", "Messages", "UnknownDomain",
           "domain_prompts", "part_of"]
