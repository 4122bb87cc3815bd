"""Export to / import from the speculators format, on tiny random-init targets (CPU).

- export -> import -> export gives identical tensors (head and suffix sidecar) and config;
- ``norm_before_residual``: autospec's layer equals vLLM's layer semantics (re-implemented
  here from vLLM 0.32's ``llama_eagle3.py``, on the exported tensors alone) with ``false``,
  not with ``true``; an imported ``true`` head computes vLLM's ``true`` layer;
- every kind exports (draft: a directory transformers loads with the same logits) or is
  refused with a reason; imports that do not fit the target are refused naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from autospec import store
from autospec.interop.export import ExportError, export_speculator
from autospec.interop.importer import ImportRefused, import_head, read_head
from autospec.speculators.eagle3 import Eagle3Speculator
from autospec.speculators.registry import new_speculator
from autospec.speculators.suffix import suffix_from_documents


def _head(tiny, **overrides) -> Eagle3Speculator:  # type: ignore[no-untyped-def]
    spec = new_speculator("eagle3", tiny, draft_vocab_size=40, **overrides)
    d2t = torch.randperm(63)[:40]  # unsorted, EOS (63) left out: the export sorts it
    spec.head.set_draft_vocab(d2t)
    with torch.no_grad():
        for p in spec.head.parameters():
            p.add_(0.05 * torch.randn_like(p))  # norms away from 1, o_proj non-zero
    return spec


@pytest.fixture
def db(sqlite_url):  # type: ignore[no-untyped-def]
    engine = store.open_store(sqlite_url, upgrade=True)
    yield engine
    engine.dispose()


def _files(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {str(p.relative_to(root)): safetensors.torch.load_file(str(p))
            for p in sorted(root.rglob("*.safetensors"))}


def test_export_import_export_gives_identical_tensors_tiny(tiny, db, tmp_path):
    spec = _head(tiny)
    spec.attach_suffix(suffix_from_documents(
        _index_config(spec), [([7, 8], [1, 2, 3, 4, 5, 1, 2, 3, 4, 6])] * 3, tiny))
    first = export_speculator(spec, tiny, tmp_path / "a", k=4)
    assert "suffix-index/model.safetensors" in first.files
    done = import_head(tmp_path / "a", target=tiny, engine=db, name="imported-1")
    from autospec.versions import load_speculator_version

    _, again = load_speculator_version(db, tiny, done.version)
    export_speculator(again, tiny, tmp_path / "b", k=4)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() == b.keys() == {"model.safetensors", "suffix-index/model.safetensors"}
    for name, tensors in a.items():
        assert tensors.keys() == b[name].keys()
        for key, t in tensors.items():
            assert t.dtype == b[name][key].dtype and torch.equal(t, b[name][key]), (name, key)
    assert (tmp_path / "a/config.json").read_text() == (tmp_path / "b/config.json").read_text()
    with store.session_scope(db, readonly=True) as session:
        events = store.list_events(session, kinds=["import"])
        assert [e.version for e in events] == ["imported-1"]
        assert store.get_speculator(session, version="imported-1").state == "candidate"


def _index_config(spec):  # type: ignore[no-untyped-def]
    from autospec.speculators.eagle3 import index_config

    return index_config(spec.config)


def test_exported_tensors_names_offsets_and_manifest_tiny(tiny, tmp_path):
    spec = _head(tiny)
    export_speculator(spec, tiny, tmp_path / "x", k=3, source={"version": "v1"})
    tensors = safetensors.torch.load_file(str(tmp_path / "x/model.safetensors"))
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.mlp.up_proj.weight"} <= tensors.keys()
    d2t_abs = spec.head.d2t.sort().values
    assert torch.equal(torch.arange(40) + tensors["d2t"], d2t_abs)  # offsets
    assert tensors["t2d"].dtype == torch.bool and int(tensors["t2d"].sum()) == 40
    assert torch.equal(tensors["t2d"].nonzero().flatten(), d2t_abs)
    order = spec.head.d2t.argsort()
    assert torch.equal(tensors["lm_head.weight"], spec.head.lm_head.weight[order].float())
    config = json.loads((tmp_path / "x/config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == list(spec.config.feature_layers)
    assert config["norm_before_residual"] is False and config["draft_vocab_size"] == 40
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    manifest = json.loads((tmp_path / "x/manifest.json").read_text())
    assert manifest["source"] == {"version": "v1"}
    from autospec.speculators.files import tensor_sha256

    q = spec.head.layer.q_proj.weight.float()
    assert manifest["tensors"]["layers.0.self_attn.q_proj.weight"] == {
        "sha256": tensor_sha256(q), "from": "layer.q_proj.weight"}
    from autospec import artifacts

    artifacts.verify_manifest(tmp_path / "x", required=("config.json", "model.safetensors"))


# -- vLLM's layer, re-implemented from vllm/model_executor/models/llama_eagle3.py ---------
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _vllm_eagle3(t: dict[str, torch.Tensor], cfg: dict, aux: torch.Tensor,
                 embeds: torch.Tensor, norm_before_residual: bool) -> torch.Tensor:
    """vLLM's Eagle3 Llama draft over T real pairs at positions 0..T-1 (causal); returns
    the post-norm hidden ``[T, H]`` whose lm_head logits vLLM samples."""
    layer = cfg["transformer_layer_config"]
    eps, nh, nkv = layer["rms_norm_eps"], layer["num_attention_heads"], layer["num_key_value_heads"]
    hd = layer["head_dim"]
    p = "layers.0."
    hidden = aux @ t["fc.weight"].T  # combine_hidden_states
    embeds = _rms(embeds, t[p + "input_layernorm.weight"], eps)
    if norm_before_residual:  # _norm_before_residual
        hidden = _rms(hidden, t[p + "hidden_norm.weight"], eps)
        residual = hidden
    else:  # _norm_after_residual
        residual = hidden
        hidden = _rms(hidden, t[p + "hidden_norm.weight"], eps)
    x = torch.cat([embeds, hidden], -1)
    n = x.shape[0]
    q = (x @ t[p + "self_attn.q_proj.weight"].T).view(n, nh, hd).transpose(0, 1)
    k = (x @ t[p + "self_attn.k_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(n, nkv, hd).transpose(0, 1)
    theta = layer["rope_parameters"]["rope_theta"]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(n).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(z: torch.Tensor) -> torch.Tensor:
        return z * cos + torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], -1) * sin

    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    attn = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
    h = attn.transpose(0, 1).reshape(n, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
    h = h + residual  # post_attention_layernorm(hidden, residual): fused add
    m = _rms(h, t[p + "post_attention_layernorm.weight"], eps)
    mlp = (F.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)) \
        @ t[p + "mlp.down_proj.weight"].T
    return _rms(mlp + h, t["norm.weight"], eps)  # self.norm(hidden, residual)


@pytest.mark.parametrize("flag", [False, True])
def test_norm_before_residual_matches_vllm_layer_semantics_tiny(tiny, tmp_path, flag):
    spec = _head(tiny, norm_before_residual=flag)
    export_speculator(spec, tiny, tmp_path / "x", k=3)
    t = safetensors.torch.load_file(str(tmp_path / "x/model.safetensors"))
    cfg = json.loads((tmp_path / "x/config.json").read_text())
    assert cfg["norm_before_residual"] is flag
    gen = torch.Generator().manual_seed(0)
    aux = torch.randn(7, 3 * 32, generator=gen)
    tokens = torch.randint(0, 63, (7,), generator=gen)
    embeds = tiny.model.get_input_embeddings().weight[tokens].detach()
    from autospec.speculators.eagle3 import HeadKVCache

    cache = HeadKVCache(spec.config.num_kv_heads, spec.config.head_dim,
                        device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        ours = spec.head.norm(spec.head.step_with_features(aux, tokens, cache))
    same = _vllm_eagle3(t, cfg, aux, embeds, norm_before_residual=flag)
    other = _vllm_eagle3(t, cfg, aux, embeds, norm_before_residual=not flag)
    torch.testing.assert_close(ours, same, rtol=1e-5, atol=1e-5)
    assert (ours - other).abs().max() > 1e-2  # the flag matters: the other value is wrong


# -- other kinds and refusals --------------------------------------------------------------
def test_draft_exports_as_a_llama_directory_with_the_same_logits_tiny(tiny, tmp_path):
    from transformers import LlamaForCausalLM

    spec = new_speculator("draft", tiny)
    done = export_speculator(spec, tiny, tmp_path / "d", k=4)
    assert done.speculative_config == {"method": "draft_model", "model": str(done.out),
                                       "num_speculative_tokens": 4}
    model = LlamaForCausalLM.from_pretrained(tmp_path / "d", dtype=torch.float32).eval()
    ids = torch.arange(1, 12)[None]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, spec.model(ids).logits)


def test_ngram_and_suffix_export_vllm_speculative_configs_tiny(tiny, tmp_path):
    ngram = export_speculator(new_speculator("ngram", tiny, max_ngram=4, min_ngram=2), tiny,
                              tmp_path / "n", k=5)
    assert ngram.speculative_config == {"method": "ngram", "num_speculative_tokens": 5,
                                        "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert json.loads((tmp_path / "n/speculative_config.json").read_text()) == \
        ngram.speculative_config
    suffix = export_speculator(new_speculator("suffix", tiny), tiny, tmp_path / "s", k=5)
    assert suffix.speculative_config == {
        "method": "custom_class", "num_speculative_tokens": 5,
        "model": "autospec.interop.vllm_proposer.SuffixIndexProposer"}
    assert {"config.json", "model.safetensors"} <= set(suffix.files)  # the index travels
    assert any("AUTOSPEC_VLLM_SUFFIX_INDEX" in n for n in suffix.notes)


def test_export_refuses_a_non_empty_directory_and_unknown_format_tiny(tiny, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    with pytest.raises(ExportError, match="not an empty directory"):
        export_speculator(new_speculator("ngram", tiny), tiny, tmp_path / "full", k=3)
    with pytest.raises(ExportError, match="unknown format 'gguf'"):
        export_speculator(new_speculator("ngram", tiny), tiny, tmp_path / "y", k=3, fmt="gguf")


def _mutate(path: Path, **changes) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        where = data
        *parents, last = key.split("__")
        for p in parents:
            where = where[p]
        where[last] = value
    (path / "config.json").write_text(json.dumps(data))
    (path / "manifest.json").unlink()


@pytest.mark.parametrize(("changes", "message"), [
    ({"transformer_layer_config__hidden_size": 64}, "hidden_size 64 != the target's 32"),
    ({"transformer_layer_config__vocab_size": 128}, "vocab_size 128 != the target's 64"),
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}, "eagle_aux_hidden_state_layer_ids"),
    ({"speculators_config__verifier__architectures": ["Qwen3ForCausalLM"]}, "verifier"),
    ({"transformer_layer_config__model_type": "qwen3"}, "model_type 'qwen3'"),
    ({"speculators_model_type": "eagle"}, "only eagle3 heads"),
    ({"norm_before_fc": True}, "norm_before_fc is true"),
    # malformed or mistyped fields: refused naming the field, never a crash or a misreading
    ({"transformer_layer_config__num_hidden_layers": "one"},
     "transformer_layer_config.num_hidden_layers must be a positive integer, got 'one'"),
    ({"transformer_layer_config__num_attention_heads": 0},
     "transformer_layer_config.num_attention_heads must be a positive integer, got 0"),
    ({"eagle_aux_hidden_state_layer_ids": 5}, "eagle_aux_hidden_state_layer_ids 5: need three"),
    ({"speculators_config": "x"}, "speculators_config must be an object, got 'x'"),
    ({"speculators_config__verifier": ["a"]}, "speculators_config.verifier must be an object"),
    ({"speculators_config__verifier__architectures": "LlamaForCausalLM"},
     "speculators_config.verifier.architectures must be a list of names"),
    ({"norm_before_residual": "false"}, "norm_before_residual must be true or false, got 'false'"),
    ({"norm_before_fc": "no"}, "norm_before_fc must be true or false"),
    ({"transformer_layer_config__attention_bias": 0},
     "transformer_layer_config.attention_bias must be true or false"),
    ({"transformer_layer_config__hidden_act": "gelu"},
     "hidden_act 'gelu': autospec's layer is SiLU"),
    ({"transformer_layer_config__rope_parameters": "x"},
     "transformer_layer_config.rope_parameters must be an object, got 'x'"),
    ({"transformer_layer_config__rope_parameters__rope_theta": "big"},
     "transformer_layer_config.rope_theta must be a number, got 'big'"),
    ({"transformer_layer_config__rms_norm_eps": None},
     "transformer_layer_config.rms_norm_eps must be a number, got None"),
    ({"draft_vocab_size": 39.5}, "draft_vocab_size must be a positive integer, got 39.5"),
    # Infinity was imported: norms that output zeros, RoPE that does not rotate
    ({"transformer_layer_config__rms_norm_eps": float("inf")},
     "transformer_layer_config.rms_norm_eps must be a finite number, got inf"),
    ({"transformer_layer_config__rope_parameters__rope_theta": float("inf")},
     "transformer_layer_config.rope_theta must be a finite number, got inf"),
])
def test_import_refuses_a_head_that_does_not_fit_tiny(tiny, tmp_path, changes, message):
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    _mutate(tmp_path / "x", **changes)
    with pytest.raises(ImportRefused, match=message):
        read_head(tmp_path / "x", tiny)


@pytest.mark.parametrize("bad", ["x", -1, 2.5, True, [], {}, None])
def test_import_of_any_mistyped_field_is_a_refusal_or_a_head_tiny(tiny, tmp_path, bad):
    """Every field of config.json (top level, speculators_config, the layer's) set to a value
    of another type or out of range: read_head refuses it (ImportRefused) or reads a head,
    never raises anything else."""
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    (tmp_path / "x/manifest.json").unlink()
    good = json.loads((tmp_path / "x/config.json").read_text())
    paths = [[k] for k in good] + [["transformer_layer_config", k]
                                   for k in good["transformer_layer_config"]] + \
        [["speculators_config", k] for k in good["speculators_config"]] + \
        [["transformer_layer_config", "rope_parameters", "rope_theta"]]
    refused = []
    for path in paths:
        data = json.loads(json.dumps(good))
        where = data
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = bad
        (tmp_path / "x/config.json").write_text(json.dumps(data))
        try:
            read_head(tmp_path / "x", tiny)
        except ImportRefused:
            refused.append(path)
    assert ["transformer_layer_config", "hidden_size"] in refused  # required: never read


def _retensor(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    tensors = safetensors.torch.load_file(str(path / "model.safetensors"))
    change(tensors)
    safetensors.torch.save_file(tensors, str(path / "model.safetensors"))
    (path / "manifest.json").unlink(missing_ok=True)


@pytest.mark.parametrize(("config", "change", "message"), [
    # the config's sizes were allocated (the head built) before the tensors were compared with
    # them: RuntimeError "can't allocate memory" (a traceback), or the machine's memory taken
    ({"transformer_layer_config__intermediate_size": 10**15}, None,
     r"tensor layers\.0\.mlp\.down_proj\.weight has shape \(32, 64\), the config implies "
     r"\(32, 1000000000000000\)"),
    # weights of an integer or bool type, NaN weights and float token ids were taken
    (None, lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.int32)}),
     r"tensor fc\.weight has dtype torch\.int32, not a floating-point type"),
    (None, lambda t: t.update({"lm_head.weight": t["lm_head.weight"] > 0}),
     r"tensor lm_head\.weight has dtype torch\.bool"),
    (None, lambda t: t["layers.0.self_attn.q_proj.weight"].view(-1).__setitem__(3, torch.nan),
     r"tensor layers\.0\.self_attn\.q_proj\.weight holds NaN or infinite values"),
    (None, lambda t: t.update({"d2t": t["d2t"].float() + 0.25}),
     r"d2t has dtype torch\.float32: token ids are integers"),
    # float8 weights are weights (isfinite has no float8 kernel: checked in float32)
    (None, lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.float8_e4m3fn)}), None),
])
def test_import_checks_tensors_against_the_config_before_building_the_head_tiny(
        tiny, tmp_path, config, change, message):
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    if config:
        _mutate(tmp_path / "x", **config)
    if change:
        _retensor(tmp_path / "x", change)
    if message is None:
        assert read_head(tmp_path / "x", tiny).config.draft_vocab_size == 40
        return
    with pytest.raises(ImportRefused, match=message):
        read_head(tmp_path / "x", tiny)


def test_import_refuses_pickles_tampering_and_another_embedding_tiny(tiny, other_tiny, tmp_path):
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    (tmp_path / "x/pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(ImportRefused, match="pickle-format"):
        read_head(tmp_path / "x", tiny)
    (tmp_path / "x/pytorch_model.bin").unlink()
    path = tmp_path / "x/model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["embed_tokens.weight"] = other_tiny.model.get_input_embeddings().weight.detach()
    safetensors.torch.save_file(tensors, str(path))
    with pytest.raises(ImportRefused, match="sha256 mismatch"):
        read_head(tmp_path / "x", tiny)
    (tmp_path / "x/manifest.json").unlink()
    with pytest.raises(ImportRefused, match=r"embed_tokens\.weight differs"):
        read_head(tmp_path / "x", tiny)
    tensors["embed_tokens.weight"] = tiny.model.get_input_embeddings().weight.detach()
    safetensors.torch.save_file(tensors, str(path))
    assert read_head(tmp_path / "x", tiny).config.draft_vocab_size == 40  # the target's: fine


def test_import_takes_specforge_names_and_vllm_default_flag_tiny(tiny, tmp_path):
    spec = _head(tiny, norm_before_residual=True)
    export_speculator(spec, tiny, tmp_path / "x", k=3)
    path = tmp_path / "x/model.safetensors"
    tensors = {n.replace("layers.0.", "midlayer."): t
               for n, t in safetensors.torch.load_file(str(path)).items()}
    safetensors.torch.save_file(tensors, str(path))
    data = json.loads((tmp_path / "x/config.json").read_text())
    del data["norm_before_residual"]  # absent: vLLM's default (true) applies
    (tmp_path / "x/config.json").write_text(json.dumps(data))
    (tmp_path / "x/manifest.json").unlink()
    head = read_head(tmp_path / "x", tiny)
    assert head.config.norm_before_residual is True
    order = spec.head.d2t.argsort()
    assert torch.equal(head.head.lm_head.weight, spec.head.lm_head.weight[order])
    assert torch.equal(head.head.layer.q_proj.weight, spec.head.layer.q_proj.weight)


def test_cli_refusals_are_one_line_exit_2(sqlite_url, tmp_path):
    from typer.testing import CliRunner

    from autospec.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["import", str(tmp_path / "nowhere"), "--url", sqlite_url])
    assert missing.exit_code == 2 and "nowhere: no such directory" in missing.output
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["import", str(tmp_path / "empty"), "--url", sqlite_url])
    assert empty.exit_code == 2 and "no config.json" in empty.output
    (tmp_path / "dir-config" / "config.json").mkdir(parents=True)  # it said "no config.json"
    folder = runner.invoke(app, ["import", str(tmp_path / "dir-config"), "--url", sqlite_url])
    assert folder.exit_code == 2 and "config.json: not a file" in folder.output
    actor = runner.invoke(app, ["import", str(tmp_path / "empty"), "--actor", "a" * 129,
                                "--url", sqlite_url])  # before the target loads
    assert actor.exit_code == 2 and "the store keeps at most 128" in actor.output
    store.open_store(sqlite_url, upgrade=True).dispose()  # export never creates one
    unknown = runner.invoke(app, ["export", "nope", "--out", str(tmp_path / "o"),
                                  "--url", sqlite_url])
    assert unknown.exit_code == 2 and "'nope' is not registered" in unknown.output
    fmt = runner.invoke(app, ["export", "nope", "--format", "onnx", "--out",
                              str(tmp_path / "o"), "--url", sqlite_url])
    assert fmt.exit_code == 2 and "unknown format 'onnx'" in fmt.output
    for result in (missing, unknown, fmt):
        assert "Traceback" not in result.output


def test_import_refuses_a_bad_version_name_before_writing_anything_tiny(tiny, db, tmp_path):
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    from autospec.settings import get_settings

    with pytest.raises(ImportRefused, match=r"invalid version name '\.\./escape'"):
        import_head(tmp_path / "x", target=tiny, engine=db, name="../escape")
    assert not (get_settings().resolved_artifact_dir.parent / "escape").exists()


def test_import_keeps_an_existing_directory_it_refuses_to_overwrite_tiny(tiny, db, tmp_path):
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    from autospec.settings import get_settings

    root = get_settings().resolved_artifact_dir
    with store.session_scope(db, readonly=True) as session:
        auto = store.next_version(session, kind="eagle3")
    for name in ("mine", auto):  # named, and the next version's name
        (root / name).mkdir(parents=True)
        (root / name / "keep.txt").write_text("not autospec's")
    with pytest.raises(store.Conflict, match="already exists"):
        import_head(tmp_path / "x", target=tiny, engine=db, name="mine")
    done = import_head(tmp_path / "x", target=tiny, engine=db)  # takes the next free name
    assert done.version != auto and done.artifact.is_dir()
    for name in ("mine", auto):
        assert (root / name / "keep.txt").read_text() == "not autospec's"
        assert [p.name for p in (root / name).iterdir()] == ["keep.txt"]
    assert not list(root.glob(".partial-*"))


@pytest.mark.parametrize("name", ["config.json", "manifest.json", "autospec-settings.json"])
def test_import_of_json_nested_too_deep_is_a_refusal_tiny(tiny, tmp_path, name):
    """A JSON file of 100 000 nested lists: json raises RecursionError, which the readers did
    not catch (a traceback out of autospec import)."""
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    if name != "manifest.json":
        (tmp_path / "x" / "manifest.json").unlink()
    (tmp_path / "x" / name).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ImportRefused, match=f"{name}.*not valid JSON"):
        read_head(tmp_path / "x", tiny)


@pytest.mark.parametrize("instead", ["a directory", "/dev/zero", "a broken link"])
def test_import_of_weights_that_are_not_a_file_says_so_tiny(tiny, tmp_path, instead):
    """It said "no model.safetensors (found ['model.safetensors']; sharded heads are not
    supported)"."""
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    (tmp_path / "x/manifest.json").unlink()
    weights = tmp_path / "x/model.safetensors"
    weights.unlink()
    if instead == "a directory":
        weights.mkdir()
    else:  # a link is refused as one, whatever it points at
        weights.symlink_to(instead if instead.startswith("/") else tmp_path / "gone")
    with pytest.raises(ImportRefused, match=r"model\.safetensors: not a file|"
                                            r"model\.safetensors: a symbolic link"):
        read_head(tmp_path / "x", tiny)


