"""File helpers shared by every stage: atomic writes, and text / JSON / YAML reads whose every
failure (missing, a folder, unreadable, not UTF-8, not valid, nested too deeply, an alias bomb)
is a one-line UserError naming the file."""

import errno
import json
import os
import tempfile
from pathlib import Path

import yaml

from osdp_sim.errors import UserError

# A YAML document may expand to at most this many nodes once its aliases are followed: real
# profiles and campaigns have a few thousand; a "billion laughs" file of 3.5 KB has billions.
YAML_MAX_EXPANDED_NODES = 200_000
# Profiles, plans, records and campaigns are kilobytes; more than this is the wrong file (or
# /dev/zero), refused before it fills the memory.
MAX_INPUT_BYTES = 64 * 2**20


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename: never half a file.
    The file gets the mode a plain open() would give it (0666 less the umask, or the mode of the
    file it replaces), not mkstemp's 0600. A folder that cannot be made or written to is a
    UserError naming the path."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"cannot write here ({e.strerror}); give a path in a writable folder",
                        source=str(path)) from None
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
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


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


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


def read_text(path: str | os.PathLike, kind: str) -> str:
    """The UTF-8 text of a file, or a UserError naming it: not found, a directory, unreadable,
    larger than MAX_INPUT_BYTES, or not UTF-8 (with the first bad byte and its offset)."""
    src = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{kind} file not found", source=src) from None
    except IsADirectoryError:
        raise UserError(f"is a directory, not a {kind} file", source=src) from None
    except OSError as e:
        raise UserError(f"cannot read {kind} file ({e.strerror})", source=src) from None
    if len(data) > MAX_INPUT_BYTES:
        raise UserError(f"larger than {MAX_INPUT_BYTES // 2**20} MiB; not a {kind} file", source=src)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        f"save the {kind} file as UTF-8", source=src) from None


def read_json(path: str | os.PathLike, kind: str, hint: str = ""):
    """Parsed JSON of a file, or a UserError naming the file ("plan file not found", ...)."""
    return parse_json(read_text(path, kind), str(path), hint)


def parse_json(text: str, source: str, hint: str = ""):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"not valid JSON (line {e.lineno}: {e.msg}){hint}", source=source) from None
    except RecursionError:
        raise UserError("not a usable JSON file (nested too deeply)", source=source) from None
    except ValueError as e:          # e.g. an integer of more than 4300 digits
        raise UserError(f"not a usable JSON file ({str(e).split(';')[0]})", source=source) from None


def read_yaml(path: str | os.PathLike, kind: str):
    """Parsed YAML of a file (safe types only, alias expansion bounded), or a UserError naming it."""
    return parse_yaml(read_text(path, kind), str(path))


def parse_yaml(text: str, source: str):
    loader = None
    try:
        loader = BoundedSafeLoader(text)       # reads the first characters: may raise already
        node = loader.get_single_node()
        if node is not None:
            _check_expansion(node, source)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"not valid YAML{where} ({problem})", source=source) from None
    except RecursionError:
        raise UserError("not a usable YAML file (nested too deeply)", source=source) from None
    except (ValueError, OverflowError) as e:   # a bad timestamp, an integer of 4300+ digits
        raise UserError(f"not a usable YAML file ({str(e).splitlines()[0].split(';')[0]})",
                        source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


class BoundedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader for parse_yaml: construct only after _check_expansion has bounded the
    document's size with its aliases expanded (and refused self-referencing aliases)."""


def _check_expansion(root: yaml.Node, source: str) -> None:
    size: dict[int, int] = {}
    active: set[int] = set()

    def expanded(node) -> int:
        key = id(node)
        if key in size:
            return size[key]
        if key in active:
            raise UserError("a YAML alias refers to a node that contains it; write the value out",
                            source=source)
        active.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(expanded(c) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(expanded(k) + expanded(v) for k, v in node.value)
        active.discard(key)
        size[key] = n
        return n

    if expanded(root) > YAML_MAX_EXPANDED_NODES:
        raise UserError(f"its YAML aliases expand to more than {YAML_MAX_EXPANDED_NODES:,} values "
                        "(an alias bomb?); write the values out", source=source)
