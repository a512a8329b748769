"""File helpers shared by every stage: atomic writes and JSON reads with one-line errors."""

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


def check_writable(path: str | os.PathLike, field: str | None = None) -> None:
    """Make the folder of `path` and check it can be written, before long work that ends in a
    write: a UserError now rather than a lost result later."""
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = f"{folder} is a file" if folder.is_file() else e.strerror
        raise UserError(f"cannot create its folder ({why})", source=str(path), field=field) from None
    if not os.access(folder, os.W_OK):
        raise UserError("its folder is not writable", source=str(path), field=field)


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
