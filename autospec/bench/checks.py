"""What every ``autospec bench`` command checks before it loads a target or starts Ray: the
target names one (a known name, a model directory, a .gguf), each dtype is one the engine
takes, a checkpoint option names a directory, an output directory option is not a file. Each
is a usage error naming the option (exit 2), never a traceback after the model has loaded or
the traffic has been logged."""

from __future__ import annotations

from pathlib import Path

import typer


def checked_target(target: str, *dtypes: str) -> None:
    """``--target`` names a target on this machine and every ``--dtype`` is known, without
    loading anything ('tiny': the soak's random-init target, always there)."""
    from autospec.engine.target import TargetLoadError, check_dtype, check_spec

    try:
        for dtype in dtypes:
            check_dtype(dtype)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dtype") from None
    if target == "tiny":
        return
    try:
        check_spec(target)
    except TargetLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--target") from None


def checked_directory(path: Path | None, option: str) -> None:
    """An option naming a directory to read (a checkpoint, an artifact): it must be one."""
    if path is not None and not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise typer.BadParameter(f"{path} {what}; it names a directory", param_hint=option)


def checked_out_directory(path: Path | None, option: str) -> None:
    """An option naming a directory to write into (created if missing): not a file."""
    if path is not None and path.exists() and not path.is_dir():
        raise typer.BadParameter(f"{path} is a file; it names a directory", param_hint=option)


def checked_checkpoint(path: Path, option: str) -> None:
    """A speculator checkpoint option: a directory whose manifest checks out (its fit to the
    target is known only once the target loads)."""
    from autospec.speculators.checkpoint import SpeculatorLoadError, verify_manifest

    checked_directory(path, option)
    try:
        verify_manifest(path)
    except SpeculatorLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None



def checked_out_file(path: Path | None, option: str) -> None:
    """An option naming a file to write at the end: its folder exists and it is no folder."""
    if path is None:
        return
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory; name the file to write",
                                 param_hint=option)
    if not path.parent.is_dir():
        raise typer.BadParameter(f"{path.parent} is not a directory", param_hint=option)


def checked_store(url: str | None) -> None:
    """``--database-url`` of a bench that serves the store's live version: a store this code
    can read, checked before Ray starts (a malformed URL failed the replicas' deploy)."""
    from autospec.store import StoreError
    from autospec.store.migrate import open_store

    if url is None:
        return
    try:
        open_store(url).dispose()
    except StoreError as exc:
        raise typer.BadParameter(str(exc), param_hint="--database-url") from None
