"""The per-user testbed cache: `ensure_testbed` builds a variant on first use and reuses it afterwards.

Layout (root = `cache_dir` argument, else $LITERL_CACHE_DIR, else $XDG_CACHE_HOME/literl, else
~/.cache/literl):

    <root>/testbeds/<variant>-<recipe hash>/     config.json, model.safetensors, tokenizer files,
                                                 generation_config.json, manifest.json
    <root>/testbeds/<variant>-<recipe hash>.lock  held while that folder is being built

A folder appears only complete: it is built in a temporary sibling folder, which is renamed into place
(an atomic rename on one file system) after the manifest is written. Concurrent callers (e.g. parallel
training processes of an ablation) serialise on the lock file: one builds, the others wait and then
load its result. A finished folder needs no write access, so a read-only shared cache works.

Prebuilt folders: `literl/testbed/prebuilt/<variant>-<recipe hash>/` ships the `base` testbed as built by its
recipe (3.2 MB). On first use a shipped folder whose name matches the recipe is copied into the cache instead of
building it (seconds instead of ~5 minutes); the copy's manifest says so (`installed_from`). The folder name is
the recipe hash, so an edited recipe never picks up stale shipped weights: it builds. `prebuilt=False` (config
`model.testbed_prebuilt=false`) builds locally; with the build's torch and thread count the weights are
bitwise identical to the shipped ones (tests/testbed/test_prebuilt.py).

Integrity: a folder's manifest records the sha256 of each of its files (`files`; written when it is built or
installed). Every use checks them (a few ms for the base testbed) before the folder is handed out: a changed,
truncated or missing file (a disk error, a half copy, an edit) makes the folder *damaged*, and it is reinstalled
from the shipped copy or rebuilt, with a `TestbedCacheWarning` naming it and the file. A folder cached by an
earlier literl, whose manifest has no `files`, is checked against the shipped manifest it was installed from. The
check reads nothing but the manifest, so it applies to every variant, present and future.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator

from literl.testbed.build import MANIFEST_NAME, build_testbed
from literl.testbed.progress import BuildProgress
from literl.testbed.recipes import TestbedRecipe, recipe_for

LOCK_POLL_SECONDS = 0.2   # only used where fcntl is missing (Windows)
PREBUILT_DIR = Path(__file__).parent / "prebuilt"


class TestbedCacheError(OSError):
    """The testbed cache folder cannot be created or written."""

    __test__ = False   # not a pytest test class despite the name


class TestbedCacheWarning(UserWarning):
    """A cached testbed folder was damaged and is being reinstalled or rebuilt; the message names it."""

    __test__ = False


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The folder that holds `testbeds/` (not created here)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("LITERL_CACHE_DIR"):
        return Path(os.environ["LITERL_CACHE_DIR"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "literl"
    return Path.home() / ".cache" / "literl"


def is_built(folder: Path) -> bool:
    """A folder counts as built once its manifest exists (it is written last, before the rename)."""
    return (folder / MANIFEST_NAME).is_file()


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file of a testbed folder but its manifest (what the manifest's `files` records)."""
    return {item.name: _sha256(item) for item in sorted(Path(folder).iterdir())
            if item.is_file() and item.name != MANIFEST_NAME}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def damage(folder: Path) -> str | None:
    """Why a built folder cannot be used as it is (a file missing or not the one its manifest recorded), or None.

    The expected hashes are the folder's manifest's `files`, else (a folder installed by an earlier literl) those
    of the shipped folder it was installed from; a folder with neither is trusted as it is."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
        expected = manifest.get("files") if isinstance(manifest, dict) else None
    except (OSError, ValueError) as err:
        return f"its {MANIFEST_NAME} cannot be read ({type(err).__name__})"
    if expected is None and isinstance(manifest, dict) and manifest.get("installed_from"):
        expected = _shipped_hashes(folder.name)
    for name, sha in sorted((expected or {}).items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha256(path) != sha:
            return f"{name} does not match the sha256 its manifest recorded ({path.stat().st_size:,} bytes)"
    return None


def _shipped_hashes(name: str) -> dict[str, str] | None:
    try:
        return json.loads((PREBUILT_DIR / name / MANIFEST_NAME).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None


def _record_hashes(folder: Path) -> None:
    """Add the folder's file hashes to its manifest (before the folder is renamed into place)."""
    manifest = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    manifest["files"] = file_hashes(folder)
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, *, on_wait=None) -> Iterator[None]:
    """Hold an exclusive advisory lock on `lock_path` (created if missing); call `on_wait()` if blocked.

    The OS releases the lock when the process dies, so a crashed build never leaves a stale lock.
    """
    with open(lock_path, "a+b") as handle:
        if sys.platform == "win32":
            import msvcrt
            while True:
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
                    break
                except OSError:
                    if on_wait is not None:
                        on_wait()
                        on_wait = None
                    time.sleep(LOCK_POLL_SECONDS)
            try:
                yield
            finally:
                handle.seek(0)
                msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
            return
        import fcntl
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _writable_testbeds_folder(root: Path) -> Path:
    folder = root / "testbeds"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-")
        probe.close()
    except OSError as err:
        raise TestbedCacheError(
            f"cannot write the literl testbed cache at {folder} ({err.strerror or err}). Set LITERL_CACHE_DIR "
            "(or pass cache_dir=) to a writable folder.") from err
    return folder


