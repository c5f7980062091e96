"""Each Agent in a pod of its own: the launcher of ``AMUX_RUNTIME_LAUNCHER=agent-sandbox``.

For a launch the worker claims a sandbox pod from Kubernetes SIG Apps' agent-sandbox controller
(a ``SandboxClaim`` naming the chart's ``SandboxWarmPool``, whose ``SandboxTemplate`` sets the
pod's RuntimeClass, resources and security context), waits until the claim is Ready, and runs the
Agent's argv in that pod over the API server's exec websocket: stdin, stdout and stderr are
streamed, so the runners read the Agent exactly as they read a local process. The claim is
deleted when the Agent finishes, is stopped, or cannot be started; the pod goes with it.

What the plan says about the host does not apply in the pod, and is dropped where the command is
written (``pod_script``): the bwrap prefix (the pod and its RuntimeClass are the sandbox), the
cgroup and rlimit prefix (the template's resources are the bounds), the uid switch (the
template's securityContext is who the Agent runs as) and the in-sandbox relay (the sandbox pods'
NetworkPolicy is the network boundary).

Files reach the pod over the exec too (``runtime_bridge.pod_files``): the pod shares no volume
with its worker. Its work directory is an empty directory of its own at the worker's path, into
which the worker streams the launch's own trees before the Agent starts, and from which it takes
back the workspace and the conversation's home once the Agent has ended (finished, failed or
stopped), confined, bounded, and applied only once whole. Another conversation's files, or another
turn's run directory, are never in the pod. Its cost: the trees cross the API server twice each
turn, and the Agent's executables must lie at the paths the worker names, in the sandbox image.

The official ``kubernetes`` client is synchronous: its calls run in threads, and one thread per
launch pumps the exec websocket into the asyncio streams the runners read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import re
import secrets
import shlex
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runtime_bridge import pod_files
from runtime_bridge.providers.errors import SandboxUnavailable
from runtime_bridge.providers.plan import LaunchPlan
from runtime_bridge.providers.process import LINE_LIMIT, AgentInput, AgentProcess

logger = logging.getLogger("amux.kube")

CLAIM_GROUP = "extensions.agents.x-k8s.io"
CLAIM_VERSION = "v1beta1"
CLAIMS = "sandboxclaims"
SANDBOX_GROUP = "agents.x-k8s.io"
SANDBOX_VERSION = "v1beta1"
SANDBOXES = "sandboxes"
# The Sandbox's pod when it was adopted from a warm pool; else the pod has the Sandbox's name.
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
WORKER_LABEL = "amux-worker"
EXECUTION_LABEL = "amux-execution"
MANAGED_BY = {"app.kubernetes.io/managed-by": "amux"}
# Ready=False reasons the claim controller never recovers from by itself: failed at once.
TERMINAL_REASONS = frozenset(
    {
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
    }
)
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
# The exit status of a command whose pod went away before it said how it ended.
LOST = -int(signal.SIGKILL)
PUMP_POLL = 0.1
# How long a killed Agent's exec is given to report its end.
END_GRACE = 10.0
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """``text`` as a label value: itself when Kubernetes accepts it, else a digest of it."""
    if len(text) <= 63 and LABEL_VALUE.match(text):
        return text
    return hashlib.sha256(text.encode()).hexdigest()[:63]


def pod_script(plan: LaunchPlan, argv: list[str], pid_file: Path | None = None) -> str:
    """The shell script the pod runs for the launch: its working directory, its environment
    alone, then ``argv``; the Agent's pid in ``pid_file``, for a Stop to end it in the pod.

    Streamed in with the run directory rather than passed on the exec request, whose command
    the API server may keep in its audit log: the environment holds the launch's credentials.
    The script removes itself first. ``plan.sandbox``, ``plan.confine``, ``plan.run_as`` and
    ``plan.relay`` are left out on purpose: the pod's RuntimeClass, resources, securityContext
    and NetworkPolicy stand in for them.
    """
    env = " ".join(shlex.quote(f"{key}={value}") for key, value in plan.env.items())
    command = " ".join(shlex.quote(word) for word in argv)
    return (
        "#!/bin/sh\n"
        'rm -f -- "$0"\n'
        + (f"echo $$ > {shlex.quote(str(pid_file))}\n" if pid_file is not None else "")
        + f"cd -- {shlex.quote(str(plan.cwd))} || exit 126\n"
        f"exec env -i {env} {command}\n"
    )


class PodInput:
    """The command's stdin: written in order by a task that sends each chunk from a thread;
    ``close`` sends stdin's end (the v5 exec protocol's channel close)."""

    def __init__(self, send: Callable[[bytes], None], close: Callable[[], None]) -> None:
        self._send = send
        self._close = close
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._closing = False
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        while (chunk := await self._queue.get()) is not None:
            try:
                await asyncio.to_thread(self._send, chunk)
            except Exception:  # The pod went away: what is left unsent is dropped.
                self._drop()
                return
            finally:
                self._queue.task_done()
        self._queue.task_done()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._close)

    def _drop(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()

    def write(self, data: bytes) -> None:
        if self._closing:
            raise BrokenPipeError("the command's stdin is closed")
        self._check()
        if data:
            self._queue.put_nowait(bytes(data))

    async def drain(self) -> None:
        self._check()
        await self._queue.join()
        self._check()

    def _check(self) -> None:
        # Nothing sends any more once a send failed: writing on would wait for ever.
        if self._task.done() and not self._closing:
            raise BrokenPipeError("the command's pod went away")

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._queue.put_nowait(None)

    def is_closing(self) -> bool:
        return self._closing

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


_ids = itertools.count(1)


class PodProcess:
    """A command running in a sandbox pod, as the runners use a local process."""

    def __init__(
        self,
        claim: str,
        pod: str,
        socket: Any,
        api: Any,
        sent: Mapping[Path, pod_files.Manifest],
        pid_file: Path,
    ) -> None:
        self.claim = claim
        self.pod = pod
        # The trees the worker takes back, each with what it held when given to the pod.
        self.sent = sent
        self.pid_file = pid_file
        # No pid of this host's: a number that tells this launch's command from another's.
        self.pid = next(_ids)
        self.returncode: int | None = None
        self._socket = socket
        self._api = api
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.stdout: asyncio.StreamReader | None = asyncio.StreamReader(limit=LINE_LIMIT, loop=loop)
        self.stderr: asyncio.StreamReader | None = asyncio.StreamReader(limit=LINE_LIMIT, loop=loop)
        self._input = PodInput(lambda data: socket.write_stdin(data), self._close_stdin)
        self._ended: asyncio.Future[int] = loop.create_future()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._pump, name=f"exec-{pod}", daemon=True)
        self._thread.start()

    @property
    def stdin(self) -> AgentInput | None:
        return self._input

    def _close_stdin(self) -> None:
        self._socket.close_channel(STDIN)

    def _pump(self) -> None:
        """Frames from the exec websocket into the streams, until the command's status or the
        socket's end."""
        socket = self._socket
        assert self.stdout is not None and self.stderr is not None
        targets = {STDOUT: self.stdout, STDERR: self.stderr}
        status: Any = None
        try:
            while socket.is_open() and not self._halt.is_set():
                socket.update(timeout=PUMP_POLL)
                self._deliver(targets)
            self._deliver(targets)
            status = socket.read_channel(STATUS)
        except Exception as error:  # The connection broke: the command's end is unknown.
            logger.warning("exec stream of pod %s broke: %s", self.pod, error)
        finally:
            with contextlib.suppress(Exception):
                socket.close()
            # Once the server has closed, websocket-client's close() returns without closing
            # its socket (answering the close marked it disconnected): closed here.
            with contextlib.suppress(Exception):
                socket.sock.shutdown()
            with contextlib.suppress(Exception):
                self._api.close()
            code = exit_status(status)
            with contextlib.suppress(RuntimeError):  # The loop closed first.
                self._loop.call_soon_threadsafe(self._finish, code)

    def _deliver(self, targets: Mapping[int, asyncio.StreamReader]) -> None:
        for channel, reader in targets.items():
            data = self._socket.read_channel(channel)
            if data:
                self._loop.call_soon_threadsafe(reader.feed_data, data)

    def _finish(self, code: int) -> None:
        assert self.stdout is not None and self.stderr is not None
        self.stdout.feed_eof()
        self.stderr.feed_eof()
        self.returncode = code
        if not self._ended.done():
            self._ended.set_result(code)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    async def halt(self) -> None:
        """Stop reading (the pod is being deleted) and let the pump thread end."""
        self._halt.set()
        await self._input.aclose()
        await asyncio.to_thread(self._thread.join)


