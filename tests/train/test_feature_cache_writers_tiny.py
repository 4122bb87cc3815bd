"""Two extractions of the same sequences into one feature cache folder at once (bench and
pretrain runs side by side): each writes its own scratch file, both succeed, and the cached
file is whole. They shared one ``.partial`` name: the second rename found it gone (or
moved the other's half-written file into place). Tiny random-init target."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from autospec.train import features
from autospec.train.data import TrainSequence
from autospec.train.features import FeatureCache, cached_extract


def test_two_writers_of_one_key_both_succeed(tiny, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seqs = [TrainSequence(ids=list(range(1, 12)), prompt_len=4)] * 3
    save, both_saving = FeatureCache.save, threading.Barrier(2, timeout=30)

    def slow_save(self, path, **kwargs):  # type: ignore[no-untyped-def]
        both_saving.wait()  # the two writers save at once
        save(self, path, **kwargs)
        time.sleep(0.2)  # the first renames while the second is still writing

    monkeypatch.setattr(features.FeatureCache, "save", slow_save)
    errors: list[BaseException] = []

    def extract() -> None:
        try:
            cached_extract(tmp_path, tiny, seqs, feature_layers=(1, 2, 3))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=extract) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    (cached,) = tmp_path.glob("features-*.safetensors")
    assert FeatureCache.load(cached).ids.shape[0] == 33
    assert not list(tmp_path.glob("*.partial"))
