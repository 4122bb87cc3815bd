"""Who a command acts as in the audit log: ``cli:<user>`` (the operating system's user name),
``cli`` where it has none. One default for every command that records an event."""

from __future__ import annotations

import getpass


def cli_actor() -> str:
    """``cli:<user>``, else ``cli``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"
