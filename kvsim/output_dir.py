"""Output directories: kvsim deletes, replaces or writes into only directories it wrote itself.

Every directory kvsim writes carries a marker file, :data:`MARKER`. :func:`check_output_dir`
decides, before any work is done, whether a directory may be used:

* never the filesystem root, the home directory, the current directory, or a directory that
  contains any of them (``.``, ``..``, ``~`` ...), and never a symbolic link;
* if it exists it must be a directory that is empty or carries the marker (anything else is a
  foreign directory, refused);
* if it does not exist, its nearest existing ancestor must be a writable directory (not a file,
  not read-only: the write-permission bits are honoured even for root, so a read-only directory
  is refused the same way everywhere).

Two ways of writing:

* :class:`ReplacedDir` (``kvsim run``, ``kvsim replay-cache``): the new output is written into a
  staging directory beside the final one, created before the work starts (which proves the
  location writable); when complete, the old directory is moved aside, the new one moved in,
  then the old one deleted. An interrupt at any moment leaves one complete output: at the final
  path, or, between the two renames, at the aside path, which the next write to that path moves
  back before it starts.
* :func:`open_output_dir` (sweeps, validation, calibration, copy-model comparisons): commands
  that add files to a directory; it is created with the marker, or must already carry it (or be
  empty).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from types import TracebackType

from kvsim.errors import KvsimError

MARKER = ".kvsim-output"
MARKER_TEXT = "This directory was written by kvsim; kvsim may replace or add to it.\n"
_NEW = ".kvsim-new-"  # staging siblings: .NAME.kvsim-new-XXXX
_OLD = ".kvsim-old-"  # the previous output moved aside: .NAME.kvsim-old-XXXX


class OutputDirError(KvsimError, ValueError):
    """An output directory that kvsim must not use; the message names it and the option."""


def is_kvsim_dir(path: Path) -> bool:
    """Does ``path`` carry kvsim's marker (so kvsim wrote it)?"""
    return (path / MARKER).is_file()


def _protected(resolved: Path) -> str | None:
    """Why ``resolved`` may never be an output directory, or None."""
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if resolved == Path(resolved.anchor):
        return "is the filesystem root"
    if resolved == cwd:
        return "is the current directory"
    if resolved in cwd.parents:
        return "contains the current directory"
    if resolved == home:
        return "is the home directory"
    if resolved in home.parents:
        return "contains the home directory"
    return None


def is_writable_dir(directory: Path) -> bool:
    """Write permission on ``directory``, by its mode bits as well (so also for root)."""
    mode = directory.stat().st_mode
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(directory, os.W_OK)


def check_output_dir(path: str | Path, option: str = "--out") -> Path:
    """``path`` if kvsim may write it (see the module docstring); raises :class:`OutputDirError`."""
    path = Path(path)
    where = f"{option} {path}"
    if path.is_symlink():
        raise OutputDirError(f"{where}: is a symbolic link; give the directory itself")
    resolved = path.resolve()
    why = _protected(resolved)
    if why:
        raise OutputDirError(f"{where}: {why}; kvsim writes its output into a directory of its own")
    if path.exists():
        if not path.is_dir():
            raise OutputDirError(f"{where}: exists and is not a directory")
        if not is_kvsim_dir(path) and any(path.iterdir()):
            raise OutputDirError(f"{where}: exists and was not written by kvsim (no {MARKER} "
                                 "file); kvsim replaces only its own output: choose a new or "
                                 "empty directory")
        if not is_writable_dir(path):
            raise OutputDirError(f"{where}: is read-only")
        if not is_writable_dir(path.parent if path.parent.exists() else path):
            raise OutputDirError(f"{where}: its parent {path.parent} is read-only")
        return path
    ancestor = path.parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link in the way
            raise OutputDirError(f"{where}: {ancestor} is a broken symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputDirError(f"{where}: {ancestor} is a file, not a directory")
    if not is_writable_dir(ancestor):
        raise OutputDirError(f"{where}: cannot be created: {ancestor} is read-only")
    return path


def _mark(directory: Path) -> None:
    (directory / MARKER).write_text(MARKER_TEXT)


def open_output_dir(path: str | Path, option: str = "--out") -> Path:
    """Check ``path``, create it (with its parents) if missing, mark it, and return it."""
    path = check_output_dir(path, option)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not is_kvsim_dir(path):
            _mark(path)
    except OSError as e:
        raise OutputDirError(f"{option} {path}: cannot write: {e.strerror or e}") from None
    return path


def _siblings(path: Path, kind: str) -> list[Path]:
    if not path.parent.exists():
        return []
    return sorted(p for p in path.parent.glob(f".{path.name}{kind}*")
                  if p.is_dir() and not p.is_symlink() and is_kvsim_dir(p))


def _recover(path: Path) -> None:
    """Undo what an interrupted replacement of ``path`` left: the previous output moved aside
    comes back when nothing took its place; half-written staging directories go."""
    for staging in _siblings(path, _NEW):
        shutil.rmtree(staging)
    aside = _siblings(path, _OLD)
    if aside and not path.exists():
        os.replace(aside.pop(), path)
    for old in aside:
        shutil.rmtree(old)


class ReplacedDir:
    """A context manager: a staging directory that replaces ``path`` when the block succeeds.

    Construction checks ``path`` (:func:`check_output_dir`); ``__enter__`` creates the marked
    staging directory and returns it; on success ``__exit__`` swaps it in, on an exception it
    removes it and leaves ``path`` as it was.
    """

    def __init__(self, path: str | Path, option: str = "--out") -> None:
        self.path = check_output_dir(path, option)
        self.option = option
        self.staging: Path | None = None

    def __enter__(self) -> Path:
        try:
            _recover(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.staging = Path(tempfile.mkdtemp(prefix=f".{self.path.name}{_NEW}",
                                                 dir=self.path.parent))
            _mark(self.staging)
        except OSError as e:
            raise OutputDirError(f"{self.option} {self.path}: cannot write: "
                                 f"{e.strerror or e}") from None
        return self.staging

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        staging, self.staging = self.staging, None
        if staging is None:
            return
        if exc_type is not None:
            shutil.rmtree(staging, ignore_errors=True)
            return
        self._swap_in(staging)

    def _swap_in(self, staging: Path) -> None:
        path = self.path
        if path.exists() and not path.is_symlink() and path.is_dir() and is_kvsim_dir(path):
            aside = Path(tempfile.mkdtemp(prefix=f".{path.name}{_OLD}", dir=path.parent))
            os.replace(path, aside)  # replaces the empty placeholder mkdtemp made
            os.replace(staging, path)
            shutil.rmtree(aside)
            return
        if path.exists():
            try:
                path.rmdir()  # an empty directory (checked before the run) is replaced too
            except OSError:
                raise OutputDirError(
                    f"{self.option} {path}: changed during the run and is no longer kvsim's or "
                    f"empty; the new output is left in {staging}") from None
        os.replace(staging, path)