@pytest.mark.parametrize("link", ["model.safetensors", "config.json", "suffix-index",
                                  "suffix-index/model.safetensors", "autospec-settings.json"])
def test_import_refuses_a_symbolic_link_in_the_directory_naming_it_tiny(tiny, db, tmp_path,
                                                                          link):
    """A trial's find: a link inside DIR was followed and what it pointed at imported (a file
    anywhere the importing user could read). Each link here points at the very file it
    replaces, moved out of DIR: only the link itself is wrong."""
    import shutil

    spec = _head(tiny)
    spec.attach_suffix(suffix_from_documents(
        _index_config(spec), [([7, 8], [1, 2, 3, 4, 5, 1, 2, 3, 4, 6])] * 3, tiny))
    export_speculator(spec, tiny, tmp_path / "x", k=3)
    path, outside = tmp_path / "x" / link, tmp_path / "outside" / link
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, outside)
    path.symlink_to(outside)
    with pytest.raises(ImportRefused, match=f"{path}: a symbolic link \\(to {outside}\\): "
                                            "refused, an import reads nothing outside"):
        import_head(tmp_path / "x", target=tiny, engine=db, name="linked")
    with store.session_scope(db, readonly=True) as session, pytest.raises(store.NotFound):
        store.get_speculator(session, version="linked")
    path.unlink()
    shutil.move(outside, path)  # the same files, in DIR: imported
    assert import_head(tmp_path / "x", target=tiny, engine=db, name="copied").version == "copied"