@contextlib.contextmanager
def _staged(target: Path) -> Iterator[Path]:
    """A private sibling folder to fill; renamed into place as `target` when the block ends without error."""
    # Leftovers of a build that crashed; safe to delete because the caller holds this name's lock.
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.exists():   # a folder without a manifest was not made by us: replace it
        shutil.rmtree(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)   # mkdtemp makes it private; a shared cache must be readable by others
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _build_into_place(recipe: TestbedRecipe, target: Path, *, progress: bool,
                      base_dir: Path | None) -> None:
    with _staged(target) as staging, BuildProgress(target.name, enabled=progress) as reporter:
        build_testbed(recipe, staging, progress=reporter, base_dir=base_dir)
        _record_hashes(staging)


def prebuilt_folder(recipe: TestbedRecipe) -> Path | None:
    """The folder shipped with literl for exactly this recipe, or None."""
    folder = PREBUILT_DIR / recipe.folder_name()
    return folder if is_built(folder) else None


def _install_prebuilt(shipped: Path, target: Path, *, progress: bool) -> None:
    """Copy a shipped folder into the cache; its manifest, written last, records where it came from."""
    with _staged(target) as staging:
        for item in shipped.iterdir():
            if item.is_file() and item.name != MANIFEST_NAME:
                shutil.copyfile(item, staging / item.name)
        manifest = json.loads((shipped / MANIFEST_NAME).read_text())
        manifest.setdefault("files", file_hashes(staging))
        manifest["installed_from"] = "prebuilt: shipped with literl (literl/testbed/prebuilt/), not built here"
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
        problem = damage(staging)
        if problem:         # the clone's own copy is damaged: do not install it
            raise TestbedCacheError(f"the testbed shipped in {shipped} is damaged: {problem}. Restore it (e.g. "
                                    "git checkout literl/testbed/prebuilt), or build it with "
                                    "model.testbed_prebuilt=false")
    if progress:
        print(f"literl: testbed {target.name}: installed the weights shipped with literl (built by this recipe; "
              "model.testbed_prebuilt=false builds it here instead, about 5 min)", file=sys.stderr, flush=True)


def ensure_testbed(variant: str | TestbedRecipe = "base", *, cache_dir: str | os.PathLike | None = None,
                   progress: bool = True, prebuilt: bool = True) -> Path:
    """The Hugging Face folder of a testbed variant, built (with a progress bar) on first use.

    `variant` is a name ("base", "aligned", "micro", "moe") or a `TestbedRecipe` (e.g. a changed seed).
    With `prebuilt` (the default) a variant shipped with literl for this exact recipe is copied into the cache
    instead of built; an already cached folder is used either way. Raises `TestbedCacheError` if the cache
    cannot be written and `TestbedBuildError` if the warm-up cannot reach its accuracy band.
    """
    recipe = recipe_for(variant) if isinstance(variant, str) else variant
    root = cache_root(cache_dir)
    target = root / "testbeds" / recipe.folder_name()
    problem = damage(target) if is_built(target) else None
    if is_built(target) and problem is None:
        return target
    try:
        folder = _writable_testbeds_folder(root)
    except TestbedCacheError as err:
        if problem is None:
            raise
        raise TestbedCacheError(f"the cached testbed {target} is damaged ({problem}) and cannot be repaired here: "
                                f"{err}. Delete that folder (the next use reinstalls or rebuilds it), or set "
                                "LITERL_CACHE_DIR to a writable folder") from None
    base_dir = None
    if recipe.alignment is not None:
        base_dir = ensure_testbed(recipe.base_recipe(), cache_dir=root, progress=progress, prebuilt=prebuilt)
    shipped = prebuilt_folder(recipe) if prebuilt else None

    def announce_wait():
        if progress:
            print(f"literl: waiting for another process to finish building testbed {target.name}",
                  file=sys.stderr, flush=True)

    with exclusive_lock(folder / f"{target.name}.lock", on_wait=announce_wait):
        # (another process may have made or repaired it while we waited)
        problem = damage(target) if is_built(target) else None
        if is_built(target) and problem is None:
            return target
        if problem is not None:
            repair = "reinstalling the shipped copy" if shipped is not None else "rebuilding it"
            warnings.warn(f"the cached testbed {target} is damaged ({problem}): {repair}", TestbedCacheWarning,
                          stacklevel=2)
        if shipped is not None:
            _install_prebuilt(shipped, target, progress=progress)
        else:
            _build_into_place(recipe, target, progress=progress, base_dir=base_dir)
    return target
