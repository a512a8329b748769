"""File helpers shared by every stage: atomic writes and JSON reads with one-line errors."""

import errno
import json
import os
import tempfile
from pathlib import Path

from osdp_sim.errors import UserError


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: never half a file.
    A folder that cannot be made or written to is a UserError naming the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write here ({e.strerror}); give a path in a writable folder",
                        source=str(path)) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def check_writable(path: str | os.PathLike, field: str | None = None, *, folder: bool = False) -> None:
    """Before long work that ends in writing `path` (or, with folder=True, files inside the folder
    `path`): a UserError now rather than a lost result later.

    Every command's output flags use this, with one policy: a missing folder is created (as the
    write would). A file path must not be a folder or an existing non-file (a device such as
    /dev/null would be replaced by the atomic rename), and a file must really be creatable in the
    folder: a temporary file is made and removed there, since os.access says yes for root on /proc
    or a read-only mount."""
    path = Path(path)
    where = {"source": str(path), "field": field}
    if folder:
        if path.exists() and not path.is_dir():
            raise UserError("exists and is not a folder; give a folder", **where)
        target = path
    else:
        if path.is_dir():
            raise UserError("is a folder; give a file path (e.g. a name inside it)", **where)
        if path.exists() and not path.is_file():
            raise UserError("exists and is not a regular file; give a file path", **where)
        target = path.parent
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        file = _first_file(target)
        why = (f"{file} is a file" if file else _SPECIAL if e.errno == errno.ENOENT else e.strerror)
        raise UserError(f"cannot create {'it' if folder else 'its folder'} ({why})", **where) from None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".osdp-sim-", suffix=".check", dir=target)
    except OSError as e:
        why = _SPECIAL if e.errno == errno.ENOENT else e.strerror
        raise UserError(f"cannot write a file in {target} ({why}); give a path in a writable folder",
                        **where) from None
    os.close(fd)
    os.unlink(tmp)


# ENOENT for a folder that exists (or whose parent does): /proc, /sys and the like
_SPECIAL = "a special filesystem that holds no files"


def _first_file(folder: Path) -> Path | None:
    """The nearest of `folder` and its parents that exists as a non-folder (why mkdir failed)."""
    for p in (folder, *folder.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def read_json(path: str | os.PathLike, kind: str, hint: str = ""):
    """Parsed JSON of a file, or a UserError naming the file ("plan file not found", ...)."""
    src = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"{kind} file not found", source=src) from None
    except OSError as e:
        raise UserError(f"cannot read {kind} file ({e.strerror})", source=src) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"not valid JSON (line {e.lineno}: {e.msg}){hint}", source=src) from None
