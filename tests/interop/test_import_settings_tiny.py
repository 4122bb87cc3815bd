"""autospec's own settings of an eagle3 head (tree drafting, the index threshold...) survive
``autospec export`` → ``autospec import``; a head from elsewhere gets the defaults, or what
``autospec import --set`` says; a malformed ``suffix-index/`` sidecar is refused naming the
file (tiny random-init targets, CPU)."""

from __future__ import annotations

import json

import pytest

from autospec import store
from autospec.interop.export import export_speculator
from autospec.interop.importer import ImportRefused, import_head, parse_settings
from autospec.speculators.eagle3 import index_config
from autospec.speculators.registry import new_speculator, vllm_refusal
from autospec.speculators.suffix import suffix_from_documents
from autospec.versions import load_speculator_version


@pytest.fixture
def db(sqlite_url):  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("settings", [
    {"tree_nodes": 0, "suffix_threshold": None, "ttt_steps": 5, "tree_width": 2,
     "tree_min_prob": 0.0},  # trained for vLLM
    {"tree_nodes": 9, "suffix_threshold": 0.5, "ttt_steps": 2, "tree_width": 3,
     "tree_min_prob": 0.2, "suffix_carried_tokens": 12},  # with an index
])
def test_export_import_keeps_every_setting_tiny(tiny, db, tmp_path, settings):
    spec = new_speculator("eagle3", tiny, draft_vocab_size=40)
    if "suffix_carried_tokens" in settings:
        spec.attach_suffix(suffix_from_documents(
            index_config(spec.config), [([7, 8], [1, 2, 3, 4, 5, 1, 2, 3, 4, 6])] * 3, tiny))
    spec.config = spec.config.model_copy(update=settings)
    export_speculator(spec, tiny, tmp_path / "x", k=4)
    done = import_head(tmp_path / "x", target=tiny, engine=db, name="again")
    _, again = load_speculator_version(db, tiny, "again")
    ours, theirs = spec.config.model_dump(), again.config.model_dump()
    assert {k: (v, theirs[k]) for k, v in ours.items() if theirs[k] != v} == {}
    assert done.details["settings"]["tree_nodes"] == settings["tree_nodes"]
    assert vllm_refusal("eagle3", again.config, tiny.info) == \
        vllm_refusal("eagle3", spec.config, tiny.info)


def _foreign(tiny, root):  # type: ignore[no-untyped-def]
    """A head as speculators or SpecForge write it: no autospec-settings.json, no manifest."""
    export_speculator(new_speculator("eagle3", tiny, draft_vocab_size=40, tree_nodes=0,
                                     suffix_threshold=None), tiny, root, k=4)
    (root / "autospec-settings.json").unlink()
    (root / "manifest.json").unlink()
    (root / "speculative_config.json").unlink()


def test_a_foreign_head_gets_the_defaults_or_what_set_says_tiny(tiny, db, tmp_path):
    _foreign(tiny, tmp_path / "x")
    import_head(tmp_path / "x", target=tiny, engine=db, name="plain")
    _, plain = load_speculator_version(db, tiny, "plain")
    assert plain.config.tree_nodes == 16 and plain.config.suffix_threshold == 0.7
    assert "tree_nodes=16" in (vllm_refusal("eagle3", plain.config, tiny.info) or "")
    settings = parse_settings(["tree_nodes=0", "suffix_threshold=null", "tree-width=2"])
    import_head(tmp_path / "x", target=tiny, engine=db, name="servable", settings=settings)
    _, served = load_speculator_version(db, tiny, "servable")
    assert (served.config.tree_nodes, served.config.suffix_threshold,
            served.config.tree_width) == (0, None, 2)
    assert vllm_refusal("eagle3", served.config, tiny.info) is None