def _as_hf_cache_snapshot(exported: Path, cache: Path) -> Path:
    """``exported``'s files laid out as the Hugging Face cache lays out a download: each file
    a blob under ``models--org--head/blobs``, linked from ``snapshots/<revision>``."""
    import hashlib
    import shutil

    repo = cache / "models--org--head"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    blobs.mkdir(parents=True)
    for file in sorted(p for p in exported.rglob("*") if p.is_file()):
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(exported)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def test_import_takes_a_hugging_face_cache_snapshot_its_links_to_its_blobs_tiny(tiny, db,
                                                                               tmp_path):
    """c22357d refused every link in DIR, so a head downloaded into the Hugging Face cache
    (its snapshot's files are links to the repository's blobs) could not be imported from
    there; those links are taken, a link elsewhere in the same snapshot is still refused."""
    export_speculator(_head(tiny), tiny, tmp_path / "x", k=3)
    snapshot = _as_hf_cache_snapshot(tmp_path / "x", tmp_path / "hub")
    assert import_head(snapshot, target=tiny, engine=db, name="cached").version == "cached"
    outside = tmp_path / "elsewhere.json"
    outside.write_text((snapshot / "config.json").read_text())
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    with pytest.raises(ImportRefused, match=r"config\.json: a symbolic link"):
        import_head(snapshot, target=tiny, engine=db, name="linked-out")


