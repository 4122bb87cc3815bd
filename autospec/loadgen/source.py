"""Where prompts come from: domain prompt sets or a user's JSONL replay file.

A :class:`Prompt` is one request body's content — chat ``messages`` or a completion
``prompt`` — plus the segment label sent as ``x-autospec-segment``.

- :class:`DomainSource` draws from :func:`autospec.workloads.domain_prompts`: each domain
  has its own reproducible pool (``seed``), consumed in order and refilled with a larger
  draw when it runs out, so a long run does not repeat prompts early.
- :class:`ReplaySource` reads a JSONL file: each line is a JSON string (a prompt), or an
  object with ``messages`` (chat) or ``prompt`` (completion), and optionally ``segment``,
  ``max_tokens`` and ``temperature``. Lines are served in file order, cycling when the run
  asks for more requests than the file holds.

This module knows nothing of HTTP.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autospec.text_file import TextFileError, read_text_file
from autospec.workloads import DOMAINS, domain_prompts

#: names accepted for a domain besides :data:`autospec.workloads.DOMAINS`' keys
ALIASES = {"extraction": "json"}


class SourceError(ValueError):
    """A replay file or a domain name that cannot be used; the message says where."""


@dataclass(frozen=True)
class Prompt:
    segment: str
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # max_tokens / temperature


def known_domains() -> list[str]:
    return sorted(set(DOMAINS) | set(ALIASES))


def canonical(domain: str) -> str:
    name = ALIASES.get(domain, domain)
    if name not in DOMAINS:
        raise SourceError(f"unknown domain {domain!r}; known: {', '.join(known_domains())}")
    return name


class DomainSource:
    """Prompts of named domains, each a reproducible, lazily grown pool."""

    def __init__(self, seed: int = 0, pool: int = 64) -> None:
        self.seed, self.pool = seed, pool
        self._pools: dict[str, list[list[dict[str, str]]]] = {}
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, domain: str) -> Prompt:
        """The domain's next prompt (thread-safe); the segment is the domain name given."""
        name = canonical(domain)
        with self._lock:
            i = self._next.get(name, 0)
            pool = self._pools.get(name, [])
            if i >= len(pool):
                pool = domain_prompts(name, max(self.pool, 2 * len(pool)), self.seed)
                self._pools[name] = pool
            self._next[name] = i + 1
        return Prompt(segment=domain, messages=pool[i])


class ReplaySource:
    """Prompts read from a JSONL file, in order, cycling."""

    def __init__(self, path: Path, default_segment: str = "replay") -> None:
        self.path = Path(path)
        self.items = load_replay(self.path, default_segment)
        self._i = 0
        self._lock = threading.Lock()

    def next(self, domain: str | None = None) -> Prompt:
        with self._lock:
            item = self.items[self._i % len(self.items)]
            self._i += 1
        return item


def load_replay(path: Path, default_segment: str = "replay") -> list[Prompt]:
    """Every line of ``path`` as a :class:`Prompt`; :class:`SourceError` names the line."""
    try:
        text = read_text_file(path, "replay file")
    except TextFileError as exc:
        raise SourceError(str(exc)) from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            prompts.append(_parse_line(line, f"{path}:{number}", default_segment))
    if not prompts:
        raise SourceError(f"replay file {path} holds no requests")
    return prompts


def _parse_line(line: str, where: str, default_segment: str) -> Prompt:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{where}: not JSON: {exc.msg}") from None
    if isinstance(item, str):
        return Prompt(segment=default_segment, prompt=item)
    if not isinstance(item, dict):
        raise SourceError(f"{where}: a line is a JSON string or an object with 'messages' "
                          f"or 'prompt'")
    unknown = set(item) - {"messages", "prompt", "segment", "max_tokens", "temperature"}
    if unknown:
        raise SourceError(f"{where}: unknown field(s) {sorted(unknown)}")
    overrides = {k: item[k] for k in ("max_tokens", "temperature") if k in item}
    segment = str(item.get("segment") or default_segment)
    if "messages" in item:
        return Prompt(segment=segment, messages=_messages(item["messages"], where),
                      overrides=overrides)
    if isinstance(item.get("prompt"), str):
        return Prompt(segment=segment, prompt=item["prompt"], overrides=overrides)
    raise SourceError(f"{where}: needs 'messages' (a list) or 'prompt' (a string)")


def _messages(value: Any, where: str) -> list[dict[str, str]]:
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in value)
    if not ok:
        raise SourceError(f"{where}: 'messages' must be a non-empty list of "
                          f"{{role, content}} with string values")
    return [{"role": m["role"], "content": m["content"]} for m in value]
