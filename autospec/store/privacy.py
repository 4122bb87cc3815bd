"""Privacy rules applied to a request row before it is written anywhere (database or spill file).

- **Opt-out** (``opted_out=True``): nothing the client wrote is kept. Statistics stay (token
  counts, latency, drafting counters, accepted-per-position) with the numeric sampling knobs
  in :data:`OPT_OUT_SAMPLING_KEYS` (``max_tokens``, ``temperature``, ``top_k``, ``top_p``,
  ``ignore_eos``, the server's ``k`` and ``route``, the load it was served under);
  prompt/output text and token ids are dropped, and so is every other ``sampling`` entry —
  stop strings (only their number is kept, as ``num_stop``), the seed and anything a caller
  adds. The segment is the caller's
  business: the serving path records an opted-out request under its route, never under a
  client-supplied label.
- **Redaction**: a hook ``Callable[[str], str]`` runs over every stored string that can come
  from a client: prompt and output text, the segment, and every string inside ``sampling``
  (stop strings). The default, :func:`redact_default`, replaces e-mail addresses with
  ``[EMAIL]`` and API-key-like strings with ``[SECRET]``. The store cannot re-tokenize, so
  when redaction changes a text, that text's token ids are dropped too (they would still
  encode the secret); any change flags the row ``redacted``. A caller that wants the ids
  kept must redact and re-tokenize before recording.
- **NUL**: before these rules, :func:`autospec.store.traffic.prepare_row` replaces NUL
  characters in the same strings by U+FFFD (PostgreSQL cannot store NUL in text).
- **Retention**: see :func:`autospec.store.queries.purge_requests` (``autospec db purge``;
  ``--text-only`` leaves old rows as an opt-out would: statistics and the numeric sampling
  knobs, no text, ids or other ``sampling`` entries).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Redactor = Callable[[str], str]

EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
SECRET_PATTERNS = (
    # provider-style prefixes: sk-..., sk_live_..., pk-..., rk_..., api_..., key-...
    re.compile(r"\b(?:sk|pk|rk|api|key|token|secret)[-_](?:[A-Za-z0-9]+[-_])*[A-Za-z0-9]{16,}\b"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),  # GitHub tokens
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),  # Slack tokens
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),  # Google API keys
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}=*"),
    # a long token mixing upper case, lower case and digits (base62/base64 secrets)
    re.compile(r"\b(?=[A-Za-z0-9_-]*[A-Z])(?=[A-Za-z0-9_-]*[a-z])(?=[A-Za-z0-9_-]*\d)"
               r"[A-Za-z0-9_-]{32,}\b"),
)


# every secret pattern contains a run of 16+ of these characters: texts without one (most
# prose) skip the patterns altogether
_CANDIDATE = re.compile(r"[A-Za-z0-9_-]{16}")


def redact_default(text: str) -> str:
    """Replace e-mail addresses by ``[EMAIL]`` and API-key-like strings by ``[SECRET]``."""
    if "@" in text:
        text = EMAIL.sub("[EMAIL]", text)
    if _CANDIDATE.search(text):
        for pattern in SECRET_PATTERNS:
            text = pattern.sub("[SECRET]", text)
    return text


def no_redaction(text: str) -> str:
    """A redactor that changes nothing (for deployments that redact upstream)."""
    return text


#: the ``sampling`` entries an opted-out row keeps: numbers the server reads, no client text
#: (``engine`` and ``vllm_spec_decode``: what served the request and vLLM's acceptance of it;
#: ``concurrency``, ``in_flight``, ``k_bands`` and ``banded``: the load it was served under
#: and whether a band drafted fewer tokens for it; ``holdout``: served with speculation off
#: as the ledger's control group)
OPT_OUT_SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "ignore_eos", "k",
                         "route", "engine", "vllm_spec_decode", "concurrency", "in_flight",
                         "k_bands", "banded", "holdout")


def apply_privacy(row: dict[str, Any], redact: Redactor | None) -> dict[str, Any]:
    """Apply opt-out and redaction to a row dict (keys of ``requests``) in place; return it.

    Token counts are filled from the ids before the ids are removed, so statistics survive.
    """
    for ids_key, count_key in (("prompt_ids", "prompt_tokens"), ("output_ids", "output_tokens")):
        if not row.get(count_key) and row.get(ids_key) is not None:
            row[count_key] = len(row[ids_key])
    if row.get("opted_out"):
        for key in ("prompt_text", "output_text", "prompt_ids", "output_ids"):
            row[key] = None
        row["sampling"] = opted_out_sampling(row.get("sampling"))
    if redact is None:
        return row
    for text_key, ids_key in (("prompt_text", "prompt_ids"), ("output_text", "output_ids")):
        text = row.get(text_key)
        if text:
            cleaned = redact(text)
            if cleaned != text:
                row[text_key] = cleaned
                row[ids_key] = None
                row["redacted"] = True
    for key in ("segment", "sampling"):
        if row.get(key) is not None:
            cleaned = _redact_strings(row[key], redact)
            if cleaned != row[key]:
                row[key] = cleaned
                row["redacted"] = True
    return row


def opted_out_sampling(sampling: dict[str, Any] | None) -> dict[str, Any] | None:
    """What an opted-out row keeps of ``sampling``: :data:`OPT_OUT_SAMPLING_KEYS` and the
    number of stop strings (``num_stop``). Applied to its own result it changes nothing
    (``autospec db purge --text-only`` rewrites stored rows with it)."""
    if sampling is None:
        return None
    kept = {key: sampling[key] for key in OPT_OUT_SAMPLING_KEYS if key in sampling}
    if isinstance(sampling.get("num_stop"), int):
        kept["num_stop"] = sampling["num_stop"]
    stop = sampling.get("stop")
    if stop:
        kept["num_stop"] = 1 if isinstance(stop, str) else len(stop)
    return kept


def _redact_strings(value: Any, redact: Redactor) -> Any:
    """``value`` with ``redact`` applied to every string in it (dict keys and values, lists)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redact_strings(k, redact): _redact_strings(v, redact) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact_strings(item, redact) for item in value)
    return value
