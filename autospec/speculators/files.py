"""Tensors to and from files, the one way every artifact writer and reader does it.

:func:`portable` is what a stored tensor is (CPU, contiguous, float32 for floating tensors,
integers kept); :func:`save_tensors` writes them with safetensors; :func:`tensor_sha256`
hashes one as stored; :func:`refuse_pickles` refuses a directory holding a pickle-format
file (nothing is ever unpickled). Used by checkpoints, the kinds' exporters and
``autospec import``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from autospec.file_modes import save_safetensors

#: weights file of an artifact, an export and an export's sidecar
WEIGHTS_FILE = "model.safetensors"
#: suffixes of pickle-format weight files, refused wherever a directory is read
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def portable(tensor: torch.Tensor) -> torch.Tensor:
    """CPU, contiguous, float32 for floating tensors (integers keep their dtype)."""
    tensor = tensor.detach().to("cpu")
    if tensor.is_floating_point():
        tensor = tensor.float()
    return tensor.contiguous().clone()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` (made :func:`portable`) to the safetensors file ``path``, with the
    mode the umask gives a new file (:func:`autospec.file_modes.save_safetensors`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors({n: portable(t) for n, t in tensors.items()}, path,
                     metadata={"format": "pt"})


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes (CPU, contiguous), as stored in safetensors."""
    t = tensor.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def refuse_pickles(root: Path, error: type[Exception], advice: str) -> None:
    """Raise ``error`` naming the first pickle-format file under ``root``, then ``advice``."""
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise error(f"{path}: refusing a pickle-format file ({path.suffix}); {advice}")
