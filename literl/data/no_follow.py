"""Opening the files literl creates in a run or ablation folder without following a symbolic link.

A link put where literl keeps one of its own files (`.lock`, metrics.jsonl, train.log …) would make an ordinary
open write through it: truncating a lock file or appending a metric line would change whatever file the link
points to, anywhere the user can write. These opens pass O_NOFOLLOW, so the kernel refuses a link in the last
path component, and the refusal names the file and the fix. (Files written atomically, `literl.data.files`,
are safe already: `os.replace` swaps the link itself for the new file, never its target.)
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO


class LinkRefused(FileExistsError):
    """A symbolic link stands where literl creates a file of its own."""


def refuse_link(path: str | Path) -> LinkRefused:
    return LinkRefused(f"{path} is a symbolic link, and literl does not write through a link it did not make (it "
                       f"would change the file the link points to). Remove the link (rm {path}) or choose another "
                       f"folder")


def open_fd(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """`os.open(path, flags | O_NOFOLLOW)`; a link at `path` raises `LinkRefused` (nothing is opened)."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), mode)
    except OSError as err:
        # ELOOP on Linux and macOS; some BSDs answer EMLINK for a link under O_NOFOLLOW
        if err.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise refuse_link(path) from None
        raise


def open_append(path: str | Path, *, binary: bool = False) -> IO:
    """A file opened for appending (created when missing), as `open(path, "a")`, but never through a link."""
    fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "ab" if binary else "a", **({} if binary else {"encoding": "utf-8"}))
