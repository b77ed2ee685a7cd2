"""The one rule for every file tierdiag writes: `replay --db`, `report -o`, `export DIR`,
`synth OUT`, `calibrate -o`, `import sglang --trace-out`, `sweep --db`. Missing parent folders are
created (like `mkdir -p`); a path that is a folder, or a parent that cannot be created or
written, is an OutputError (exit 6) naming it.

Before that, `check_output` refuses (ConfigError, exit 2, one line naming both) an output that is
one of the command's own inputs or its store: the same file by inode (a hard or symbolic link to
it too), or, not there yet, the same path. And it never lets anything but a run store replace a
DuckDB database: a report, trace or profile written over one would lose every run in it.

`open_output` / `write_output` are the one way a file is written (a trace, a profile, a report,
`--trace-out`): the checks above, then

- a regular file (or none yet): the bytes go to a temporary file made exclusively in the target's
  folder (`tempfile.mkstemp`: O_CREAT|O_EXCL, so a link planted at a temporary name is never
  followed), fsynced, given the old file's permissions (a new one: 0666 less the umask), then
  renamed over the path (`os.replace`: a reader sees the old file or the whole new one; a link
  at the path itself is replaced, never written through);
- a FIFO or a character device (`-o /dev/stdout`, `/dev/null`, a named pipe a reader holds
  open): streamed into as it is, no temporary file, no rename; a FIFO nobody reads is exit 6
  at once, never a hang;
- anything else that is not a regular file (a socket, a block device): refused, exit 2;
- `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N` (a descriptor the command was
  given, whatever it is: `-o /dev/stdout > out.jsonl`): written through that descriptor itself,
  where it stands (no file can be made or renamed in /proc, and a new open of the name would
  start at the file's beginning, under what the command prints there).

A failure removes the temporary file and leaves the path as it was (exit 6 naming it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Iterable

from tierdiag.errors import ConfigError, OutputError

# The run store a command uses without --db (here, not in store/reader.py: naming it must not
# import duckdb, which a replay's own process does not need when a writer process writes).
DEFAULT_DB = "tierdiag.duckdb"

# Every DuckDB database file (format 1.x) carries this magic at bytes 8-11 of its main header
# (duckdb/src/storage/storage_info.cpp: MainHeader::MAGIC_BYTES, after an 8-byte checksum).
DUCKDB_MAGIC = b"DUCK"
_DUCKDB_MAGIC_AT = 8


def is_duckdb_file(path: str | os.PathLike) -> bool:
    """A DuckDB database file (checked by its header, not its name). Only a regular file is
    opened, and without blocking: a FIFO or a device is never read (opening a FIFO for reading
    waits for a writer)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        # O_NONBLOCK: should the path become a FIFO after the stat, the open returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):  # missing, unreadable, a NUL in the name: nothing to destroy
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.pread(fd, _DUCKDB_MAGIC_AT + len(DUCKDB_MAGIC), 0)
    except OSError:
        return False
    finally:
        os.close(fd)
    return head[_DUCKDB_MAGIC_AT:] == DUCKDB_MAGIC


IN_MEMORY = ":memory:"  # DuckDB's in-memory database: our own hosts' (`connect_with_retry(IN_MEMORY)`)


def check_duckdb_name(path: str | os.PathLike, *, what: str = "--db") -> None:
    """Refuse (ConfigError, exit 2) a file name DuckDB cannot open as the file it names: DuckDB
    reads '\\' as a folder separator on every platform (`--db 'a\\b.duckdb'` wrote `a/b.duckdb`,
    where no reader looked), and no spelling of the name escapes it."""
    text = os.fspath(path)
    if "\\" in text:
        raise ConfigError(f"{what} '{text}': DuckDB reads '\\' in a file name as a folder "
                          f"separator, so it cannot open the file this names",
                          hint="pass a name without '\\' (rename the file, or link to it under such a name)")


