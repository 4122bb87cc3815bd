"""Files get the permission bits the umask gives, however they were written or copied.

safetensors' ``save_file`` (0.8) writes a private temporary file (mode 0600) beside the
destination and renames it into place, so every weights file came out 0600 while the
``config.json`` and ``manifest.json`` beside it were 0644 (umask 022): another user — a vLLM
reading an ``autospec export`` from shared storage, whoever reads a backup — could read the
config and not the weights. :func:`save_safetensors` is the one way autospec writes a
safetensors file: ``save_file``, then :func:`as_created`, which gives the file the bits
``open(path, "w")`` would have (``0o666`` less the umask: 0644 under 022, 0640 under 027,
0600 under 077). :func:`copy_as_created` copies a file's bytes, not its mode (backups and
restores copy artifact directories with it), so a copy too is as the umask says, whatever
the mode of the file copied (an artifact written before the fix above).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any


def umask() -> int:
    """This process's umask, read without changing it where the platform shows it (Linux:
    ``/proc/self/status``); elsewhere set to 077 for an instant (a file another thread
    creates then is stricter, never looser) and put back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def as_created(path: str | Path) -> None:
    """Give the file ``path`` the permission bits a new file gets (``0o666`` less the umask)."""
    os.chmod(path, 0o666 & ~umask())


def save_safetensors(tensors: dict[str, Any], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` (tensors contiguous, on the CPU or not), the file then
    :func:`as_created` (see the module doc)."""
    import safetensors.torch

    safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    as_created(path)


def copy_as_created(source: str | Path, dest: str | Path) -> str:
    """Copy ``source``'s bytes to ``dest``, created as a new file is (a ``copy_function`` of
    ``shutil.copytree``: its mode, unlike ``copy2``'s, is not ``source``'s)."""
    return shutil.copyfile(source, dest)
