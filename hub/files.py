"""Confined, crash-safe file operations below the memory root.

Every path is walked one component at a time with directory file descriptors and ``O_NOFOLLOW``,
so a symbolic link anywhere on the way is refused rather than followed, even if it appears while we
walk. Writes go to a hidden temporary file in the destination directory, which is synced, renamed
over the target, and the directory synced: a reader or a crash sees the old or the new document,
never a mix. Before the first write through a directory in this process, the directory's parent is
synced too, so its own entry is on disk: a directory made just before a crash may exist with that
entry never synced, and documents written into it would vanish with it on a power cut.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from hub.errors import InvalidPath
from hub.storage import MEMORY, guarded, is_storage_errno

TEMP_PREFIX = ".amux-tmp-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


# Directory syncs a write waits for only before its rename (see ``MemoryFiles.keep_copy``).
_SYNCS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="amux-sync")


def _sync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _done() -> None:
    """A copy made durable already."""


@dataclass(frozen=True)
class WalkedFile:
    parts: tuple[str, ...]
    data: bytes
    # ``data.lower()`` when the walk was asked to fold: kept beside the cached bytes, so a
    # search repeats neither the read nor the case folding of an unchanged document.
    lowered: bytes | None = None
    # How many names the file has: an edit through a name elsewhere is not seen here.
    names: int = 1


# Called with each directory a walk lists, open as the descriptor, before it is listed.
OnDirectory = Callable[[int, tuple[str, ...]], None]


class WalkStop(Exception):
    """A walk ended early because its budget ran out."""


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _refuse(
    err: OSError, parts: tuple[str, ...], index: int, dir_fd: int | None = None
) -> InvalidPath:
    if is_storage_errno(err.errno):
        # The disk failed, not the path: the method's guard reports it as the disk's error.
        raise err
    shown = "/".join(parts[: index + 1])
    # O_DIRECTORY | O_NOFOLLOW on a link reports ENOTDIR, not ELOOP: say what is really there.
    linked = err.errno in (errno.ELOOP, errno.EMLINK) or (
        dir_fd is not None and _is_link(parts[index], dir_fd)
    )
    if linked:
        return InvalidPath(f"'{shown}' is a symbolic link; memory paths never follow links")
    if err.errno == errno.ENOTDIR:
        return InvalidPath(f"'{shown}' is not a directory")
    if err.errno == errno.EISDIR:
        return InvalidPath(f"'{shown}' is a directory, not a document")
    return InvalidPath(f"'{shown}' cannot be opened ({os.strerror(err.errno or 0)})")


# (inode, size, mtime ns, ctime ns): a file replaced by rename or edited in place changes one.
_Stamp = tuple[int, int, int, int]
_RACY_NS = 2_000_000_000


def _stamp(info: os.stat_result) -> _Stamp:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class _ContentCache:
    """Recently scanned documents, trusted only while their stat stamp is unchanged.

    A search then costs one ``stat`` per unchanged document instead of open, read and close,
    which is most of a scan. Bounded in bytes; the least recently used documents go first.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[tuple[str, ...], tuple[_Stamp, bytes, bytes | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, key: tuple[str, ...], stamp: _Stamp) -> tuple[bytes, bytes | None] | None:
        """The document's bytes and their lower-cased copy (None if not made yet), if fresh."""
        # No lock: a dict lookup is atomic, and a scan does one per document.
        hit = self._entries.get(key)
        if hit is None or hit[0] != stamp:
            return None
        with contextlib.suppress(KeyError):  # evicted by another thread meanwhile
            self._entries.move_to_end(key)
        return hit[1], hit[2]

    def put(
        self, key: tuple[str, ...], stamp: _Stamp, data: bytes, lowered: bytes | None = None
    ) -> None:
        size = len(data) + (len(lowered) if lowered is not None else 0)
        if size > self._max_bytes // 8:
            return
        # File times tick coarsely: a same-size edit within one tick of this read would keep the
        # stamp, so documents changed moments ago are not cached (the "racy git" rule).
        if time.time_ns() - max(stamp[2], stamp[3]) < _RACY_NS:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= _entry_bytes(old)
            entry = (stamp, data, lowered)
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self._max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _entry_bytes(evicted)


def _entry_bytes(entry: tuple[_Stamp, bytes, bytes | None]) -> int:
    return len(entry[1]) + (len(entry[2]) if entry[2] is not None else 0)


class MemoryFiles:
    """File access to one memory root (``<AMUX_HOME>/memory``).

    A full, read-only or failing file system makes reads and writes raise ``StorageUnavailable``
    naming ``disk`` (see ``hub.storage``); a write that fails leaves the old document whole.
    """

    def __init__(self, root: Path, cache_bytes: int = 64 * 1024 * 1024, disk: str = MEMORY) -> None:
        self.root = root
        self.disk = disk
        self._cache = _ContentCache(cache_bytes)
        # Directories below the root (as path components) whose entry in their parent was synced
        # by this process. Written from worker threads; a race at worst syncs a parent twice.
        self._durable: set[tuple[str, ...]] = set()

    def ensure_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.root.is_symlink():
            raise InvalidPath("the memory root must not be a symbolic link")
        # The root's own entry, once per start, for the same reason as every directory below it.
        parent = os.open(self.root.parent, _DIR_FLAGS)
        try:
            os.fsync(parent)
        finally:
            os.close(parent)

    @contextlib.contextmanager
    def _directory(
        self,
        parts: tuple[str, ...],
        *,
        create: bool,
        on_directory: OnDirectory | None = None,
    ) -> Iterator[int | None]:
        """Yield an fd of ``root/parts`` (None when it does not exist and ``create`` is false).

        With ``create``, for a write: missing directories are made, and every directory on the
        way has its entry synced into its parent before the first write through it.
        ``on_directory`` is called with the root and every directory on the way as it is reached.
        """
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            if on_directory is not None:
                on_directory(fd, ())
            for index, name in enumerate(parts):
                here = parts[: index + 1]
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        yield None
                        return
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=fd)
                        # A new entry needs a new sync, whatever this process synced before.
                        self._durable.discard(here)
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as err:
                    raise _refuse(err, parts, index, fd) from err
                parent, fd = fd, child
                if on_directory is not None:
                    on_directory(fd, here)
                try:
                    if create and here not in self._durable:
                        # Existing is not enough: a crash between an earlier mkdir and its
                        # parent's sync leaves a directory whose entry may still be lost.
                        os.fsync(parent)
                        self._durable.add(here)
                finally:
                    os.close(parent)
            yield fd
        finally:
            os.close(fd)

    def read(
        self, parts: tuple[str, ...], on_directory: OnDirectory | None = None
    ) -> bytes | None:
        """The document's bytes, or None when it does not exist. ``on_directory`` is called with
        the root and each directory on the way, before the document is opened.

        Raises:
            InvalidPath: a component is a link, or a file stands where a directory should.
            StorageUnavailable: the disk failed to read.
        """
        with (
            guarded(self.disk, self.root),
            self._directory(parts[:-1], create=False, on_directory=on_directory) as dir_fd,
        ):
            if dir_fd is None:
                return None
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except OSError as err:
                raise _refuse(err, parts, len(parts) - 1, dir_fd) from err
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    raise InvalidPath(f"'{'/'.join(parts)}' is not a regular document")
                return _read_all(fd, info.st_size)
            finally:
                os.close(fd)

    def write_atomic(
        self, parts: tuple[str, ...], data: bytes, before_rename: Callable[[], None] | None = None
    ) -> None:
        """Replace or create the document durably: temp file, fsync, rename, directory fsync.
        ``before_rename`` is called once the new body is synced, before it takes the name (a
        failure there leaves the document as it was).

        Raises: StorageUnavailable: the disk is full, read-only or failing (nothing changed).
        """
        with guarded(self.disk, self.root), self._directory(parts[:-1], create=True) as dir_fd:
            assert dir_fd is not None
            temp = f"{TEMP_PREFIX}{secrets.token_hex(8)}"
            fd = os.open(
                temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
            )
            try:
                try:
                    view = memoryview(data)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if before_rename is not None:
                    before_rename()
                os.rename(temp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
            os.fsync(dir_fd)

    def keep_copy(
        self,
        source: MemoryFiles,
        source_parts: tuple[str, ...],
        parts: tuple[str, ...],
        data: bytes,
    ) -> Callable[[], None]:
        """Make ``parts`` a copy of ``data``, the bytes ``source_parts`` of ``source`` holds now,
        which its caller is about to rename over or remove; the copy is durable once the
        returned call returns, which the caller makes before it does so.

        A second name for that file is such a copy without writing or syncing its data again:
        the file is never written in place. Only a private file with no other name and of the
        expected size is linked, and the new name's directory is synced on a thread of its own
        meanwhile, so the caller's own syncs overlap it; otherwise (another filesystem, a file
        with other permissions) the bytes are copied, durably before this returns.

        Raises: StorageUnavailable (here or from the returned call).
        """
        with (
            guarded(self.disk, self.root),
            source._directory(source_parts[:-1], create=False) as source_fd,
        ):
            if source_fd is not None:
                synced = self._link(source_fd, source_parts[-1], parts, data)
                if synced is not None:
                    return synced
        self.write_atomic(parts, data)
        return _done

    def _link(
        self, source_fd: int, name: str, parts: tuple[str, ...], data: bytes
    ) -> Callable[[], None] | None:
        try:
            info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        except OSError:
            return None
        private = stat.S_IMODE(info.st_mode) & 0o077 == 0
        if not (stat.S_ISREG(info.st_mode) and private and info.st_nlink == 1):
            return None
        if info.st_size != len(data):
            return None
        with self._directory(parts[:-1], create=True) as dir_fd:
            assert dir_fd is not None
            try:
                os.link(
                    name, parts[-1], src_dir_fd=source_fd, dst_dir_fd=dir_fd, follow_symlinks=False
                )
            except FileExistsError:
                # Named by its revision: what is there already holds these bytes.
                return _done
            except OSError:
                return None
            # The new name reaches the disk before the caller replaces the old one.
            syncing = _SYNCS.submit(_sync_and_close, os.dup(dir_fd))

        def synced() -> None:
            with guarded(self.disk, self.root):
                syncing.result()

        return synced

    def visit_path(self, parts: tuple[str, ...], visit: OnDirectory) -> bool:
        """Call ``visit`` with the root and each directory down to ``root/parts``, walked
        without following links; False when one of them is missing or not a directory."""
        with guarded(self.disk, self.root):
            fd = os.open(self.root, _DIR_FLAGS)
            try:
                visit(fd, ())
                for index, name in enumerate(parts):
                    try:
                        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    except OSError as err:
                        if is_storage_errno(err.errno):
                            raise
                        return False
                    os.close(fd)
                    fd = child
                    visit(fd, parts[: index + 1])
            finally:
                os.close(fd)
        return True

    def names(self, parts: tuple[str, ...]) -> list[str] | None:
        """The entries of the directory ``root/parts``, or None when it does not exist."""
        with guarded(self.disk, self.root), self._directory(parts, create=False) as dir_fd:
            return None if dir_fd is None else os.listdir(dir_fd)

    def delete(self, parts: tuple[str, ...], keep: int = 0) -> bool:
        """Remove the document and sync its directory; False when it was already gone.

        Then remove the directories that leaves empty, deepest first, down to the first ``keep``
        components (a scope's own directory): left behind, they are outside every quota yet
        spend the search's directory-entry budget. The caller must hold the lock that orders
        writes to this part of the tree, or a concurrent write could lose its new directory.
        """
        with guarded(self.disk, self.root):
            with self._directory(parts[:-1], create=False) as dir_fd:
                if dir_fd is None:
                    return False
                try:
                    os.unlink(parts[-1], dir_fd=dir_fd)
                except FileNotFoundError:
                    return False
                os.fsync(dir_fd)
            self._prune_empty(parts[:-1], keep)
        return True

    def _prune_empty(self, directory: tuple[str, ...], keep: int) -> None:
        while len(directory) > max(keep, 0):
            with self._directory(directory[:-1], create=False) as parent_fd:
                if parent_fd is None:
                    return
                try:
                    # rmdir removes only an empty directory, and never follows a link.
                    os.rmdir(directory[-1], dir_fd=parent_fd)
                except OSError as err:
                    if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
                        return
                    raise
                # The removal is durable only once the directory that held it is synced.
                os.fsync(parent_fd)
                self._durable.discard(directory)
            directory = directory[:-1]

    def walk(
        self,
        scope_parts: tuple[str, ...],
        prefix: tuple[str, ...] = (),
        admit: Callable[[int], bool] = lambda _size: True,
        max_entries: int = 1 << 30,
        fold: bool = False,
        on_directory: OnDirectory | None = None,
    ) -> Generator[WalkedFile, None, None]:
        """Yield visible ``.md`` documents of a scope in path order, never following links.

        ``prefix`` narrows the walk to a directory or to one document. ``admit(size)`` is asked
        before each document is read; a False answer, or more than ``max_entries`` directory
        entries, ends the walk with ``WalkStop`` so the caller can report the scan as incomplete.
        With ``fold``, each document comes with its ASCII-lower-cased bytes as well.
        ``on_directory`` is called with every directory walked, before it is listed.
        """
        base = scope_parts + prefix
        with self._directory(scope_parts, create=False) as scope_fd:
            if scope_fd is None:
                return
        try:
            directory = self._directory(base, create=False)
            dir_fd = directory.__enter__()
        except InvalidPath:
            # A prefix may name one document instead of a directory. Searches skip links
            # (and anything else that is not a plain document) rather than fail on them.
            if prefix and prefix[-1].endswith(".md"):
                try:
                    data = self.read(base)
                except InvalidPath:
                    return
                if data is not None:
                    if not admit(len(data)):
                        raise WalkStop from None
                    yield WalkedFile(prefix, data, data.lower() if fold else None)
            return
        try:
            if dir_fd is not None:
                yield from self._walk_fd(
                    dir_fd, scope_parts, prefix, admit, [max_entries], fold, on_directory
                )
        finally:
            directory.__exit__(None, None, None)

    def _walk_fd(
        self,
        dir_fd: int,
        scope_parts: tuple[str, ...],
        rel: tuple[str, ...],
        admit: Callable[[int], bool],
        entries_left: list[int],
        fold: bool,
        on_directory: OnDirectory | None = None,
    ) -> Iterator[WalkedFile]:
        if on_directory is not None:
            on_directory(dir_fd, scope_parts + rel)
        with os.scandir(dir_fd) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        entries_left[0] -= len(entries)
        if entries_left[0] < 0:
            raise WalkStop
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            # A link is neither a directory nor, by its lstat, a regular file: both skip it.
            if entry.is_dir(follow_symlinks=False):
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    yield from self._walk_fd(
                        child, scope_parts, rel + (name,), admit, entries_left, fold, on_directory
                    )
                finally:
                    os.close(child)
            elif name.endswith(".md"):
                try:
                    listed = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(listed.st_mode):
                    continue
                key = scope_parts + rel + (name,)
                cached = self._cache.get(key, _stamp(listed))
                if cached is not None:
                    data, lowered = cached
                    if not admit(len(data)):
                        raise WalkStop
                    if fold and lowered is None:
                        lowered = data.lower()
                        self._cache.put(key, _stamp(listed), data, lowered)
                    yield WalkedFile(rel + (name,), data, lowered, listed.st_nlink)
                    continue
                try:
                    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    info = os.fstat(fd)
                    # The entry may have been swapped for a pipe or device since it was listed.
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    if not admit(info.st_size):
                        raise WalkStop
                    data = _read_all(fd, info.st_size)
                finally:
                    os.close(fd)
                lowered = data.lower() if fold else None
                self._cache.put(key, _stamp(info), data, lowered)
                yield WalkedFile(rel + (name,), data, lowered, info.st_nlink)

    def sweep_temp_files(self) -> int:
        """Remove temp files a crash left behind; only safe while holding the root lock."""
        removed = 0
        for directory, _dirs, names in os.walk(self.root, followlinks=False):
            for name in names:
                if name.startswith(TEMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))
                        removed += 1
        return removed


def _read_all(fd: int, size_hint: int) -> bytes:
    want = max(size_hint, 0) + 1
    first = os.read(fd, want)
    # A regular file reads short only at its end, so one read usually suffices; asking for one
    # byte more than fstat said notices a file that grew meanwhile.
    if len(first) < want:
        return first
    chunks = [first]
    while True:
        chunk = os.read(fd, max(want, 65536))
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