def test_set_overrides_stored_settings_and_bad_ones_are_named_tiny(tiny, db, tmp_path):
    spec = new_speculator("eagle3", tiny, draft_vocab_size=40, tree_nodes=9)
    export_speculator(spec, tiny, tmp_path / "x", k=4)
    import_head(tmp_path / "x", target=tiny, engine=db, name="flat",
                settings=parse_settings(["tree_nodes=0"]))
    assert load_speculator_version(db, tiny, "flat")[1].config.tree_nodes == 0
    with pytest.raises(ImportRefused, match="--set tree_nodes=65: Input should be less"):
        parse_settings(["tree_nodes=65"])
    with pytest.raises(ImportRefused, match="--set hidden_size: not a setting of eagle3 this "
                       "takes; its settings this takes: suffix_threshold, tree_min_prob"):
        parse_settings(["hidden_size=64"])
    path = tmp_path / "x/autospec-settings.json"
    path.write_text(json.dumps({"kind": "eagle3", "settings": {"tree_nodes": "many"}}))
    (tmp_path / "x/manifest.json").unlink()  # edited by hand
    with pytest.raises(ImportRefused, match=r"settings\.json: tree_nodes=many: Input should"):
        import_head(tmp_path / "x", target=tiny, engine=db, name="bad")


def test_cli_import_set_refuses_a_bad_key_before_the_target_loads(sqlite_url, tmp_path):
    from typer.testing import CliRunner

    from autospec.cli import app

    (tmp_path / "h").mkdir()
    (tmp_path / "h/config.json").write_text("{}")
    done = CliRunner().invoke(app, ["import", str(tmp_path / "h"), "--set", "tree_nodes=x",
                                    "--target", "/nonexistent", "--url", sqlite_url])
    assert done.exit_code == 2 and "--set tree_nodes=x: Input should be a valid integer" \
        in done.output and "Traceback" not in done.output
    helped = CliRunner().invoke(app, ["import", "--help"])
    from autospec.interop.importer import SETTABLE

    assert all(name in helped.output for name in SETTABLE)


@pytest.mark.parametrize(("damage", "words"), [
    ("no tokens", r"model\.safetensors: a suffix index needs 1-D tensors tokens, "
                  r"suffix_array; missing \['tokens'\]"),
    ("2-D", r"model\.safetensors: .*not 1-D \['suffix_array'\]"),
    ("config list", r"config\.json: expected a JSON object \(the suffix index's config\), "
                    r"got list"),
    # the index was allocated from corpus_tokens before its tensors were read: a MemoryError
    ("corpus 10^13", r"config\.json: corpus_tokens is 10000000000000, its tokens hold 39"),
    # ids the target does not have were kept, to be proposed as drafts
    ("token 64", r"model\.safetensors: tokens holds ids outside \[0, 64\) .*: -1 to 64"),
    ("float tokens", r"model\.safetensors: tokens must hold integers, not torch\.float32"),
])
def test_a_malformed_suffix_index_sidecar_is_refused_naming_the_file_tiny(
        tiny, db, tmp_path, damage, words):
    import safetensors.torch

    spec = new_speculator("eagle3", tiny, draft_vocab_size=40)
    spec.attach_suffix(suffix_from_documents(
        index_config(spec.config), [([7, 8], [1, 2, 3, 4, 5, 1, 2, 3, 4, 6])] * 3, tiny))
    export_speculator(spec, tiny, tmp_path / "x", k=4)
    (tmp_path / "x/manifest.json").unlink()  # edited by hand
    side = tmp_path / "x/suffix-index"
    tensors = safetensors.torch.load_file(str(side / "model.safetensors"))
    if damage == "config list":
        (side / "config.json").write_text("[]")
    elif damage == "corpus 10^13":
        config = json.loads((side / "config.json").read_text())
        (side / "config.json").write_text(json.dumps({**config, "corpus_tokens": 10**13}))
    elif damage == "no tokens":
        safetensors.torch.save_file({"suffix_array": tensors["suffix_array"]},
                                    str(side / "model.safetensors"))
    else:
        if damage == "token 64":
            tensors["tokens"][3] = 64
        elif damage == "float tokens":
            tensors["tokens"] = tensors["tokens"].float()
        else:
            tensors["suffix_array"] = tensors["suffix_array"][None]
        safetensors.torch.save_file(tensors, str(side / "model.safetensors"))
    with pytest.raises(ImportRefused, match=words):
        import_head(tmp_path / "x", target=tiny, engine=db, name="bad")
