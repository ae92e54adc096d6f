"""Atomic output files for the package's reports, with the semantics of the C++ io layer's
writer (docs/file-formats.md, "Atomic writes").

The file is written to a temporary file in the target's directory, ``.<name>.tmp-<16 hex>``
(16 random hex digits from the OS's generator, so the name cannot be predicted; ``<name>`` is
cut and a hash of the whole name appended when that would exceed NAME_MAX), created with
O_CREAT | O_EXCL | O_NOFOLLOW (a file or link planted at that name is never opened, let alone
followed), flushed with fsync, then renamed over the target (a link at the target is replaced,
its target left alone), and the directory is synced. The temporary file is created when the
writer is made, so an output that cannot be written is refused before the work that produces
it; on any failure after that it is removed. A reader sees the old file (or none) or the
complete new one, never a partial output.

Errors: an empty name, a path that names a directory, or a missing directory is an input
problem (LogprobContractError); anything else the system refuses (permissions, disk full, I/O
errors) is an environment failure (RuntimeError). Messages start with the path.

Testing hook (the C++ writer's): DETLOGP_TESTING_IO_FAIL=<step>:<file name> makes ``write``
fail as a full disk (ENOSPC) or ``rename`` as an I/O error (EIO) for the output whose last path
component is <file name>.
"""

import errno
import os
import secrets

from ._detlogp import LogprobContractError

__all__ = ["AtomicOutputFile", "sibling_name"]

_RANDOM_HEX = 16
_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
          | getattr(os, "O_CLOEXEC", 0))


def _fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def _directory_of(path):
    return os.path.dirname(path) or "."


def _name_max(directory):
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def sibling_name(target, suffix):
    """``<dir>/.<name><suffix><16 hex>`` for ``target`` (a str), within NAME_MAX whatever the
    length of ``<name>``."""
    directory = _directory_of(target)
    name = os.fsencode(os.path.basename(target))
    room = _name_max(directory) - 1 - len(suffix) - _RANDOM_HEX  # 1: the leading dot
    if len(name) > room:
        # Shortened; the hash of the whole name keeps two long names that share a prefix apart.
        tag = b"~%08x" % (_fnv1a(name) & 0xFFFFFFFF)
        name = name[:room - len(tag)] + tag
    leaf = b"." + name + os.fsencode(suffix) + secrets.token_hex(_RANDOM_HEX // 2).encode()
    return os.path.join(directory, os.fsdecode(leaf))


def _injected(step, target):
    spec = os.environ.get("DETLOGP_TESTING_IO_FAIL", "")
    head, sep, tail = spec.partition(":")
    return bool(sep) and head == step and tail == os.path.basename(target)


def _fsync_directory(directory):
    """Makes the rename durable; a file system that refuses fsync on a directory is fine."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicOutputFile:
    """``with AtomicOutputFile(path) as f: f.write(data); f.commit()`` -- the target holds the
    new contents only after commit(); leaving the block without it removes the temporary
    file."""

    def __init__(self, path):
        self._fd = None
        self._temp = None
        self._committed = False
        self.path = os.fspath(path)
        if not self.path:
            raise LogprobContractError(f"{self.path}: empty output file name")
        if self.path.endswith(os.sep) or os.path.basename(self.path) in ("", ".", ".."):
            raise LogprobContractError(f"{self.path}: output path names a directory, not a file")
        if os.path.isdir(self.path):
            raise LogprobContractError(f"{self.path}: output path is an existing directory")
        directory = _directory_of(self.path)
        for _ in range(100):
            temp = sibling_name(self.path, ".tmp-")
            try:
                self._fd = os.open(temp, _FLAGS, 0o666)
            except FileExistsError:
                continue
            except (FileNotFoundError, NotADirectoryError):
                raise LogprobContractError(
                    f"{self.path}: cannot create the output file: directory {directory!r} does "
                    "not exist") from None
            except OSError as e:
                raise RuntimeError(f"{self.path}: cannot create a temporary file in "
                                   f"{directory!r}: {e.strerror}") from None
            self._temp = temp
            return
        raise RuntimeError(f"{self.path}: cannot find a free temporary file name")

    @property
    def temp_path(self):
        return self._temp

    def write(self, data):
        if self._fd is None:
            raise RuntimeError(f"{self.path}: write after commit or failure")
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            try:
                if _injected("write", self.path):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                done += os.write(self._fd, view[done:])
            except InterruptedError:
                continue
            except OSError as e:
                self.discard()
                what = "disk full while writing" if e.errno == errno.ENOSPC else "write error"
                raise RuntimeError(f"{self.path}: {what}: {e.strerror}") from None

    def commit(self):
        """fsync, close, rename over the target, fsync the directory."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: commit after commit or failure")
        fd, self._fd = self._fd, None
        try:
            os.fsync(fd)
        except OSError as e:
            os.close(fd)
            self.discard()
            what = "disk full while writing (fsync)" if e.errno == errno.ENOSPC else "fsync failed"
            raise RuntimeError(f"{self.path}: {what}: {e.strerror}") from None
        try:
            os.close(fd)
        except OSError as e:
            self.discard()
            what = "disk full while writing (close)" if e.errno == errno.ENOSPC else "close failed"
            raise RuntimeError(f"{self.path}: {what}: {e.strerror}") from None
        try:
            if _injected("rename", self.path):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            os.rename(self._temp, self.path)
        except OSError as e:
            self.discard()
            if e.errno == errno.EISDIR:
                raise LogprobContractError(
                    f"{self.path}: output path is an existing directory") from None
            raise RuntimeError(f"{self.path}: cannot rename the temporary file into place: "
                               f"{e.strerror}") from None
        self._committed = True
        _fsync_directory(_directory_of(self.path))

    def discard(self):
        """Closes and removes the temporary file unless commit() succeeded (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._committed and self._temp is not None:
            try:
                os.unlink(self._temp)
            except OSError:
                pass
            self._temp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.discard()
        return False

    def __del__(self):
        self.discard()