@pytest.mark.parametrize("name", ["manifest.json", "autospec-settings.json",
                                  "suffix-index/config.json", "config.json"])
@pytest.mark.parametrize("instead", ["a directory", "a fifo"])
def test_import_of_a_json_file_that_is_not_a_file_says_so_tiny(tiny, tmp_path, name, instead):
    """A FIFO in its place blocked the import for ever (read_text waits for a writer); a
    directory was an IsADirectoryError. (The FIFO is fed after 10 s, so that without the
    check the test fails rather than hangs.)"""
    import os
    import threading

    spec = _head(tiny)
    spec.attach_suffix(suffix_from_documents(
        _index_config(spec), [([7, 8], [1, 2, 3, 4, 5, 1, 2, 3, 4, 6])] * 3, tiny))
    export_speculator(spec, tiny, tmp_path / "x", k=3)
    path = tmp_path / "x" / name
    if name != "manifest.json":
        (tmp_path / "x/manifest.json").unlink()
    path.unlink()
    if instead == "a directory":
        path.mkdir()
    else:
        os.mkfifo(path)
        feeder = threading.Timer(10, lambda: open(path, "w").close())
        feeder.daemon = True
        feeder.start()
    with pytest.raises(ImportRefused, match=f"{name}: not a file|{name} is not a file"):
        read_head(tmp_path / "x", tiny)
    if instead == "a fifo":
        feeder.cancel()
