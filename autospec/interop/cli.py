"""``autospec export`` and ``autospec import``: speculators for vLLM, public heads in.

Thin commands: resolve the version (or directory), load the target in float32, call
:func:`autospec.interop.export.export_speculator` / :func:`autospec.interop.importer.import_head`,
print. Refusals (an unknown version, a kind vLLM has no method for, a head that does not fit
the target, a non-empty output directory) are one line on stderr, exit status 2.
"""

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from autospec.actor import cli_actor
from autospec.cli_options import DatabaseUrl

out = Console()
err = Console(stderr=True)

TargetOpt = Annotated[str | None, typer.Option(
    help="the target: a name, a directory or a .gguf (default: what the default deployment's "
    "replicas serve, else smollm2-135m)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object")]


@contextmanager
def _refusals() -> Iterator[None]:
    from autospec.engine.target import TargetLoadError
    from autospec.interop.export import ExportError
    from autospec.interop.importer import ImportRefused
    from autospec.store.errors import StoreError
    from autospec.versions import VersionLoadError

    try:
        yield
    except (ExportError, ImportRefused, VersionLoadError, TargetLoadError, StoreError,
            OSError) as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        err.print(Text.assemble(("error:", "bold red"), " ", text), soft_wrap=True)
        raise typer.Exit(2) from None


def export(
    version: Annotated[str, typer.Argument(help="the version to export (or builtin-ngram)")],
    out_dir: Annotated[Path, typer.Option("--out", help="directory to write (new or empty)")],
    fmt: Annotated[str, typer.Option("--format", help="output format (speculators: what "
                                     "vLLM loads)")] = "speculators",
    k: Annotated[int, typer.Option("--k", min=1, max=16, help="num_speculative_tokens in the "
                                   "written speculative_config")] = 5,
    target: TargetOpt = None,
    database_url: DatabaseUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Export a version for vLLM: an eagle3 head in the speculators format, a draft as a
    LlamaForCausalLM directory, ngram/suffix as vLLM's speculative_config; see docs/vllm.md."""
    logging.getLogger("autospec").setLevel(logging.WARNING)
    with _refusals():
        from autospec import store
        from autospec.engine.target import load_target
        from autospec.interop.export import (
            FORMATS,
            ExportError,
            check_out_dir,
            export_speculator,
        )
        from autospec.versions import BUILTIN_VERSION, check_registered, load_speculator_version

        if fmt not in FORMATS:
            raise ExportError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
        check_out_dir(out_dir)  # before the target loads (seconds)
        db = None  # builtin-ngram for a given target reads nothing stored (a fresh machine)
        if version != BUILTIN_VERSION or target is None:
            db = store.open_store(database_url)  # read only: a missing store is not created
            check_registered(db, [version])
        source = _source(db, version) if version != BUILTIN_VERSION else {"version": version}
        model = load_target(_target(db, target), dtype="float32")
        _, spec = load_speculator_version(db, model, version)
        result = export_speculator(spec, model, out_dir, k=k, source=source, fmt=fmt)
    if as_json:
        out.print_json(json.dumps({"version": version, **result.as_dict()}))
        return
    out.print(Text.assemble("exported ", (version, "bold"),
                            f" ({result.kind}) to {result.out}: {', '.join(result.files)}"))
    out.print(Text("serve with: python -m vllm.entrypoints.openai.api_server --model <target "
                   f"dir> --speculative-config '{json.dumps(result.speculative_config)}'"),
              soft_wrap=True)
    for note in result.notes:
        out.print(Text(f"note: {note}"))


def _target(db, target: str | None) -> str:  # type: ignore[no-untyped-def]
    """The target given, else the one the default deployment serves (its numerics record);
    loaded in float32, the format's dtype, whatever the replicas decode in."""
    from autospec.numerics import resolve

    return target or resolve(db, deployment="default")[0]


def _source(db, version: str) -> dict:  # type: ignore[no-untyped-def]
    """The version's provenance for the export's manifest; a pruned version, or an artifact
    missing or without a readable manifest, is refused (VersionLoadError) naming it."""
    from autospec import artifacts, store
    from autospec.store.artifacts import local_path
    from autospec.versions import VersionLoadError, pruned_error

    with store.session_scope(db, readonly=True) as session:
        row = store.get_speculator(session, version=version)
        uri, sha, pruned = row.artifact_uri, row.sha256, (row.meta or {}).get("pruned")
    if pruned:
        raise pruned_error(version, pruned)
    path = local_path(uri)
    try:
        files = artifacts.read_manifest(path) if path is not None else {}
    except artifacts.ManifestError as exc:
        raise VersionLoadError(f"version {version!r}: {exc}") from None
    return {"version": version, "artifact": uri, "sha256": sha, "files": files}


def import_(
    directory: Annotated[Path, typer.Argument(help="a speculators-format eagle3 head "
                                              "(config.json + model.safetensors)")],
    name: Annotated[str | None, typer.Option(help="version name (default: the next "
                                             "eagle3-<date>-<n>)")] = None,
    target: TargetOpt = None,
    actor: Annotated[str | None, typer.Option(
        help="who imports (audit log; default: cli:<your user name>, as promote)")] = None,
    assignments: Annotated[list[str] | None, typer.Option("--set", help=(
        "a setting of the head the speculators format has no field for, KEY=VALUE (repeat; "
        "ttt_steps, suffix_threshold, tree_nodes, tree_min_prob, tree_width), over the ones "
        "autospec export stored or the defaults; tree_nodes=0 serves on vLLM"))] = None,
    database_url: DatabaseUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a speculators-format EAGLE-3 head (speculators, SpecForge, published) as a
    candidate version of the target, after checking it fits; audited as an import event."""
    logging.getLogger("autospec").setLevel(logging.WARNING)
    with _refusals():
        from autospec import store
        from autospec.engine.target import load_target
        from autospec.interop.importer import (
            ImportRefused,
            check_name,
            import_head,
            parse_settings,
            refuse_unless_file,
        )

        store.check_actor(actor or cli_actor())  # before the target is loaded
        settings = parse_settings(assignments or [])
        if not directory.is_dir():
            raise ImportRefused(f"{directory}: " + ("a file, not a directory" if directory.exists()
                                                    else "no such directory"))
        refuse_unless_file(directory / "config.json")  # before the target loads
        if not (directory / "config.json").is_file():
            raise ImportRefused(f"{directory}: no config.json (not a speculators directory)")
        check_name(None, name)  # its form, before a store is opened (or created)
        db = store.open_store(database_url, upgrade="create")
        check_name(db, name)  # free: before the target is loaded
        model = load_target(_target(db, target), dtype="float32")
        done = import_head(directory, target=model, engine=db, name=name,
                           actor=actor or cli_actor(), settings=settings)
    if as_json:
        out.print_json(json.dumps({"version": done.version, "artifact": str(done.artifact),
                                   "sha256": done.sha256, "source": done.source,
                                   **done.details}))
        return
    out.print(Text.assemble("imported ", (done.version, "bold"), f" (candidate) from "
                            f"{done.source}; artifact {done.artifact} sha256 {done.sha256[:16]}…"))
