"""Reading a text file a user names on the command line (a policy, segment rules, a load
schedule, a replay file): what can be wrong with it is one line naming the file — missing, a
directory, unreadable, not UTF-8 — never an ``OSError`` or ``UnicodeDecodeError`` traceback.
Each caller wraps :class:`TextFileError` in its own error (a policy's, a usage error)."""

from __future__ import annotations

from pathlib import Path


class TextFileError(ValueError):
    """The file cannot be read as UTF-8 text; the message names it and why."""


def read_text_file(path: Path, what: str) -> str:
    """The UTF-8 text of ``path``; :class:`TextFileError` ("``what`` PATH is a directory",
    "PATH: not UTF-8 text (invalid start byte at byte 0)", ...) otherwise."""
    if path.is_dir():
        raise TextFileError(f"{what} {path} is a directory, not a file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TextFileError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise TextFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None
    except OSError as exc:
        raise TextFileError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
