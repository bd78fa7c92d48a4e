"""[notify]: hooks run on the coordinator when a job fails, restarts, is preempted, loses a
host, has a straggler, succeeds or is stopped. A command gets the event and the job's status as
one JSON document on stdin; a webhook gets the same as an HTTP POST, retried with backoff.

Supervision never waits on a hook: events queue to a thread of their own. A hook that fails
(or hangs past its timeout) becomes a `notify_failed` event of the job; at the job's end the
supervisor gives the queue a bounded time to drain."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from orchestrator.config.values import oneline
from orchestrator.state.store import Store
from orchestrator.supervision.notify_http import post

if TYPE_CHECKING:
    from orchestrator.config.model import NotifySection

WEBHOOK_TRIES = 4  # a POST that fails is tried again after 1, 2, 4 s
DRAIN_SECONDS = 30.0  # at the job's end, the longest the queue is waited for
STDERR_KEPT = 4096  # of a command's stderr, the last bytes kept (for its failure's message)
pause = time.sleep  # between a webhook's tries (its own name: a test records the pauses)


@dataclass(frozen=True)
class Notice:
    event: str
    message: str
    at: float  # the coordinator's clock


def document(store: Store, job_id: str, notice: Notice) -> dict[str, Any]:
    """What a hook receives: the event and the job's status (`status JOB --json`'s job)."""
    from orchestrator.supervision.job_document import status_documents

    [status] = status_documents(store, [store.get_job(job_id)])
    return {
        "event": notice.event,
        "job": job_id,
        "message": notice.message,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(notice.at)),
        "status": status,
    }


class Notifier:
    """Queues the job's events for its hooks; delivers them on a thread of its own."""

    def __init__(self, config: NotifySection, store: Store, job_id: str) -> None:
        self.config = config
        self.job_id = job_id
        self.store_path = store.path
        self._queue: queue.Queue[Notice | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.enabled = bool(config.command or config.webhook)

    def event(self, kind: str, message: str) -> None:
        """Never blocks: the hooks run later, on the notifier's thread."""
        if not self.enabled or kind not in self.config.events:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._deliver, name="notify", daemon=True)
            self._thread.start()
        self._queue.put(Notice(kind, message, time.time()))

    def close(self, patience: float = DRAIN_SECONDS) -> None:
        """Let the queued events go out, for at most `patience` seconds."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(patience)
        if self._thread.is_alive():
            Store(self.store_path).add_event(
                self.job_id, "notify_failed", f"hooks still running after {patience:g}s: left"
            )

    def _deliver(self) -> None:
        store = Store(self.store_path)  # this thread's own connection
        while (notice := self._queue.get()) is not None:
            try:
                body = json.dumps(document(store, self.job_id, notice)).encode()
            except Exception as exc:  # the store is gone: the event still goes out
                plain = {"event": notice.event, "job": self.job_id, "message": notice.message}
                body = json.dumps({**plain, "error": str(exc)}).encode()
            for what, hook in (("command", self._run_command), ("webhook", self._post)):
                try:
                    problem = hook(body)
                except Exception as exc:  # whatever a hook does, this thread lives on
                    problem = f"notify {what}: {oneline(exc) or type(exc).__name__}"
                if problem:
                    with contextlib.suppress(Exception):
                        store.add_event(self.job_id, "notify_failed", problem)

    def _run_command(self, body: bytes) -> str:
        argv = self.config.command
        if not argv:
            return ""
        try:
            ran = run_command(argv, body, self.config.timeout)
        except OSError as exc:
            return f"notify command {argv[0]}: {oneline(exc)}"
        if ran.code is None:
            return f"notify command {argv[0]}: still running after {self.config.timeout:g}s"
        if ran.code != 0:
            tail = ran.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return f"notify command {argv[0]}: exited {ran.code}: {oneline(tail[0])[:200]}"
        return ""

    def _post(self, body: bytes) -> str:
        url = self.config.webhook
        if not url:
            return ""
        headers, missing = webhook_headers(self.config.headers)
        if missing:
            return f"notify webhook: environment variable {missing} is not set (headers)"
        if self.config.format == "slack":
            body = slack_body(body)
        delay = 1.0
        for attempt in range(1, WEBHOOK_TRIES + 1):
            answer = post(url, body, self.config.timeout, headers)
            if not answer.problem:
                return ""
            if not answer.retry:
                return f"notify webhook: {answer.problem} (not tried again)"
            if attempt < WEBHOOK_TRIES:
                pause(answer.retry_after if answer.retry_after is not None else delay)
                delay *= 2
        return f"notify webhook: {answer.problem} after {WEBHOOK_TRIES} tries"


def webhook_headers(names: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """The webhook's extra headers, each value read from the environment variable the config
    names (so that a token is never written in cluster.toml or the store); the first variable
    that is not set, if any."""
    headers = {}
    for header, variable in names.items():
        value = os.environ.get(variable)
        if value is None:
            return {}, variable
        headers[header] = value
    return headers, None


def slack_body(body: bytes) -> bytes:
    """The event as a Slack (or Mattermost, Teams, Discord-compatible) incoming webhook wants
    it: one line of text."""
    event = json.loads(body)
    text = f"orchestrate: job {event['job']} {event['event']}: {event['message']}"
    return json.dumps({"text": text}).encode()


@dataclass(frozen=True)
class Ran:
    code: int | None  # None: still running at its timeout (then killed)
    stderr: bytes  # the last STDERR_KEPT bytes of it


def run_command(argv: list[str], body: bytes, timeout: float) -> Ran:
    """Run argv with body on its stdin, in a session of its own, for at most `timeout` s.
    When it exits, or at the timeout, what is left of its process group is killed: a hook
    leaves nothing running. stdout is discarded and only stderr's tail kept: a hook may write
    without end."""
    deadline = time.monotonic() + timeout
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    tail = bytearray()
    try:
        exited = os.pidfd_open(proc.pid)  # readable once it exits (it stays unreaped)
        try:
            ended = _converse(proc, exited, body, tail, deadline)
        finally:
            os.close(exited)
    finally:
        _end_group(proc)
    return Ran(proc.returncode if ended else None, bytes(tail))


def _converse(
    proc: subprocess.Popen[bytes], exited: int, body: bytes, tail: bytearray, deadline: float
) -> bool:
    """Write body to its stdin and keep its stderr's tail, neither ever blocking, until it has
    exited and its stderr is closed, or the deadline. True: it exited in time."""
    assert proc.stdin is not None and proc.stderr is not None
    stdin, stderr, pending = proc.stdin.fileno(), proc.stderr.fileno(), memoryview(body)
    os.set_blocking(stdin, False)
    os.set_blocking(stderr, False)
    ended = False
    with selectors.DefaultSelector() as waiting:
        waiting.register(exited, selectors.EVENT_READ, "exited")
        waiting.register(stderr, selectors.EVENT_READ, "stderr")
        waiting.register(stdin, selectors.EVENT_WRITE, "stdin")
        while len(waiting.get_map()) and (left := deadline - time.monotonic()) > 0:
            for key, _ in waiting.select(left):
                if key.fd not in waiting.get_map():  # let go earlier in this batch
                    continue
                if key.data == "stdin":
                    try:
                        pending = pending[os.write(stdin, pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it does not read its stdin: not a failure
                        pending = pending[:0]
                    if not pending:
                        _let_go(waiting, proc.stdin)
                elif key.data == "stderr":
                    if chunk := os.read(stderr, 65536):
                        tail += chunk
                        del tail[:-STDERR_KEPT]
                    else:
                        waiting.unregister(stderr)
                else:  # it exited: what it left in its group goes too (and stderr closes)
                    ended = True
                    waiting.unregister(exited)
                    _let_go(waiting, proc.stdin)
                    _kill_group(proc)
    return ended


def _let_go(waiting: selectors.BaseSelector, pipe: IO[bytes]) -> None:
    if not pipe.closed:
        waiting.unregister(pipe.fileno())
        pipe.close()  # its reader sees the end of its input


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group. Its leader is our own child, not reaped before
    this: the group's number cannot be anyone else's."""
    if proc.pid > 1 and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    _kill_group(proc)
    for pipe in (proc.stdin, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)  # SIGKILLed: at once, unless stuck in the kernel
