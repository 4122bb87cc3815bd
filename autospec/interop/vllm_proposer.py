"""autospec's ``suffix`` speculator inside vLLM: a custom proposer over the version's index.

vLLM 0.32 runs any class named in ``speculative_config.model`` with method ``custom_class``
(``vllm/v1/spec_decode/custom_class_proposer.py``): it is built with the ``VllmConfig`` and,
after each engine step, its :meth:`SuffixIndexProposer.propose` gets what vLLM's own n-gram
proposer gets — each batch row's sampled tokens, the row's token count and the rows' token
ids — and returns each row's draft tokens; vLLM verifies them like any drafts.

:class:`SuffixIndexProposer` drafts exactly what autospec's :class:`SuffixSpeculator` drafts
for the same sequence (the global traffic index, then the request's own n-grams, the longer
expected accepted length winning), so shadow replay predicts vLLM's acceptance request by
request. A proposal is a function of the sequence alone; each row keeps its own incremental
state (the request index and the longest match), checked against the row's tokens at every
step (rows move as requests finish) and rebuilt when they differ.

The index comes from a directory as autospec exports it (:mod:`autospec.interop.export`:
``config.json`` with the :class:`~autospec.speculators.config.SuffixConfig` and
``model.safetensors`` with the corpus and its suffix array), each file's SHA-256 checked:

- on autospec's serving path, by :meth:`load_index` through the worker extension
  (:mod:`autospec.interop.vllm_worker`) right after the engine starts, and again at every
  in-place swap (rows built on the old index are rebuilt on the new one at their next step);
- for a user running ``vllm serve`` on an exported version, from the directory named by the
  environment variable :data:`INDEX_ENV` when the proposer is built (checksums from the
  export's ``manifest.json``).

**The end of a request.** Once attached to the model runner
(:meth:`SuffixIndexProposer.attach`, which autospec's worker extension does when it loads an
index) the proposer reads each row's request and drafts no further than the request can go
(:mod:`autospec.interop.vllm_request_end`, the rule the engine applies to every proposer),
so vLLM's counts are the emitted ones and equal replay's request by request. Unattached
(``vllm serve`` on an export) it drafts k tokens whatever is left, as vLLM's own proposers
do.

**Segments.** Besides the deployment's index the proposer holds one index per segment version
(:meth:`SuffixIndexProposer.load_index` with a ``slot``: the version's name). A request
whose sampling parameters carry ``extra_args[DRAFT_SLOT]`` (the replica sets it for a segment
with a version of its own) drafts from that slot's index, every other request from the
deployment's. A dropped slot's index is kept (*retired*) while any request the model runner
holds names it, and at least :data:`RETIRED_GRACE_S` (a request bound to it may still wait
in vLLM's queue): a request that named it drafts from it to its end, whichever batch row
vLLM moves it to, so its row stays true to the version it names. One naming a slot never
loaded (or long freed) drafts from the deployment's. Reading a row's request needs
the proposer attached (above).

Until an index is loaded the proposer drafts from each request's own n-grams only. With a
per-batch-size schedule (``num_speculative_tokens_per_batch_size``: the deployment's
concurrency bands) it drafts the schedule's k for the step's batch size, as vLLM's own
proposers do.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from autospec.engine.vllm.sampling import DRAFT_SLOT
from autospec.interop.vllm_request_end import RequestEnd, request_end, request_extra
from autospec.speculators.suffix import VLLM_INDEX_ENV, VLLM_PROPOSER

log = logging.getLogger(__name__)

#: the environment variable naming an exported suffix version for ``vllm serve``, and this
#: class's import path (what the suffix kind's exporter writes; declared there, once)
INDEX_ENV = VLLM_INDEX_ENV
#: seconds a dropped slot's index is kept at least, for requests bound to it still queued
RETIRED_GRACE_S = 300.0
CLASS_PATH = VLLM_PROPOSER


def read_index(directory: str | Path, sha256: dict[str, str]) -> Any:
    """A :class:`SuffixSpeculator` from an exported directory, its files checked."""
    from autospec.interop.vllm_worker import read_checked
    from autospec.speculators.config import SuffixConfig
    from autospec.speculators.suffix import SuffixSpeculator

    root = Path(directory)
    config_file = root / "config.json"
    if "config.json" not in sha256 or "model.safetensors" not in sha256:
        raise ValueError(f"{root}: the checksums of config.json and model.safetensors "
                         "are both needed")
    from autospec.interop.vllm_worker import file_sha256

    if not config_file.is_file() or file_sha256(config_file) != sha256["config.json"]:
        raise ValueError(f"{config_file}: missing or not the exported file (SHA-256)")
    config = SuffixConfig.model_validate(json.loads(config_file.read_text()))
    tensors = read_checked(str(root / "model.safetensors"), sha256["model.safetensors"])
    stored = tuple(tensors["tokens"].shape) if "tokens" in tensors else None
    if stored != (config.corpus_tokens,):  # the index is allocated from corpus_tokens
        raise ValueError(f"{config_file}: corpus_tokens {config.corpus_tokens}, its tokens "
                         f"{'are missing' if stored is None else f'hold {stored}'}")
    spec = SuffixSpeculator(config)
    spec.load_tensors(tensors)
    return spec


class _Row:
    """One batch row's request: its tokens so far, its own speculator state, and the slot
    whose index it drafts from (None: the deployment's)."""

    def __init__(self, index: Any, capacity: int, slot: str | None = None) -> None:
        self.index = index
        self.slot = slot
        self.spec = index.fork()
        self.tokens = np.empty(capacity, dtype=np.int64)
        self.n = 0

    def matches(self, index: Any, tokens: np.ndarray) -> bool:
        return index is self.index and self.n <= len(tokens) and \
            bool(np.array_equal(tokens[: self.n], self.tokens[: self.n]))

    def extend(self, tokens: np.ndarray) -> None:
        new = tokens[self.n :]
        if len(new):
            self.spec.extend(new.tolist())
            self.tokens[self.n : len(tokens)] = new
            self.n = len(tokens)


def _k_by_batch(vllm_config: Any, k: int) -> list[int] | None:
    """k per batch size from ``num_speculative_tokens_per_batch_size`` (the deployment's
    concurrency bands, :mod:`autospec.serve.bands`), as vLLM's scheduler reads it; None
    without one. vLLM hands built-in proposers the scheduled k; a custom one reads it here."""
    schedule = getattr(vllm_config.speculative_config, "num_speculative_tokens_per_batch_size",
                       None)
    if not schedule:
        return None
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(
        schedule, int(vllm_config.scheduler_config.max_num_seqs), k)


class SuffixIndexProposer:
    """vLLM's ``custom_class`` proposer drafting with autospec's suffix index (module doc)."""

    def __init__(self, vllm_config: Any) -> None:
        from autospec.speculators.config import SuffixConfig
        from autospec.speculators.suffix import SuffixSpeculator

        spec_config = vllm_config.speculative_config
        self.k = int(spec_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.k_by_batch = _k_by_batch(vllm_config, self.k)
        self.index: Any = SuffixSpeculator(  # an empty corpus
            SuffixConfig(target_id="vllm", target_revision="none"))
        self.version: str | None = None
        self.slots: dict[str, Any] = {}  # segment versions' indexes, by version name
        self._retired: dict[str, tuple[Any, float]] = {}  # dropped slots: (index, when)
        self._rows: dict[int, _Row] = {}
        self._runner: Any = None  # vLLM's model runner, once attached
        directory = os.environ.get(INDEX_ENV)
        if directory:
            manifest = json.loads((Path(directory) / "manifest.json").read_text())
            self.load_index(directory, manifest["files"])

    def load_index(self, directory: str, sha256: dict[str, str],
                   version: str | None = None, slot: str | None = None) -> dict[str, Any]:
        """Draft from the index in ``directory`` from the next step on: every request's
        (``slot`` None), or the requests that name ``slot`` (module doc)."""
        index = read_index(directory, sha256)
        if slot is None:
            self.index, self.version = index, version
        else:
            self.slots = {**self.slots, slot: index}  # replaced whole: propose() reads it
        log.info("suffix index of %s loaded (%d tokens)%s", version or directory,
                 index.corpus_tokens, "" if slot is None else f" for slot {slot}")
        return {"corpus_tokens": index.corpus_tokens, "version": version, "slot": slot,
                "slots": sorted(self.slots)}

    def drop_index(self, slot: str) -> dict[str, Any]:
        """Stop offering ``slot``'s index; it is retired, kept for the requests that name it
        to their end (module doc)."""
        if slot in self.slots:
            self._retired[slot] = (self.slots[slot], time.monotonic())
        self.slots = {name: index for name, index in self.slots.items() if name != slot}
        return {"dropped": slot, "slots": sorted(self.slots), "retired": sorted(self._retired)}

    def _free_retired(self) -> None:
        """Forget the retired indexes past their grace that no request the runner holds
        names (unattached: past their grace)."""
        if not self._retired:
            return
        named = set()
        for state in (getattr(self._runner, "requests", None) or {}).values():
            extra = getattr(getattr(state, "sampling_params", None), "extra_args", None) or {}
            named.add(extra.get(DRAFT_SLOT))
        now = time.monotonic()
        self._retired = {slot: kept for slot, kept in self._retired.items()
                         if slot in named or now - kept[1] < RETIRED_GRACE_S}

    def attach(self, runner: Any) -> None:
        """Read each row's request from vLLM's model runner (``input_batch.req_ids`` and
        ``requests``: its sampling parameters and prompt length), to draft no further than
        the request can go (module doc)."""
        self._runner = runner

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """Each row's drafts (up to k tokens — fewer where the engine's per-batch-size
        schedule says so, or near the request's end once attached; none for a row that
        sampled nothing)."""
        drafts: list[list[int]] = []
        k = self.k_by_batch[min(len(sampled_token_ids), len(self.k_by_batch) - 1)] \
            if self.k_by_batch else self.k
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not sampled or n >= self.max_model_len:
                drafts.append([])
                continue
            end = self._request_end(i, n)
            row_k = k if end is None else min(k, end.left)
            draft = self._row(i, token_ids_cpu[i, :n]).draft(row_k) if row_k > 0 else []
            drafts.append(draft if end is None else end.cut(draft))
        self._free_retired()
        return drafts

    def _request_end(self, i: int, n: int) -> RequestEnd | None:
        """Where row ``i``'s request (``n`` tokens so far) can end; None unattached."""
        return None if self._runner is None else request_end(self._runner, i, n, self.k)

    def _row_slot(self, i: int) -> str | None:
        """The slot row ``i``'s request names (None: none, or unattached)."""
        if self._runner is None:
            return None
        return request_extra(self._runner, i).get(DRAFT_SLOT)

    def _index_for(self, slot: str | None) -> Any:
        """The index a row naming ``slot`` drafts from: the slot's, loaded or retired; else
        the deployment's."""
        if slot is None:
            return self.index
        index = self.slots.get(slot)
        if index is None and slot in self._retired:
            index = self._retired[slot][0]
        return self.index if index is None else index

    def _row(self, i: int, tokens: np.ndarray) -> Any:
        slot = self._row_slot(i)
        index = self._index_for(slot)
        row = self._rows.get(i)
        if row is None or not row.matches(index, tokens):
            row = self._rows[i] = _Row(index, self.max_model_len, slot)
        row.extend(tokens)
        return row.spec

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load into vLLM (the model runner calls it for every drafter)."""
