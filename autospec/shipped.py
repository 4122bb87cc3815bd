"""Where the directories shipped beside the code are: ``policies/`` and ``migrations/``.

In the repository both sit at the top level, beside ``autospec/``; a wheel installs them as
the packages ``autospec.policies`` and ``autospec.migrations`` (setuptools ``package-dir``
in ``pyproject.toml``). :func:`shipped_dir` returns the copy that belongs to the imported
``autospec``:

- imported from a source checkout (an editable install, or the checkout on ``PYTHONPATH``):
  the checkout's top-level directory — a ``package-dir`` mapping is not visible through
  ``PYTHONPATH``, and an editable install's finder may name another checkout's copy;
- imported from an installed wheel: the package, through :mod:`importlib.resources`.

Knows nothing of what the files mean (policies: :mod:`autospec.controller.policy`,
migrations: :mod:`autospec.store.migrate`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

Shipped = Literal["policies", "migrations"]

_CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The source checkout this ``autospec`` was imported from, or None (an installed wheel)."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "policies").is_dir():
        return _CHECKOUT
    return None


def shipped_dir(name: Shipped) -> Traversable:
    """The ``policies`` or ``migrations`` directory that ships with this ``autospec``."""
    root = checkout_root()
    if root is not None:
        return root / name
    return resources.files(f"autospec.{name}")
