"""A request's traffic segment: the operator's rules of the serve config (``segments:``).

A segment names a slice of traffic: the traffic rows keep it (``requests.segment``),
evaluation reports τ per segment, and a segment may have a live pointer of its own
(``autospec promote VERSION --segment S``) whose version then drafts its requests
(:mod:`autospec.serve.versions`). How a request gets its segment, once, when its body has
been read (:func:`autospec.serve.http_io.context`, with :func:`rule_segment`):

1. the ``x-autospec-segment`` header, when the client sent one (it always wins);
2. else the first of the config's rules that matches (:class:`SegmentRule`: by the
   request's ``model``, by the SHA-256 of its system prompt — a hex prefix — or by the value
   of a request header; a rule naming several matches them all);
3. else the route's name (``chat`` or ``completions``), as before rules existed.

The rules are checked when the config is (``autospec serve`` refuses bad ones before any
replica starts, naming the rule and field); a request is never refused for them. This module
knows nothing of HTTP frameworks: it reads a header mapping and the body as parsed JSON.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autospec.names import is_name

#: the request header that names the segment itself (wins over the rules)
SEGMENT_HEADER = "x-autospec-segment"
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token (RFC 9110)
#: what a rule matches on (one or more), and every key it takes
MATCH_KEYS = "`model`, `user`, `system_sha256` or `header` with `value`"
RULE_KEYS = f"`segment` and one or more of {MATCH_KEYS}"
#: roles whose message is the system prompt (``developer`` is OpenAI's newer name for it)
SYSTEM_ROLES = ("system", "developer")


class SegmentRule(BaseModel):
    """One rule: requests it matches belong to ``segment``. Every match the rule names must
    hold (at least one must be named)."""

    model_config = ConfigDict(extra="forbid")

    segment: str = Field(description="the segment a matching request belongs to (1-64 "
                         "letters, digits, '.', '_' or '-', starting with a letter or digit)")
    model: str | None = Field(None, min_length=1, description="match the request's `model` "
                              "field exactly")
    user: str | None = Field(None, min_length=1, description="match the request's `user` "
                             "field (OpenAI's end-user id) exactly: a segment per customer")
    system_sha256: str | None = Field(
        None, description="match a chat whose system prompt's SHA-256 (hex, of its UTF-8 "
        "text) starts with this prefix (8-64 hex digits), e.g. from "
        "`printf %s \"$PROMPT\" | sha256sum`")
    header: str | None = Field(None, description="match when this request header ...")
    value: str | None = Field(None, description="... has exactly this value (with `header`)")

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        """A rule is a mapping of the keys it takes: anything else in words that say so and
        name them (pydantic's "Extra inputs are not permitted" named neither)."""
        if isinstance(data, SegmentRule):
            return data
        if not isinstance(data, Mapping):
            raise ValueError(f"a rule is a mapping of keys ({RULE_KEYS}), not "
                             f"{str(data)[:40]!r}")
        unknown = sorted(str(k) for k in data if k not in cls.model_fields)
        if unknown:
            raise ValueError(f"unknown key{'s' * (len(unknown) > 1)} "
                             f"{', '.join(f'`{k}`' for k in unknown)}: a rule takes {RULE_KEYS}")
        return data

    @field_validator("segment")
    @classmethod
    def _segment_name(cls, value: str) -> str:
        if not is_name(value):
            raise ValueError(f"{value!r} cannot name a segment: 1-64 letters, digits, '.', '_' "
                             "or '-', starting with a letter or digit")
        return value

    @field_validator("system_sha256")
    @classmethod
    def _hex_prefix(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-fA-F]{8,64}", value):
            raise ValueError(f"{value!r} is not a SHA-256 hex prefix of 8 to 64 hex digits")
        return None if value is None else value.lower()

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _HEADER_NAME.fullmatch(value):  # "$" takes a final "\n"
            raise ValueError(f"{value!r} is not an HTTP header name")
        if value.lower() == SEGMENT_HEADER:
            raise ValueError(f"{SEGMENT_HEADER} names the segment itself and always wins; "
                             "a rule cannot match on it")
        return value.lower()

    @model_validator(mode="after")
    def _one_match_at_least(self) -> SegmentRule:
        if (self.header is None) != (self.value is None):
            raise ValueError("`header` and `value` go together: the header's name and the "
                             "value it must have")
        if self.model is None and self.user is None and self.system_sha256 is None \
                and self.header is None:
            raise ValueError(f"the rule for segment {self.segment!r} matches nothing: give "
                             f"{MATCH_KEYS}")
        return self

    def matches(self, request: RequestFacts) -> bool:
        """True if every match this rule names holds for ``request``."""
        if self.model is not None and request.model != self.model:
            return False
        if self.user is not None and request.user != self.user:
            return False
        if self.system_sha256 is not None and not (
                request.system_sha256 or "").startswith(self.system_sha256):
            return False
        return self.header is None or request.headers.get(self.header) == self.value


class RequestFacts:
    """What the rules read of one request: its ``model`` and ``user``, its system prompt's
    SHA-256 (None without one) and its headers (names lower-case)."""

    def __init__(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> None:
        self.headers = {k.lower(): v for k, v in headers.items()}
        model, user = body.get("model"), body.get("user")
        self.model = model if isinstance(model, str) else None
        self.user = user if isinstance(user, str) else None
        system = system_prompt(body)
        self.system_sha256 = None if system is None else \
            hashlib.sha256(system.encode("utf-8")).hexdigest()


def system_prompt(body: Mapping[str, Any]) -> str | None:
    """The text of a chat body's first system (or developer) message; None without one (a
    completion body has none). Text parts of a list content are joined, as the chat
    template sees them."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            content = message.get("content")
            if isinstance(content, list):
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return None


def rule_segment(rules: Sequence[SegmentRule], *, headers: Mapping[str, str],
                 body: Mapping[str, Any]) -> str | None:
    """The segment the first matching rule gives this request, or None (no rule matches:
    the route's name then). The ``x-autospec-segment`` header is the HTTP layer's to check
    first (:func:`autospec.serve.http_io.context`)."""
    if not rules:
        return None
    facts = RequestFacts(headers, body)
    return next((rule.segment for rule in rules if rule.matches(facts)), None)