def exit_status(status: Any) -> int:
    """The command's exit status from the exec status channel: 0 for Success, the ExitCode
    cause for a failure; ``LOST`` when the pod said nothing (it went away)."""
    if not status:
        return LOST
    try:
        said = json.loads(status)
    except (ValueError, UnicodeDecodeError):
        return LOST
    if not isinstance(said, dict):
        return LOST
    if said.get("status") == "Success":
        return 0
    details = said.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else ():
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(str(cause.get("message")))
    return 1


class KubernetesLauncher:
    """Launches each Agent in a sandbox pod claimed from agent-sandbox, in ``namespace``.

    ``worker`` names this worker on its claims (so a later run of the same worker finds and
    deletes what it left); ``owner`` is the worker's own Pod (name, uid), when it knows it from
    the downward API: its claims then name it as their owner, so Kubernetes deletes them with
    the pod when the worker is lost for good.
    """

    def __init__(
        self,
        configuration: Any,
        namespace: str,
        warm_pool: str,
        worker: str,
        owner: tuple[str, str] | None = None,
        ready_seconds: float = 120.0,
        back_bytes: int = 2 * 1024**3,
    ) -> None:
        from kubernetes import client

        self._client = client
        self._configuration = configuration
        self._api = client.ApiClient(configuration)
        self._custom = client.CustomObjectsApi(self._api)
        self.namespace = namespace
        self.warm_pool = warm_pool
        self.worker = label_value(worker)
        self.owner = owner
        self.ready_seconds = ready_seconds
        # At most this much of each tree comes back from a pod (the workspace bound).
        self.back_bytes = back_bytes

    def close(self) -> None:
        self._api.close()

    def _claim_body(self, name: str, execution_id: str | None) -> dict[str, Any]:
        labels = {**MANAGED_BY, WORKER_LABEL: self.worker}
        if execution_id is not None:
            labels[EXECUTION_LABEL] = label_value(execution_id)
        metadata: dict[str, Any] = {"name": name, "labels": labels}
        if self.owner is not None:
            pod, uid = self.owner
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}
            ]
        return {
            "apiVersion": f"{CLAIM_GROUP}/{CLAIM_VERSION}",
            "kind": "SandboxClaim",
            "metadata": metadata,
            "spec": {"warmPoolRef": {"name": self.warm_pool}},
        }

    async def start(self, plan: LaunchPlan, argv: list[str]) -> AgentProcess:
        """Claim a pod, wait until it is Ready, and start ``argv`` in it.

        Raises:
            SandboxUnavailable: no pod became Ready in time, the controller refused the claim,
                or the API server could not be asked; the claim is deleted by then.
        """
        name = f"amux-{secrets.token_hex(6)}"
        trees = pod_files.trees_in(plan)
        # Refused before a claim is made, as the way in is. What each tree held when given to
        # the pod tells what the Agent changed in it.
        back = pod_files.trees_back(plan)
        sent = {tree: await asyncio.to_thread(pod_files.manifest, tree) for tree in back}
        pid_file = plan.roots[0] / f"{name}.pid"
        script = self._write_script(plan, argv, name, pid_file)
        try:
            await self._call(
                "create a SandboxClaim",
                name,
                self._custom.create_namespaced_custom_object,
                CLAIM_GROUP,
                CLAIM_VERSION,
                self.namespace,
                CLAIMS,
                self._claim_body(name, plan.execution_id),
            )
        except BaseException:
            script.unlink(missing_ok=True)
            raise
        try:
            sandbox = await asyncio.to_thread(self._until_ready, name)
            pod = await self._pod_of(name, sandbox)
            await self._stream_in(name, pod, plan, trees)
            script.unlink(missing_ok=True)
            socket, api = await asyncio.to_thread(self._exec, name, pod, script)
            return PodProcess(name, pod, socket, api, sent, pid_file)
        except BaseException:
            script.unlink(missing_ok=True)
            await asyncio.shield(self.release(name))
            raise

    def _write_script(self, plan: LaunchPlan, argv: list[str], name: str, pid_file: Path) -> Path:
        # Every plan's first root is its run directory (build_plan), streamed into the pod;
        # owner-only, as the plan's other files.
        path = plan.roots[0] / f"{name}.sh"
        path.write_text(pod_script(plan, argv, pid_file), encoding="utf-8")
        path.chmod(0o700)
        return path

    async def _stream_in(
        self, claim: str, pod: str, plan: LaunchPlan, trees: tuple[Path, ...]
    ) -> None:
        """The launch's own trees into the pod's empty work directory, before the Agent."""
        work_dir = pod_files.work_dir_of(plan)
        started = time.monotonic()
        sent = 0

        def feed(send: Callable[[bytes], None]) -> None:
            def counted(data: bytes) -> None:
                nonlocal sent
                sent += len(data)
                send(data)

            pod_files.pack(trees, work_dir, counted)

        # The pod's empty directory holds the work directory's path, not yet the directory.
        unpack = 'mkdir -p -- "$1" && exec tar -x -f - -C "$1"'
        command = ["/bin/sh", "-c", unpack, "sh", str(work_dir)]
        code, said = await asyncio.to_thread(self._run_in, claim, pod, command, feed, None)
        if code != 0:
            raise SandboxUnavailable(
                f"the worker could not give pod {pod} the turn's files (tar exited with {code}"
                + (f": {said}" if said else "")
                + ")",
                claim=claim,
                reason="StreamInFailed",
            )
        logger.info("gave pod %s %d bytes in %.1f s", pod, sent, time.monotonic() - started)

    async def _stream_back(self, process: PodProcess) -> None:
        """The trees the worker reads after a turn, from the pod: each extracted confined
        beside the worker's, and only once all were, what the Agent changed in them applied;
        one refused leaves them all as they are."""
        staged: list[tuple[Path, Path, pod_files.Manifest]] = []
        try:
            for tree, sent in process.sent.items():
                staged.append((await self._fetch(process, tree), tree, sent))
            for staging, tree, sent in staged:
                await asyncio.to_thread(pod_files.apply, staging, tree, sent)
        finally:
            for staging, _, _ in staged:
                shutil.rmtree(staging, ignore_errors=True)

    async def _fetch(self, process: PodProcess, tree: Path) -> Path:
        """The pod's copy of ``tree``, bounded, extracted confined into a directory beside it."""
        started = time.monotonic()
        with pod_files.spool_beside(tree) as spool:
            sink = pod_files.Bounded(spool, tree, self.back_bytes)
            command = ["tar", "-c", "-f", "-", "-C", str(tree), "."]
            code, said = await asyncio.to_thread(
                self._run_in, process.claim, process.pod, command, None, sink.write
            )
            if code != 0:
                raise SandboxUnavailable(
                    f"the worker could not take {tree} back from pod {process.pod} (tar exited "
                    f"with {code}" + (f": {said}" if said else "") + "); it keeps the copies "
                    "from before the turn",
                    claim=process.claim,
                    reason="StreamBackFailed",
                )
            staging = await asyncio.to_thread(pod_files.stage, spool, tree)
        logger.info(
            "took %s back from pod %s: %d bytes in %.1f s",
            tree,
            process.pod,
            sink.size,
            time.monotonic() - started,
        )
        return staging

    def _run_in(
        self,
        claim: str,
        pod: str,
        command: list[str],
        feed: Callable[[Callable[[bytes], None]], None] | None,
        receive: Callable[[bytes], None] | None,
    ) -> tuple[int, str]:
        """Run ``command`` in the pod to its end: ``feed`` writes its stdin, ``receive`` takes
        its stdout. Its exit status and the last line of its stderr."""
        socket, api = self._exec_command(claim, pod, command)
        errors = bytearray()
        status: Any = None
        try:
            if feed is not None:
                feed(socket.write_stdin)
            socket.close_channel(STDIN)

            def drain() -> None:
                data = socket.read_channel(STDOUT)
                if data and receive is not None:
                    receive(data)
                errors.extend(socket.read_channel(STDERR) or b"")
                del errors[:-4096]

            while socket.is_open():
                socket.update(timeout=PUMP_POLL)
                drain()
            drain()
            status = socket.read_channel(STATUS)
        except SandboxUnavailable:
            raise
        except Exception as error:
            raise SandboxUnavailable(
                f"the connection to pod {pod} broke: {error}", claim=claim, reason="ExecFailed"
            ) from None
        finally:
            with contextlib.suppress(Exception):
                socket.close()
            with contextlib.suppress(Exception):
                socket.sock.shutdown()
            api.close()
        lines = errors.decode("utf-8", "replace").strip().splitlines()
        return exit_status(status), (lines[-1] if lines else "")

    async def _call(self, doing: str, claim: str, call: Callable[..., Any], *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(call, *args)
        except ApiException as error:
            raise SandboxUnavailable(
                f"the worker could not {doing} ({error.status} {error.reason})",
                claim=claim,
                reason=str(error.reason),
            ) from None

    def _until_ready(self, name: str) -> str:
        """The Sandbox bound to claim ``name`` once the claim is Ready, watched until
        ``ready_seconds`` have passed."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        loop_deadline = time.monotonic() + self.ready_seconds
        last = "the claim was not bound yet"
        while (left := loop_deadline - time.monotonic()) > 0:
            watcher = watch.Watch()
            try:
                for event in watcher.stream(
                    self._custom.list_namespaced_custom_object,
                    CLAIM_GROUP,
                    CLAIM_VERSION,
                    self.namespace,
                    CLAIMS,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=max(1, int(left)),
                    _request_timeout=left + 5,
                ):
                    claim = event["object"]
                    if event["type"] == "DELETED":
                        raise SandboxUnavailable(
                            f"the SandboxClaim {name} was deleted before its pod was ready",
                            claim=name,
                            reason="Deleted",
                        )
                    ready, reason, message, sandbox = _readiness(claim)
                    if ready and sandbox:
                        return sandbox
                    if reason in TERMINAL_REASONS:
                        raise SandboxUnavailable(
                            f"agent-sandbox refused the SandboxClaim {name}: {reason}"
                            + (f" ({message})" if message else ""),
                            claim=name,
                            reason=reason,
                        )
                    if reason:
                        last = f"{reason}" + (f": {message}" if message else "")
                    if time.monotonic() >= loop_deadline:
                        break
            except ApiException as error:
                raise SandboxUnavailable(
                    f"the worker could not watch the SandboxClaim {name} "
                    f"({error.status} {error.reason})",
                    claim=name,
                    reason=str(error.reason),
                ) from None
            finally:
                watcher.stop()
        raise SandboxUnavailable(
            f"no sandbox pod was ready for this turn within {self.ready_seconds:g} s ({last}); "
            "check the agent-sandbox controller and its SandboxWarmPool",
            claim=name,
            reason="Timeout",
        )

    async def _pod_of(self, claim: str, sandbox: str) -> str:
        found = await self._call(
            "read the claim's Sandbox",
            claim,
            self._custom.get_namespaced_custom_object,
            SANDBOX_GROUP,
            SANDBOX_VERSION,
            self.namespace,
            SANDBOXES,
            sandbox,
        )
        annotations = found.get("metadata", {}).get("annotations") or {}
        pod = annotations.get(POD_NAME_ANNOTATION)
        return pod if isinstance(pod, str) and pod else sandbox

    def _exec(self, claim: str, pod: str, script: Path) -> tuple[Any, Any]:
        """The exec websocket of the Agent's script, and the ApiClient it was opened with."""
        return self._exec_command(claim, pod, ["/bin/sh", str(script)])

    def _exec_command(self, claim: str, pod: str, command: list[str]) -> tuple[Any, Any]:
        """The exec websocket of ``command`` in the pod, and the ApiClient it was opened with."""
        from kubernetes import client
        from kubernetes.stream import stream

        # An ApiClient of its own: the client's stream() swaps its ApiClient's transport for
        # the websocket while it connects, which would catch another thread's call.
        api = client.ApiClient(self._configuration)
        try:
            socket = stream(
                client.CoreV1Api(api).connect_get_namespaced_pod_exec,
                pod,
                self.namespace,
                command=command,
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                binary=True,
            )
        except Exception as error:
            api.close()
            raise SandboxUnavailable(
                f"the worker could not run {command[0]} in pod {pod}: {error}",
                claim=claim,
                reason="ExecFailed",
            ) from None
        return socket, api

    async def stop(self, process: AgentProcess) -> None:
        """End the Agent if it still runs, take back what the worker reads after the turn, then
        delete the launch's claim (its pod, and everything the Agent started there, go with it)
        and stop reading the command.

        Raises:
            SandboxUnavailable: what the pod left could not be taken back, or was refused; the
                worker's copies are as they were before the turn.
        """
        assert isinstance(process, PodProcess)
        try:
            if process.returncode is None:
                await self._end(process)
            await self._stream_back(process)
        finally:
            await asyncio.shield(self.release(process.claim))
            await process.halt()

    async def _end(self, process: PodProcess) -> None:
        """Kill the Agent in its pod (a Stop), and wait a moment for its exec to end."""
        command = ["/bin/sh", "-c", 'kill -KILL "$(cat -- "$1")"', "sh", str(process.pid_file)]
        with contextlib.suppress(SandboxUnavailable):
            await asyncio.to_thread(self._run_in, process.claim, process.pod, command, None, None)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(END_GRACE):
                await process.wait()

    async def release(self, claim: str) -> None:
        """Delete ``claim``; one already gone is fine, and a failure is logged, not raised: the
        worker's pod is its owner, and the next start deletes what is labelled with it."""
        from kubernetes.client.exceptions import ApiException

        try:
            await asyncio.to_thread(
                self._custom.delete_namespaced_custom_object,
                CLAIM_GROUP,
                CLAIM_VERSION,
                self.namespace,
                CLAIMS,
                claim,
            )
        except ApiException as error:
            if error.status != 404:
                logger.warning("could not delete SandboxClaim %s: %s", claim, error.reason)

    async def reclaim(self) -> None:
        """Delete the claims an earlier run of this worker left (it was killed mid-turn)."""
        from kubernetes.client.exceptions import ApiException

        selector = f"{WORKER_LABEL}={self.worker}"
        try:
            listed = await asyncio.to_thread(
                self._custom.list_namespaced_custom_object,
                CLAIM_GROUP,
                CLAIM_VERSION,
                self.namespace,
                CLAIMS,
                label_selector=selector,
            )
        except ApiException as error:
            raise SandboxUnavailable(
                f"the worker could not list its SandboxClaims in {self.namespace} "
                f"({error.status} {error.reason}); check its Role",
                reason=str(error.reason),
            ) from None
        for item in listed.get("items", []):
            name = item.get("metadata", {}).get("name")
            if isinstance(name, str):
                logger.info("deleting SandboxClaim %s left by an earlier run", name)
                await self.release(name)


def _readiness(claim: Mapping[str, Any]) -> tuple[bool, str, str, str | None]:
    """Whether the claim is Ready, the Ready condition's reason and message, and its Sandbox."""
    status = claim.get("status") or {}
    sandbox = (status.get("sandbox") or {}).get("name")
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
            return (
                ready,
                str(condition.get("reason") or ""),
                str(condition.get("message") or ""),
                (sandbox if isinstance(sandbox, str) else None),
            )
    return False, "", "", None