def duckdb_name(path: str | os.PathLike, *, what: str = "--db") -> str:
    """The text DuckDB is given to open the file `path` names (a connect, an ATTACH, a COPY's
    target): the absolute path. DuckDB reads a name its own way where the file system does not:
    ':memory:NAME' is an in-memory database (a replay 'recorded' into it kept nothing, exit 0),
    'NAME:...' an extension's (`md:x` downloads MotherDuck's), 'SCHEME://' a remote file system,
    '~/' the home folder; a path that starts with '/' is always a local file to it. A '\\' in
    the name: `check_duckdb_name`."""
    check_duckdb_name(path, what=what)
    return os.path.abspath(os.fspath(path))


# Terminals' major device numbers on Linux (Documentation/admin-guide/devices.txt): the virtual
# consoles and serial ttys (4), /dev/tty and the consoles (5), the Unix98 pseudo-terminals (136-143).
_TTY_MAJORS = frozenset((4, 5, *range(136, 144)))


def refuse_endless_input(path: str | os.PathLike, *, what: str, option: str = "") -> None:
    """Refuse (ConfigError, exit 2) an input that is a character device with no end: /dev/zero,
    /dev/full, /dev/urandom as a trace, a --config, a profile or a server export were read
    without end (a line or a file that never ends, held whole: a hang that grew until memory ran
    out). /dev/null (empty) and a terminal (`/dev/stdin` typed at) are read as before, and so is
    a pipe or FIFO (it ends when its writer does). Told by its stat alone: a device is never
    opened here (opening one can start it)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):  # missing, a NUL in the name: the reader's own error
        return
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) in _TTY_MAJORS:
        return
    try:
        if st.st_rdev == os.stat(os.devnull).st_rdev:
            return
    except OSError:
        pass
    article = "an" if what[:1] in "aeiou" else "a"
    raise ConfigError(f"{option + ' ' if option else ''}{os.fspath(path)}: is a character device, not {article} {what} "
                      f"(read, it would never end)", hint="pass a file, or pipe one in as /dev/stdin")


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words ('a FIFO (named pipe)', 'a folder')."""
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _existing_mode(path: Path) -> int | None:
    """The mode of what `path` names (through links), or None when nothing is there."""
    try:
        return os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a link loop, a name too long, no permission to look
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """`a` and `b` are one file: the same inode when both exist (through hard and symbolic links),
    else the same resolved path (two outputs a command would create at one place)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        pass
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return False


def check_output(path: str | os.PathLike, *, what: str, inputs: Iterable[tuple[str, str | os.PathLike]] = (),
                 store: bool = False, duckdb: bool = False) -> None:
    """Refuse to write `path` (the `what` option) over one of the command's `inputs` ((label,
    path) pairs: its trace, export files, --db) or, unless the output is itself a run `store`,
    over a DuckDB database. ConfigError (exit 2) naming both; nothing is touched. A `store`, and
    an output DuckDB writes (`duckdb`: export's folder), must have a name DuckDB opens as itself
    (`check_duckdb_name`)."""
    if store or duckdb:
        check_duckdb_name(path, what=what)
    for label, source in inputs:
        if source is not None and same_file(path, source):
            same = "" if str(path) == str(source) else f" ({source})"
            raise ConfigError(f"{what} {path} is the same file as {label}{same}: refusing to write over "
                              f"what this command reads", hint=f"pass another {what}")
    if not store and is_duckdb_file(path):
        raise ConfigError(f"{what} {path} is a DuckDB database (a run store?): refusing to replace it",
                          hint=f"pass another {what}")


def prepare_output_path(path: Path, *, what: str, inputs: Iterable[tuple[str, str | os.PathLike]] = (),
                        store: bool = False, stream_special: bool = False) -> None:
    """The one rule for every file tierdiag writes (--db, -o, export, calibrate -o, --trace-out):
    `check_output` first (an input, or a DuckDB file for anything but a store: exit 2); then
    missing parent folders are created; a path that is a folder, or a parent that cannot be created
    or written, is an OutputError (exit 6) naming the path. A path that is neither a regular file
    nor a folder is refused (exit 2), except a FIFO or a character device when `stream_special`
    (the caller streams into it: `open_output`)."""
    path = Path(path)
    check_output(path, what=what, inputs=inputs, store=store)
    mode = _existing_mode(path)
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError(f"cannot write {path}: it is a folder", hint=f"pass a file name to {what}")
    if mode is not None and not stat.S_ISREG(mode):
        if not (stream_special and (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode))):
            raise ConfigError(f"{what} {path} is {file_kind(mode)}: refusing to write to it",
                              hint=f"pass a regular file to {what}")
    if store and mode is None and os.path.islink(path):
        # A store's link to nothing: DuckDB makes the file at the link's target (other outputs
        # replace the link), so the target's folder must be there (where it is not, DuckDB's own
        # error named the link, not what was missing).
        target = Path(os.path.realpath(path))
        if not target.parent.is_dir():
            raise OutputError(f"cannot write {path}: it links to {os.readlink(path)}, "
                              f"and the folder {target.parent} is not there",
                              hint=f"make that folder, or pass another {what}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"cannot write {path}: {parent} is not a folder") from None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: cannot create folder {parent} ({exc.strerror or exc})") from None
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {path}: folder {parent} is not writable",
                          hint=f"pass a {what} in a folder you can write to")


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def open_output(path: str | os.PathLike, *, what: str, inputs: Iterable[tuple[str, str | os.PathLike]] = ()
                ) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content into (see the module's docstring): checked
    like `prepare_output_path`, then a temporary file renamed into place when the block ends
    without an error (a FIFO or character device: streamed into). Any error leaves the path as it
    was; an OSError becomes an OutputError (exit 6) naming the path."""
    path = Path(path)
    inputs = list(inputs)
    prepare_output_path(path, what=what, inputs=inputs, stream_special=True)
    mode = _existing_mode(path)
    descriptor = descriptor_of(path)
    if mode is not None and descriptor is not None:
        with _through_descriptor(path, descriptor) as fh:
            yield fh
        return
    if mode is not None and not stat.S_ISREG(mode):
        with _stream(path) as fh:
            yield fh
        return
    parent = path.parent if str(path.parent) else Path(".")
    tmp: str | None = None
    try:
        import tempfile  # here: every command imports this module, few write a file (start-up)

        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")  # O_CREAT|O_EXCL
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        # The checks again, just before the rename: the path may have changed since (a link to
        # an input or a store planted meanwhile is refused, not replaced).
        check_output(path, what=what, inputs=inputs)
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):  # cleanup after a failure; its error is the one to see
                os.unlink(tmp)


