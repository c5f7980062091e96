"""The first step of every Agent launch, run as the worker's user before the sandbox.

``python -I -S agent_exec.py [--cgroup FILE]... [--rlimit NAME=SOFT:HARD]... [--seccomp]
[--keyring] -- ARGV...`` does what must hold before anything of the Agent's runs, then executes
``ARGV`` (bwrap, or ``setpriv`` when the sandbox is off) in its own place:

- it writes its own pid into each named ``cgroup.procs``, so the Agent's first process and
  everything it ever starts count against the launch's bounds (a process moved after it forked
  would leave its children outside);
- it sets the named resource limits (inherited by everything below);
- it joins a fresh session keyring: otherwise every launch would possess the worker's session
  keyring, and a key one Principal's Agent left there would be read by the next one's;
- it puts the seccomp filter on ``SECCOMP_FD`` for bwrap's ``--seccomp``: it refuses new user
  namespaces (where bwrap runs as root there is no ``--disable-userns``) and ``clone3``, whose
  flags a filter cannot read (the C library then falls back to ``clone``).

Only the standard library, and nothing imported from amux: it starts with ``-I -S`` to cost a
launch as little as possible. A step that fails ends the launch with status 125 and one line.
"""

from __future__ import annotations

import errno
import os
import resource
import struct
import sys

SECCOMP_FD = 9
FAILED = 125

RLIMITS = {
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "core": resource.RLIMIT_CORE,
    "as": resource.RLIMIT_AS,
    "fsize": resource.RLIMIT_FSIZE,
}

# Per machine: (AUDIT_ARCH_*, unshare, clone, clone3, keyctl) syscall numbers.
_SYSCALLS = {
    "x86_64": (0xC000003E, 272, 56, 435, 250),
    "aarch64": (0xC00000B7, 97, 220, 435, 219),
}
_CLONE_NEWUSER = 0x10000000
_X32_BIT = 0x40000000
_KEYCTL_JOIN_SESSION_KEYRING = 1

# Classic BPF, as seccomp runs it.
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000


def _op(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter's program for ``machine`` (this one by default); None where it is unknown.

    Another ABI of the same processor (i386 or x32 calls on x86_64) is refused outright: its
    calls have other numbers the filter does not check.
    """
    known = _SYSCALLS.get(machine or os.uname().machine)
    if known is None:
        return None
    arch, unshare, clone, clone3, _ = known
    refuse = _ERRNO | errno.EPERM
    missing = _ERRNO | errno.ENOSYS
    program = [
        _op(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _op(_JEQ, 1, 0, arch),
        _op(_RET, 0, 0, missing),
        _op(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        _op(_JGE, 0, 1, _X32_BIT),
        _op(_RET, 0, 0, missing),
        _op(_JEQ, 3, 0, unshare),
        _op(_JEQ, 2, 0, clone),
        _op(_JEQ, 5, 0, clone3),
        _op(_RET, 0, 0, _ALLOW),
        _op(_LD_W_ABS, 0, 0, 16),  # the low half of args[0]: the flags of unshare and clone
        _op(_JSET, 0, 1, _CLONE_NEWUSER),
        _op(_RET, 0, 0, refuse),
        _op(_RET, 0, 0, _ALLOW),
        _op(_RET, 0, 0, missing),
    ]
    return b"".join(program)


class _Refused(Exception):
    pass


def _join_cgroup(procs: str) -> None:
    try:
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
    except OSError as error:
        raise _Refused(f"cannot join the launch's cgroup {procs}: {error.strerror}") from None


def _set_rlimit(spec: str) -> None:
    name, _, values = spec.partition("=")
    soft, _, hard = values.partition(":")
    try:
        resource.setrlimit(RLIMITS[name], (int(soft), int(hard or soft)))
    except (KeyError, ValueError, OSError) as error:
        raise _Refused(f"cannot set the {name} limit to {values}: {error}") from None


def _join_session_keyring() -> None:
    known = _SYSCALLS.get(os.uname().machine)
    if known is None:
        return
    import ctypes  # Only here: the one step that needs it, and its import costs a launch.

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(known[4], _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        code = ctypes.get_errno()
        if code != errno.ENOSYS:  # A kernel without keyrings has none to share.
            raise _Refused(f"cannot join a new session keyring: {os.strerror(code)}")


def holds_session_keyring() -> bool:
    """Whether this process holds a session keyring of its own (systemd gives each service
    one), which every launch would inherit and possess; else its session keyring is its uid's,
    and a launch switched to another uid gets that uid's own."""
    known = _SYSCALLS.get(os.uname().machine)
    if known is None:
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    get_id, session, user_session = 0, -3, -5
    own = libc.syscall(known[4], get_id, session, 0)
    return bool(own >= 0 and own != libc.syscall(known[4], get_id, user_session, 0))


def _open_seccomp() -> None:
    program = seccomp_filter()
    if program is None:
        raise _Refused(f"no seccomp filter for this machine ({os.uname().machine})")
    fd = os.memfd_create("amux-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    if fd != SECCOMP_FD:
        os.dup2(fd, SECCOMP_FD, inheritable=True)
        os.close(fd)
    else:
        os.set_inheritable(fd, True)


def main(argv: list[str]) -> None:
    try:
        split = argv.index("--")
    except ValueError:
        split = len(argv)
    options, command = argv[:split], argv[split + 1 :]
    try:
        if not command:
            raise _Refused("nothing to run")
        words = iter(options)
        for word in words:
            if word == "--cgroup":
                _join_cgroup(next(words))
            elif word == "--rlimit":
                _set_rlimit(next(words))
            elif word == "--keyring":
                _join_session_keyring()
            elif word == "--seccomp":
                _open_seccomp()
            else:
                raise _Refused(f"unknown option {word}")
        os.execv(command[0], command)
    except (_Refused, StopIteration, OSError) as error:
        print(f"amux: cannot confine the Agent's launch: {error}", file=sys.stderr, flush=True)
        os._exit(FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
