"""A watch on directories below a memory root (Linux inotify), shared by the whole process.

The Hub is the only online writer of memory, but people and other tools may edit the files. A
search that kept what it read may trust it only while nothing changed on disk since: the watch
tells which directories saw a change, so an unchanged scope needs no ``stat`` per document.

The kernel queues an event inside the system call that made the change, so every change that
finished before a search drains the queue is seen by that search. One inotify instance serves
every listener of the process: the instances are few per user (``max_user_instances``) and other
programs of the same user need theirs. When the watch cannot be had (no inotify, no instance or
watch left) or its queue overflowed, listeners are told and fall back to checking every file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import threading
import weakref
from dataclasses import dataclass, field

logger = logging.getLogger("amux.hub.watch")

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000

# Whatever can change what a directory lists or what its files hold.
WATCHED = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")

Parts = tuple[str, ...]


class Listener:
    """What a watched tree's owner is told. Called with the watch's lock held: keep it short."""

    def changed(self, path: Parts) -> None:
        """Something at ``path`` (a directory, or an entry in one) changed or went."""

    def overflowed(self) -> None:
        """Events were lost: nothing watched can be trusted until it is looked at again."""


@dataclass
class _Watched:
    listeners: dict[int, tuple[weakref.ReferenceType[Listener], Parts]] = field(
        default_factory=dict
    )


class _Inotify:
    """The system calls, through the C library; absent on systems without them."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.init1 = libc.inotify_init1
        self.init1.argtypes = [ctypes.c_int]
        self.init1.restype = ctypes.c_int
        self.add_watch = libc.inotify_add_watch
        self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.add_watch.restype = ctypes.c_int
        self.rm_watch = libc.inotify_rm_watch
        self.rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        self.rm_watch.restype = ctypes.c_int


class TreeWatch:
    """The process's one inotify instance and who listens to which of its watches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = -1
        self._calls: _Inotify | None = None
        self._unavailable = ""
        self._by_wd: dict[int, _Watched] = {}
        self._listeners: weakref.WeakSet[Listener] = weakref.WeakSet()
        self.overflows = 0
        # A refusal is said once per reason: at the limit every search and read would repeat it.
        self._refusals_told: set[int] = set()

    def _open(self) -> bool:
        if self._fd >= 0:
            return True
        if self._unavailable:
            return False
        try:
            self._calls = _Inotify()
        except (OSError, AttributeError) as error:
            self._unavailable = f"no inotify: {error}"
        else:
            fd = self._calls.init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                weakref.finalize(self, os.close, fd)
                return True
            number = ctypes.get_errno()
            # Out of instances is a state of the moment; later searches try again.
            if number not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                self._unavailable = os.strerror(number)
            logger.warning("memory searches check every file: inotify %s", os.strerror(number))
            return False
        logger.warning("memory searches check every file: %s", self._unavailable)
        return False

    def add(self, listener: Listener, dir_fd: int, path: Parts) -> bool:
        """Watch the directory open as ``dir_fd`` for ``listener``, as ``path``; False when the
        system refuses (no inotify, or its limits reached)."""
        with self._lock:
            if not self._open():
                return False
            assert self._calls is not None
            # The open descriptor names the directory already reached without following links;
            # its /proc name resolves to that very directory, never to a path walked again.
            name = f"/proc/self/fd/{dir_fd}".encode()
            wd = self._calls.add_watch(self._fd, name, WATCHED | IN_ONLYDIR)
            if wd < 0:
                self._tell_refusal(ctypes.get_errno())
                return False
            watched = self._by_wd.setdefault(wd, _Watched())
            watched.listeners[id(listener)] = (weakref.ref(listener), path)
            self._listeners.add(listener)
            return True

    def _tell_refusal(self, number: int) -> None:
        if number in self._refusals_told:
            logger.debug("memory watch refused (%s)", os.strerror(number))
            return
        self._refusals_told.add(number)
        fix = (
            "; raise the sysctl fs.inotify.max_user_watches to watch more"
            if number == errno.ENOSPC
            else ""
        )
        logger.warning(
            "memory watch refused (%s): reads below an unwatched directory check every file "
            "(said once)%s",
            os.strerror(number),
            fix,
        )

    def forget(self, listener: Listener) -> None:
        """Stop telling ``listener``; directories nobody else listens to are no longer watched."""
        with self._lock:
            self._listeners.discard(listener)
            for wd, watched in list(self._by_wd.items()):
                if watched.listeners.pop(id(listener), None) is not None and not watched.listeners:
                    del self._by_wd[wd]
                    if self._calls is not None and self._fd >= 0:
                        self._calls.rm_watch(self._fd, wd)

    def drain(self) -> None:
        """Hand every queued event to its listeners; an overflow to all of them."""
        with self._lock:
            if self._fd < 0:
                return
            while True:
                try:
                    chunk = os.read(self._fd, 65536)
                except BlockingIOError:
                    return
                except InterruptedError:
                    continue
                self._dispatch(chunk)

    def _dispatch(self, chunk: bytes) -> None:
        offset = 0
        while offset + _EVENT.size <= len(chunk):
            wd, mask, _cookie, length = _EVENT.unpack_from(chunk, offset)
            raw = chunk[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self.overflows += 1
                logger.info("memory watch overflowed; the next searches check every file")
                for everyone in list(self._listeners):
                    everyone.overflowed()
                continue
            watched = self._by_wd.get(wd)
            if watched is None:
                continue
            name = raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
            for key, (ref, path) in list(watched.listeners.items()):
                listener = ref()
                if listener is None:
                    del watched.listeners[key]
                    continue
                listener.changed(path if mask & _SELF or not name else (*path, name))
            if mask & IN_IGNORED:
                # The kernel dropped the watch (its directory went): the number may be reused.
                del self._by_wd[wd]


WATCH = TreeWatch()