def descriptor_of(path: Path) -> int | None:
    """The descriptor a name stands for (`/dev/stdout`: 1, `/dev/fd/5`: 5), or None."""
    text = str(path)
    named = {"/dev/stdout": 1, "/dev/stderr": 2}.get(text)
    if named is not None:
        return named
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        rest = text[len(prefix):]
        if text.startswith(prefix) and rest.isdigit() and rest.isascii():
            return int(rest)
    return None


@contextlib.contextmanager
def _through_descriptor(path: Path, descriptor: int) -> Iterator[BinaryIO]:
    """Write through a duplicate of `descriptor`: its file offset is shared, so what the command
    printed there before stays before, and what it prints after comes after."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # closed, or a pipe already gone: nothing to keep in order
            stream.flush()
    try:
        fh = os.fdopen(os.dup(descriptor), "wb", buffering=1 << 20)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with fh:
            yield fh
            fh.flush()
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _stream(path: Path) -> Iterator[BinaryIO]:
    """Write into a FIFO or a character device as it is. O_NONBLOCK for the open only: a FIFO
    with no reader fails at once (ENXIO) instead of waiting for one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(f"cannot write {path}: it is a FIFO (named pipe) that nothing is reading",
                              hint="start its reader first, or pass a regular file") from None
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "wb", buffering=1 << 20)
    except OSError as exc:
        os.close(fd)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with fh:
            yield fh
            fh.flush()
    except OSError as exc:  # a device full (/dev/full), a reader gone (EPIPE)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable; a file system that cannot sync a folder is no error."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # EINVAL where folders cannot be synced: the file is written
            os.fsync(fd)
    finally:
        os.close(fd)


def write_output(path: str | os.PathLike, data: bytes, *, what: str,
                 inputs: Iterable[tuple[str, str | os.PathLike]] = ()) -> int:
    """Write `data` as the whole of `path` through `open_output`; the number of bytes."""
    with open_output(path, what=what, inputs=inputs) as fh:
        fh.write(data)
    return len(data)
