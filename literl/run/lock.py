"""One writer per directory: an exclusive lock on a run directory (or an ablation's folder) held for the whole run.

Two `literl train` on one `trainer.output_dir` (or a resume started while the run still runs, or two
`literl ablate` on one `--out`) would interleave their logs and overwrite each other's checkpoints. The first
process takes `flock(LOCK_EX)` on `<dir>/.lock` and writes its pid there; a second one is refused with a
message naming that pid. The operating system drops the lock when the holder exits in any way (kill -9
included), so a lock is never stale: the file may stay behind, the lock does not.

flock locks belong to an open file, so two opens in one process exclude each other too (a notebook that starts
a second run on the same directory is refused like a second process). On network filesystems without flock
support the lock is skipped with a warning rather than blocking every run.
"""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path

from literl.data.no_follow import open_fd

LOCK_NAME = ".lock"


class DirectoryBusy(RuntimeError):
    """Another live process holds the directory's lock."""


class DirectoryLock:
    """Exclusive, non-blocking lock on `<directory>/.lock`; `release()` (or the process's end) drops it."""

    def __init__(self, directory: str | Path, *, what: str = "run directory"):
        self.directory = Path(directory)
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "DirectoryLock":
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK_NAME
        # Never through a link: truncating `.lock` below would empty whatever file a planted link points to.
        fd = open_fd(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_pid(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = f"pid {holder}" if holder else "another process"
                raise DirectoryBusy(
                    f"{self.what} {self.directory} is in use by another literl process ({pid}); two writers would "
                    f"mix their logs and checkpoints. Wait for it to finish (or stop it: kill {holder or '<pid>'}), "
                    f"or choose another directory.") from None
            warnings.warn(f"could not lock {path} ({err.strerror}); nothing stops a second process from writing "
                          f"to {self.directory} at the same time", stacklevel=2)
            return self
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)       # a leftover file names no holder
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "DirectoryLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):      # a lock dropped without release() (e.g. components never trained) frees its file
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
