"""autospec's suffix proposer for vLLM (:class:`SuffixIndexProposer`) without vLLM: it is
handed what vLLM's model runner hands it (rows of token ids, rows moving between steps) and
must draft what autospec's :class:`SuffixSpeculator` drafts for each row's sequence; its index
loads only from files whose checksums match. Tiny hand-made corpora."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from autospec.interop.vllm_proposer import SuffixIndexProposer
from autospec.speculators.config import SuffixConfig
from autospec.speculators.suffix import suffix_from_documents

DOCS = [([1, 2, 3], [4, 5, 6, 7, 8, 9]), ([7, 7, 2], [4, 5, 6, 1, 2, 3, 4, 5]),
        ([3, 3], [9, 8, 7, 6, 5, 4])]
K, MAX_LEN = 4, 64


def _config() -> SuffixConfig:
    return SuffixConfig(target_id="tiny", target_revision="r", min_token_prob=0.0)


def _proposer() -> SuffixIndexProposer:
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                          model_config=SimpleNamespace(max_model_len=MAX_LEN))
    return SuffixIndexProposer(cfg)


def _export(tmp_path, spec):  # type: ignore[no-untyped-def]
    import safetensors.torch

    from autospec.interop.vllm_worker import file_sha256

    (tmp_path / "config.json").write_text(json.dumps(spec.config.model_dump(mode="json")))
    safetensors.torch.save_file(spec.state_tensors(), str(tmp_path / "model.safetensors"))
    return {n: file_sha256(tmp_path / n) for n in ("config.json", "model.safetensors")}


def _rows(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(seqs), MAX_LEN), dtype=np.int32)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = seq
    return np.array([len(s) for s in seqs], dtype=np.int32), ids


def test_each_row_gets_what_autospecs_suffix_speculator_drafts(tmp_path) -> None:
    spec = suffix_from_documents(_config(), DOCS)
    proposer = _proposer()
    info = proposer.load_index(str(tmp_path), _export(tmp_path, spec), "v1")
    assert info == {"corpus_tokens": spec.corpus_tokens, "version": "v1", "slot": None,
                    "slots": []}
    a, b = [5, 1, 2, 3, 4], [9, 9, 4, 5, 6]
    for step in range(4):  # rows grow, then swap places (a request finished, say)
        a, b = [*a, 5 + step], [*b, 1 + step]
        seqs = [a, b] if step < 2 else [b, a]
        n, ids = _rows(seqs)
        drafts = proposer.propose([[1], [1]], n, ids)
        for seq, draft in zip(seqs, drafts, strict=True):
            twin = spec.fork()
            twin.extend(seq)
            assert draft == twin.draft(K)
    assert any(proposer.propose([[1], [1]], *_rows([a, b])))  # it does draft


def test_rows_that_sampled_nothing_get_no_drafts_and_no_index_means_request_ngrams(
        tmp_path) -> None:
    proposer = _proposer()
    n, ids = _rows([[1, 2, 3, 1, 2], [1, 2, 3, 1, 2]])
    drafts = proposer.propose([[], [2]], n, ids)
    assert drafts[0] == [] and drafts[1][:1] == [3]  # the request's own 1 2 -> 3


def test_an_index_whose_files_are_not_the_exported_ones_is_refused(tmp_path) -> None:
    spec = suffix_from_documents(_config(), DOCS)
    sums = _export(tmp_path, spec)
    proposer = _proposer()
    with pytest.raises(ValueError, match="not the exported"):
        proposer.load_index(str(tmp_path), {**sums, "model.safetensors": "0" * 64})
    assert proposer.index.corpus_tokens == 0  # nothing changed


def test_an_index_whose_config_sets_a_corpus_its_tokens_lack_is_refused(tmp_path) -> None:
    """Files and checksums consistent (an export dir edited, its manifest too): the index was
    allocated from corpus_tokens before its tensors were compared (10^13: a MemoryError)."""
    spec = suffix_from_documents(_config(), DOCS)
    _export(tmp_path, spec)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "corpus_tokens": 10**13}))
    from autospec.interop.vllm_worker import file_sha256

    sums = {n: file_sha256(tmp_path / n) for n in ("config.json", "model.safetensors")}
    proposer = _proposer()
    with pytest.raises(ValueError, match=r"corpus_tokens 10000000000000, its tokens hold"):
        proposer.load_index(str(tmp_path), sums)
    assert proposer.index.corpus_tokens == 0  # nothing changed


def test_a_per_batch_size_schedule_sets_k_for_the_step(tmp_path) -> None:
    """The deployment's concurrency bands, as vLLM's scheduler reads them: k = 2 for a batch
    of one or two rows, none from three on (vLLM hands its own proposers the k; a custom
    one reads the schedule)."""
    pytest.importorskip("vllm")
    spec = suffix_from_documents(_config(), DOCS)
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K,
                                           num_speculative_tokens_per_batch_size=[
                                               (1, 2, 2), (3, 1 << 16, 0)]),
        model_config=SimpleNamespace(max_model_len=MAX_LEN),
        scheduler_config=SimpleNamespace(max_num_seqs=8))
    proposer = SuffixIndexProposer(cfg)
    proposer.load_index(str(tmp_path), _export(tmp_path, spec), "v1")
    seq = [5, 1, 2, 3, 4, 5]
    full = _proposer()
    full.load_index(str(tmp_path), _export(tmp_path, spec), "v1")
    n, ids = _rows([seq])
    (unbanded,) = full.propose([[1]], n, ids)
    assert len(unbanded) > 2  # the index drafts more than the band allows
    (one,) = proposer.propose([[1]], n, ids)
    assert one == unbanded[:2]
    n, ids = _rows([seq, seq, seq])
    assert proposer.propose([[1], [1], [1]], n, ids) == [[], [], []]


def _runner(rows: list[tuple[int, int, int, set[int]]]) -> SimpleNamespace:
    """vLLM's model runner as the proposer reads it: per row (prompt tokens, max_tokens,
    min_tokens, stop token ids)."""
    ids = [f"r{i}" for i in range(len(rows))]
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=ids),
        requests={rid: SimpleNamespace(num_prompt_tokens=prompt, sampling_params=SimpleNamespace(
            max_tokens=max_tokens, min_tokens=min_tokens, all_stop_token_ids=stops))
            for rid, (prompt, max_tokens, min_tokens, stops) in zip(ids, rows, strict=True)})


def test_attached_it_drafts_no_further_than_the_request_can_go(tmp_path) -> None:
    """vLLM drafts k tokens even past ``max_tokens`` or a stop token and counts those the
    target would have accepted (then cuts them from the output); replay and autospec's engine
    draft ``min(k, max_tokens - generated - 1)`` and count only emitted tokens, a stop token
    ending the request as the step's own. Attached to the runner, the proposer drafts no
    further and leaves stop tokens to the target, so vLLM's counts equal replay's."""
    from autospec.interop.vllm_worker import AutospecWorkerExtension

    spec = suffix_from_documents(_config(), DOCS)
    proposer = _proposer()
    seq = [5, 1, 2, 3, 4, 5]  # the index drafts 1 2 3 4
    n, ids = _rows([seq] * 5)
    sampled = [[1]] * 5
    sums = _export(tmp_path, spec)
    proposer.load_index(str(tmp_path), sums)
    unattached = proposer.propose(sampled, n, ids)
    assert unattached == [[1, 2, 3, 4]] * 5  # vLLM's own proposers: k whatever is left
    runner = _runner([
        (2, 7, 0, set()),  # 4 generated of 7: 2 drafts, the step's own token the 7th
        (2, 5, 0, set()),  # the next token is the last: no drafts
        (2, 40, 0, {2}),  # a stop token among the drafts: left to the target, with all after
        (2, 40, 6, {2}),  # ... unless min_tokens are not out by then
        (2, 40, 0, {0}),  # max_tokens far, no stop drafted: all k
    ])
    worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=proposer))
    worker.model_runner.input_batch, worker.model_runner.requests = \
        runner.input_batch, runner.requests
    AutospecWorkerExtension.autospec_load_index(worker, str(tmp_path), sums)  # attaches
    assert proposer.propose(sampled, n, ids) == [[1, 2], [], [1], [1, 2, 3, 4],
                                                 [1, 2, 3, 4]]


def _slotted_runner(slots: list[str | None]) -> SimpleNamespace:
    """vLLM's model runner as the proposer reads it: each row's request names ``slot``."""
    ids = [f"r{i}" for i in range(len(slots))]
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=ids),
        requests={rid: SimpleNamespace(num_prompt_tokens=1, sampling_params=SimpleNamespace(
            max_tokens=None, min_tokens=0, all_stop_token_ids=set(),
            extra_args=None if slot is None else {"autospec_draft_slot": slot}))
            for rid, slot in zip(ids, slots, strict=True)})


def test_a_request_naming_a_slot_drafts_from_that_segments_index(tmp_path,
                                                                 monkeypatch) -> None:
    """A segment's version in a slot beside the deployment's index: the rows whose request
    names it draft from it, the others from the deployment's; one naming a slot not loaded
    drafts from the deployment's. A dropped slot is retired, not forgotten: the requests
    naming it draft from it to their end, in whichever row vLLM moves them to (their rows
    are named after it), until none does and its grace is over."""
    deployment = suffix_from_documents(_config(), DOCS[:1])
    segment = suffix_from_documents(_config(), DOCS[1:])
    proposer = _proposer()
    (tmp_path / "d").mkdir()
    (tmp_path / "s").mkdir()
    proposer.load_index(str(tmp_path / "d"), _export(tmp_path / "d", deployment), "dep")
    info = proposer.load_index(str(tmp_path / "s"), _export(tmp_path / "s", segment), "seg",
                               "seg")
    assert info["slot"] == "seg" and info["slots"] == ["seg"] and proposer.version == "dep"
    proposer.attach(_slotted_runner(["seg", None, "other"]))

    def drafted(spec, seq):  # type: ignore[no-untyped-def]
        twin = spec.fork()
        twin.extend(seq)
        return twin.draft(K)

    seq = [7, 7, 2, 4, 5, 6]  # the segment's index continues 1 2 3 4, the deployment's 7 8 9
    assert drafted(segment, seq) != drafted(deployment, seq)
    n, ids = _rows([seq] * 3)
    assert proposer.propose([[1]] * 3, n, ids) == [
        drafted(segment, seq), drafted(deployment, seq), drafted(deployment, seq)]
    assert proposer.drop_index("seg") == {"dropped": "seg", "slots": [], "retired": ["seg"]}
    longer = [*seq, 1]
    n, ids = _rows([longer] * 3)  # the same requests, a token on: row 0 keeps its index
    assert proposer.propose([[1]] * 3, n, ids)[0] == drafted(segment, longer)
    proposer.attach(_slotted_runner([None, "seg"]))  # an earlier request ended: rows move
    n, ids = _rows([[*longer, 2][1:], [*longer, 2]])
    assert proposer.propose([[1]] * 2, n, ids)[1] == drafted(segment, [*longer, 2])
    proposer.attach(_slotted_runner([None]))  # no request names it any more
    monkeypatch.setattr("autospec.interop.vllm_proposer.RETIRED_GRACE_S", 0.0)
    n, ids = _rows([[9, 9, 4, 5, 6]])
    proposer.propose([[1]], n, ids)  # frees it
    proposer.attach(_slotted_runner(["seg"]))  # a request naming it now: never loaded
    assert proposer.propose([[1]], n, ids) == [drafted(deployment, [9, 9, 4, 5, 6])]


def test_a_request_drafts_from_no_slot_but_the_one_the_replica_names() -> None:
    """A client's ``vllm_xargs`` naming a slot is removed: its row is named after the
    deployment's version, so it must draft from the deployment's index."""
    from autospec.engine.vllm.sampling import DRAFT_SLOT, with_slot

    smuggled = SimpleNamespace(extra_args={DRAFT_SLOT: "seg", "other": 1})
    assert with_slot(smuggled, None).extra_args == {"other": 1}
    assert with_slot(SimpleNamespace(extra_args={DRAFT_SLOT: "x"}), None).extra_args is None
    assert with_slot(SimpleNamespace(extra_args=None), "seg").extra_args == {DRAFT_SLOT: "seg"}
