"""The first step inside a sandbox with a network of its own: its doors, then the Agent.

Run as ``python -I -S relay.py PORT=SOCKET… -- AGENT ARGV…`` after the switch to the Agent's
uid: it imports nothing outside the standard library, so it costs a launch little. It binds each
``PORT`` on the namespace's own loopback before the Agent starts (a request the Agent makes at
once finds its door listening), forks a child that carries each accepted connection to the Unix
``SOCKET`` the worker serves for that door, and executes the Agent in its own place: the Agent
keeps the main pid, its exit status and its signals. When the Agent ends, bwrap ends the
namespace, and the child with it.

Each door carries at most ``DOOR_CONNECTIONS`` connections at once, as its worker's side
passes no more: one past that is closed as soon as it is accepted, holding no thread.
"""

import os
import selectors
import socket
import sys
import threading

CHUNK = 65536
BACKLOG = 128
DOOR_CONNECTIONS = 32
# A socket's address holds at most 108 bytes; a deeper one is reached through its directory.
MAX_ADDRESS_BYTES = 100


def _connect(path: str) -> socket.socket:
    door = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if len(os.fsencode(path)) <= MAX_ADDRESS_BYTES:
        door.connect(path)
        return door
    directory = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
    try:
        door.connect(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
    finally:
        os.close(directory)
    return door


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(CHUNK):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        # Half-close: the other direction may still be answering.
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _carry(conn: socket.socket, path: str, slots: threading.Semaphore) -> None:
    try:
        try:
            door = _connect(path)
        except OSError:
            conn.close()
            return
        back = threading.Thread(target=_pump, args=(door, conn), daemon=True)
        back.start()
        _pump(conn, door)
        back.join()
        conn.close()
        door.close()
    finally:
        slots.release()


def serve(listeners: dict[socket.socket, str]) -> None:
    """Accept on every listener until killed, one thread per connection."""
    selector = selectors.DefaultSelector()
    for listener, path in listeners.items():
        slots = threading.Semaphore(DOOR_CONNECTIONS)
        selector.register(listener, selectors.EVENT_READ, (path, slots))
    while True:
        for key, _ in selector.select():
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            try:
                conn, _ = ready.accept()
            except OSError:
                continue
            path, slots = key.data
            if not slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=_carry, args=(conn, path, slots), daemon=True).start()


def parse(argv: list[str]) -> tuple[dict[int, str], list[str]]:
    """``PORT=SOCKET…`` before ``--``, the Agent's argv after it."""
    if "--" not in argv:
        raise SystemExit("relay: usage: relay.py PORT=SOCKET... -- COMMAND...")
    split = argv.index("--")
    doors: dict[int, str] = {}
    for word in argv[:split]:
        port, _, path = word.partition("=")
        if not port.isdigit() or not path:
            raise SystemExit(f"relay: {word!r} is not PORT=SOCKET")
        doors[int(port)] = path
    command = argv[split + 1 :]
    if not command:
        raise SystemExit("relay: no command to run")
    return doors, command


def main() -> None:
    doors, command = parse(sys.argv[1:])
    listeners: dict[socket.socket, str] = {}
    for port, path in doors.items():
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("127.0.0.1", port))
        except OSError as error:
            said = f"relay: cannot listen on 127.0.0.1:{port}: {error.strerror}"
            raise SystemExit(said) from None
        listener.listen(BACKLOG)
        listeners[listener] = path
    if os.fork() == 0:
        # Holds none of the Agent's pipes: the worker reads the Agent's output to its end.
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            serve(listeners)
        finally:
            os._exit(0)
    for listener in listeners:
        listener.close()
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"relay: cannot run {command[0]}: {error.strerror}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main()
