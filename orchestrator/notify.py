"""[notify]: hooks run on the coordinator when a job fails, restarts, is preempted, loses a
host, has a straggler, succeeds or is stopped. A command gets the event and the job's status as
one JSON document on stdin; a webhook gets the same as an HTTP POST, retried with backoff.

Supervision never waits on a hook: events queue to a thread of their own. A hook that fails
(or hangs past its timeout) becomes a `notify_failed` event of the job; at the job's end the
supervisor gives the queue a bounded time to drain."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.config.values import oneline
from orchestrator.store import Store

if TYPE_CHECKING:
    from orchestrator.config.model import NotifySection

WEBHOOK_TRIES = 4  # a POST that fails is tried again after 1, 2, 4 s
DRAIN_SECONDS = 30.0  # at the job's end, the longest the queue is waited for


@dataclass(frozen=True)
class Notice:
    event: str
    message: str
    at: float  # the coordinator's clock


def document(store: Store, job_id: str, notice: Notice) -> dict[str, Any]:
    """What a hook receives: the event and the job's status (`status JOB --json`'s job)."""
    from orchestrator.views import status_documents

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
            for problem in (self._run_command(body), self._post(body)):
                if problem:  # a hook's failure must not end this thread
                    with contextlib.suppress(Exception):
                        store.add_event(self.job_id, "notify_failed", problem)

    def _run_command(self, body: bytes) -> str:
        argv = self.config.command
        if not argv:
            return ""
        try:
            done = subprocess.run(argv, input=body, capture_output=True,
                                  timeout=self.config.timeout, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return f"notify command {argv[0]}: still running after {self.config.timeout:g}s"
        except OSError as exc:
            return f"notify command {argv[0]}: {oneline(exc)}"
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            return f"notify command {argv[0]}: exited {done.returncode}: {oneline(tail[0])[:200]}"
        return ""

    def _post(self, body: bytes) -> str:
        url = self.config.webhook
        if not url:
            return ""
        problem = ""
        for attempt in range(WEBHOOK_TRIES):
            if attempt:
                time.sleep(2 ** (attempt - 1))
            request = urllib.request.Request(
                url, data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.config.timeout) as answer:
                    if 200 <= answer.status < 300:
                        return ""
                    problem = f"HTTP {answer.status}"
            except urllib.error.HTTPError as exc:
                problem = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                problem = oneline(getattr(exc, "reason", exc))
        return f"notify webhook: {problem} after {WEBHOOK_TRIES} tries"
