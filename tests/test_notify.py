"""[notify]: a hook command and a webhook (a real HTTP server on loopback) receive the job's
events as JSON, with its status; a webhook that fails is retried; a hook that fails or hangs
becomes an event and never holds supervision up."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import orchestrator.supervision.notify as notify
from orchestrator.config import load_config
from orchestrator.config.model import NotifySection
from orchestrator.errors import ConfigError
from orchestrator.state.states import JobState
from orchestrator.state.store import JobRecord, Store
from orchestrator.supervision.notify import Notifier
from tests.conftest import CliResult, fake_job, status_json, wait_for
from worker.proctl import group_members, is_alive

RECORD = """
import json, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(json.load(sys.stdin)) + "\\n")
"""


class Receiver(ThreadingHTTPServer):
    """Answers 500 to the first `fail_first` POSTs, then 204; keeps what it accepted."""

    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.posts = 0
        self.received: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler) -> None:
                body = handler.rfile.read(int(handler.headers["Content-Length"]))
                self.posts += 1
                if self.posts <= self.fail_first:
                    handler.send_response(500)
                else:
                    self.received.append(json.loads(body))
                    handler.send_response(204)
                handler.end_headers()

            def log_message(handler, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(fail_first=1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _job(tmp_path: Path, mode: str, notify: str, restart: str = "max_restarts = 2") -> Path:
    path = tmp_path / f"{mode.replace(':', '-')}.toml"
    extra = f"[restart]\n{restart}\nbackoff = 0.1\n\n[notify]\n{notify}\n"
    path.write_text(fake_job(tmp_path, ["--mode", mode], workers=2, extra=extra))
    return path


def test_a_command_and_a_webhook_receive_the_events_with_the_jobs_status(
    tmp_path: Path, cli: Callable[..., CliResult], receiver: Receiver
) -> None:
    record = tmp_path / "record.py"
    record.write_text(RECORD)
    got = tmp_path / "got.jsonl"
    notify = (
        f"command = {json.dumps([sys.executable, str(record), str(got)])}\n"
        f'webhook = "http://127.0.0.1:{receiver.server_address[1]}/hook"\n'
    )
    # A preemption (exit 42 on the first attempt), then success.
    assert cli("launch", str(_job(tmp_path, "fail-first:42", notify)), timeout=120).code == 0
    job = status_json(cli)["jobs"][0]
    by_command = [json.loads(ln) for ln in got.read_text().splitlines()]
    assert [d["event"] for d in by_command] == ["preempted", "succeeded"]
    assert [d["event"] for d in receiver.received] == ["preempted", "succeeded"]
    assert receiver.posts == 3  # the first POST got a 500 and was tried again
    for document in (*by_command, *receiver.received):
        assert document["job"] == job["id"] and document["status"]["id"] == job["id"]
        assert {t["index"] for t in document["status"]["tasks"]} == {0, 1}
    assert by_command[0]["message"].startswith("preempted: restart not counted, in 0s, after: ")
    assert by_command[1]["status"]["state"] == "succeeded"
    assert "notify_failed" not in [e["kind"] for e in job.get("events", [])]


def test_only_the_chosen_events_and_a_failing_or_hanging_hook_becomes_an_event(
    tmp_path: Path, cli: Callable[..., CliResult], receiver: Receiver
) -> None:
    failing = f'events = ["failed"]\ncommand = ["{sys.executable}", "-c", "import sys; sys.exit("boom")"]\n'
    failing = failing.replace('"boom"', "'boom'")
    result = cli("launch", str(_job(tmp_path, "fail-first:3", failing, "max_restarts = 0")),
                 timeout=120)  # fmt: skip
    assert result.code == 1, result
    job = status_json(cli, status_json(cli)["jobs"][0]["id"])["jobs"][0]
    problems = [e["message"] for e in job["events"] if e["kind"] == "notify_failed"]
    assert problems == [f"notify command {sys.executable}: exited 1: boom"], job["events"]
    hanging = (
        'events = ["succeeded"]\ncommand = ["sleep", "60"]\ntimeout = 1.0\n'
        f'webhook = "http://127.0.0.1:{receiver.server_address[1]}/hook"\n'
    )
    assert cli("launch", str(_job(tmp_path, "ok", hanging)), timeout=120).code == 0
    job = status_json(cli, status_json(cli)["jobs"][0]["id"])["jobs"][0]
    problems = [e["message"] for e in job["events"] if e["kind"] == "notify_failed"]
    assert problems == ["notify command sleep: still running after 1s"], job["events"]
    assert [d["event"] for d in receiver.received] == ["succeeded"]  # only what was chosen


# --- the notifier itself, against raw loopback servers ------------------------------------

Answer = Callable[[socket.socket], None]
OK = b"HTTP/1.1 204 No Content\r\n\r\n"


class RawServer:
    """A loopback TCP server: its n-th connection gets answers[n] (the last, every later one);
    keeps each request it read, and when its connection came (monotonic)."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.came: list[float] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.came.append(time.monotonic())
            answer = self.answers[min(len(self.came), len(self.answers)) - 1]
            thread = threading.Thread(target=self._answer, args=(conn, answer), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _answer(self, conn: socket.socket, answer: Answer) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            while length and len(body) < int(length[1]) and (chunk := conn.recv(65536)):
                body += chunk
            self.requests.append(data[: len(head) + 4] + body)
            answer(conn)

    def methods(self) -> list[str]:
        return [r.split(b" ", 1)[0].decode() for r in self.requests]

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        self.listener.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def start(*answers: Answer) -> RawServer:
        servers.append(RawServer(*answers))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def _send(data: bytes) -> Answer:
    return lambda conn: conn.sendall(data)


def _trickle(conn: socket.socket) -> None:
    """A status line, then one header a byte at a time, for 20 s at most."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    for _ in range(40):
        time.sleep(0.5)
        conn.sendall(b"z")  # fails once the client gave up


def _notifier(tmp_path: Path, **notify: Any) -> tuple[Notifier, Store]:
    """A Notifier for a job of the store, as the supervisor makes one ([notify] given)."""
    store = Store(tmp_path / "state.db")
    now = time.time()
    store.create_job(JobRecord(id="job-1", name="job", state=JobState.RUNNING, backend="local",
                               config_path="c.toml", config_json="{}", job_dir=str(tmp_path),
                               created=now, updated=now), [])  # fmt: skip
    section = NotifySection.model_construct(**{**NotifySection().model_dump(), **notify})
    return Notifier(section, store, "job-1"), store


def _deliver(notifier: Notifier, store: Store, *events: str) -> list[str]:
    """Send these events, let them all go out; the notify_failed messages."""
    for event in events:
        notifier.event(event, f"{event}: test")
    notifier.close(patience=60)
    assert notifier._thread is not None and not notifier._thread.is_alive()
    return _problems(store)


def _problems(store: Store) -> list[str]:
    return [e.message for e in store.events("job-1") if e.kind == "notify_failed"]


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b"HELLO\r\n\r\n", "not an HTTP answer: HELLO"),
        (
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n",
            "got more than 100 headers",
        ),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"y" * 70000 + b"\r\n\r\n", "header line"),
    ],
    ids=["garbage", "101-headers", "long-header"],
)
def test_a_webhook_answering_anything_but_http_is_a_failure_and_later_events_still_go_out(
    tmp_path: Path, raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch,
    answer: bytes, problem: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(notify, "WEBHOOK_TRIES", 1)
    server = raw_server(_send(answer), _send(OK))
    notifier, store = _notifier(tmp_path, webhook=server.url, timeout=10.0)
    notifier.event("failed", "failed: test")
    wait_for(lambda: _problems(store), 30)
    assert notifier._thread is not None and notifier._thread.is_alive()
    problems = _deliver(notifier, store, "succeeded")
    assert len(problems) == 1 and problem in problems[0], problems
    assert problems[0].startswith("notify webhook: ") and problems[0].endswith(" after 1 tries")
    assert len(server.requests) == 2  # the thread lived on: `succeeded` went out


def test_any_exception_in_a_hook_is_a_failure_and_the_thread_lives_on(
    tmp_path: Path, raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL that urllib cannot parse (given past the config's check), then an exception
    nobody foresaw: each is a notify_failed event, and the next event still goes out."""
    monkeypatch.setattr(notify, "WEBHOOK_TRIES", 1)
    notifier, store = _notifier(tmp_path, webhook="http://u:p@[::1/x")
    assert _deliver(notifier, store, "failed") == ["notify webhook: Invalid IPv6 URL after 1 tries"]
    server = raw_server(_send(OK))
    calls: list[str] = []

    def post(url: str, body: bytes, timeout: float, headers: dict[str, str]) -> object:
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError("nobody foresaw this")
        from orchestrator.supervision.notify_http import post as real

        return real(url, body, timeout, headers)

    monkeypatch.setattr(notify, "post", post)
    (tmp_path / "again").mkdir()
    notifier, store = _notifier(tmp_path / "again", webhook=server.url)
    assert _deliver(notifier, store, "failed", "succeeded") == [
        "notify webhook: nobody foresaw this"
    ]
    assert len(server.requests) == 1


def test_a_webhook_that_trickles_is_given_its_timeout_for_a_whole_try(
    tmp_path: Path, raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "WEBHOOK_TRIES", 1)
    server = raw_server(_trickle, _send(OK))
    notifier, store = _notifier(tmp_path, webhook=server.url, timeout=1.0)
    sent = time.monotonic()
    problems = _deliver(notifier, store, "failed", "succeeded")
    assert problems == ["notify webhook: no answer within 1s after 1 tries"]
    assert len(server.requests) == 2
    # order: the first try ended long before the server's 20 s trickle would have
    assert server.came[1] - sent < 15  # order: see above


def test_a_redirect_is_a_failure_and_never_followed(
    tmp_path: Path, raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "WEBHOOK_TRIES", 1)
    redirect = b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
    server = raw_server(_send(redirect), _send(OK))
    notifier, store = _notifier(tmp_path, webhook=server.url)
    problems = _deliver(notifier, store, "failed", "succeeded")
    assert problems == ["notify webhook: HTTP 302 (redirects are not followed) after 1 tries"]
    assert server.methods() == ["POST", "POST"]  # no GET of the Location


def test_a_slack_webhook_gets_text_and_headers_from_the_environment_and_is_retried_as_asked(
    tmp_path: Path, raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`format = "slack"` posts {"text": ...}; a header's value comes from the environment; a
    429 is tried again after its Retry-After, a 403 is not tried again."""
    paused: list[float] = []
    monkeypatch.setattr(notify, "pause", paused.append)
    monkeypatch.setenv("HOOK_AUTH", "Bearer t0ken-in-the-environment")
    server = raw_server(
        _send(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n\r\n"),
        _send(OK),
        _send(b"HTTP/1.1 403 Forbidden\r\n\r\n"),
    )
    notifier, store = _notifier(
        tmp_path, webhook=server.url, format="slack", headers={"Authorization": "HOOK_AUTH"}
    )
    problems = _deliver(notifier, store, "failed", "succeeded")
    assert paused == [7.0]  # the server's Retry-After, not the backoff's 1 s
    assert problems == ["notify webhook: HTTP 403 (not tried again)"]
    assert len(server.requests) == 3
    first = server.requests[0]
    assert b"\r\nAuthorization: Bearer t0ken-in-the-environment\r\n" in first
    assert json.loads(first.split(b"\r\n\r\n", 1)[1]) == {
        "text": "orchestrate: job job-1 failed: failed: test"
    }
    assert not any(b"t0ken" in p.read_bytes() for p in tmp_path.glob("state.db*"))
    monkeypatch.delenv("HOOK_AUTH")
    (tmp_path / "unset").mkdir()
    notifier, store = _notifier(
        tmp_path / "unset", webhook=server.url, headers={"Authorization": "HOOK_AUTH"}
    )
    assert _deliver(notifier, store, "failed") == [
        "notify webhook: environment variable HOOK_AUTH is not set (headers)"
    ]
    assert len(server.requests) == 3  # nothing sent without its header


def test_a_post_sends_the_urls_credentials_and_goes_through_a_proxy(
    raw_server: Callable[..., RawServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.supervision.notify_http import post

    server = raw_server(_send(OK))
    url = server.url.replace("http://", "http://hook%20user:p%40ss@")
    assert post(url, b'{"a": 1}', 10.0).problem == ""
    [request] = server.requests
    assert request.startswith(b"POST /hook HTTP/1.1\r\n") and request.endswith(b'\r\n{"a": 1}')
    credentials = base64.b64encode(b"hook user:p@ss")
    assert b"\r\nAuthorization: Basic " + credentials + b"\r\n" in request
    proxy = raw_server(_send(OK), _send(b"HTTP/1.1 403 Forbidden\r\n\r\n"))
    for name in ("no_proxy", "NO_PROXY", "https_proxy", "HTTPS_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", proxy.url.removesuffix("/hook"))
    monkeypatch.setenv("https_proxy", proxy.url.removesuffix("/hook"))
    assert post("http://hooks.invalid:81/x?y", b"{}", 10.0).problem == ""
    assert (
        post("https://hooks.invalid/x", b"{}", 10.0).problem == "proxy refused the tunnel: HTTP 403"
    )
    assert proxy.requests[0].startswith(b"POST http://hooks.invalid:81/x?y HTTP/1.1\r\n")
    assert b"\r\nHost: hooks.invalid:81\r\n" in proxy.requests[0]
    assert proxy.requests[1].startswith(b"CONNECT hooks.invalid:443 HTTP/1.1\r\n")


def _alive(pids: list[int]) -> set[int]:
    return {pid for pid in pids if is_alive(pid)}


def test_a_hanging_command_is_ended_with_its_whole_process_group(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    pids = tmp_path / "pids"
    hang = f"echo $$ > {pids}; sleep 100 & echo $! >> {pids}; exec sleep 100"
    notifier, store = _notifier(tmp_path, command=["sh", "-c", hang], timeout=2.0)
    notifier.event("failed", "failed: test")
    wait_for(lambda: len(pids.read_text().split()) == 2 if pids.exists() else False, 60)
    started = [int(p) for p in pids.read_text().split()]
    reap_pids.extend(started)  # should the test fail: they end with it
    assert _deliver(notifier, store) == ["notify command sh: still running after 2s"]
    # SIGKILLed, the background sleep goes (is reaped by init) a moment later; sh (now the
    # other sleep) was the group's leader
    wait_for(lambda: not _alive(started) and not group_members(started[0]), 10)


def test_a_command_that_exits_leaves_nothing_running_and_its_stdin_need_not_be_read(
    tmp_path: Path, reap_pids: list[int]
) -> None:
    from orchestrator.supervision.notify import run_command

    pids = tmp_path / "pids"
    left = f"sleep 100 & echo $! > {pids}; exit 0"
    ran = run_command(["sh", "-c", left], b"x" * 1_000_000, 60.0)  # far more than a pipe holds
    reap_pids.extend(int(p) for p in pids.read_text().split())
    assert (ran.code, ran.stderr) == (0, b"")
    wait_for(lambda: not _alive(reap_pids), 10)
    ran = run_command(["sleep", "100"], b"x" * 1_000_000, 0.5)  # never reads it, never ends
    assert ran.code is None


def test_a_command_writing_without_end_is_not_kept_in_memory(tmp_path: Path) -> None:
    write = (
        "import sys; sys.stdout.buffer.write(b'o' * 50_000_000); "
        "sys.stderr.buffer.write(b'e' * 50_000_000 + b'\\nthe end\\n'); sys.exit(3)"
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    notifier, store = _notifier(tmp_path, command=[sys.executable, "-c", write], timeout=120.0)
    assert _deliver(notifier, store, "failed") == [
        f"notify command {sys.executable}: exited 3: the end"
    ]
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 40_000, f"the supervisor's peak memory grew {grown} KiB"  # not 100 MB
    from orchestrator.supervision.notify import run_command

    ran = run_command([sys.executable, "-c", write], b"{}", 120.0)
    assert ran.code == 3 and ran.stderr.endswith(b"e\nthe end\n")
    assert len(ran.stderr) <= notify.STDERR_KEPT


CONFIG = """
[job]
name = "t"
shared_dir = "shared"

[entrypoint]
module = "worker.examples.digits"

[backend]
type = "local"
workers = 1

[notify]
"""


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://u:p@[::1/x", "not a valid URL: Invalid IPv6 URL"),
        ("http://[::1]:99999/x", "not a valid URL: Port out of range 0-65535"),
        (
            "http://host:port/x",
            "not a valid URL: Port could not be cast to integer value as 'port'",
        ),
        ("http:///x", "must be an http:// or https:// URL naming a host"),
        ("ftp://host/x", "must be an http:// or https:// URL naming a host"),
        ("http://hooks.example/ü", "must be ASCII (percent-encode other characters)"),
        ("http://hooks.example/a b", "must not hold spaces or control characters"),
    ],
)
def test_a_webhook_url_is_checked_as_it_will_be_read(
    tmp_path: Path, url: str, problem: str
) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(CONFIG + f"webhook = {json.dumps(url)}\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}: notify.webhook: {problem}"


def test_a_relative_command_is_found_from_the_configs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    (conf / "hooks").mkdir(parents=True)
    hook = conf / "hooks" / "notify.sh"
    hook.write_text('#!/bin/sh\ncat > "$(dirname "$0")/got.json"\n')
    hook.chmod(0o755)
    monkeypatch.chdir(tmp_path)  # elsewhere: the path is the config's, not the cwd's
    for given, expected in [
        (["hooks/notify.sh", "--x"], [str(hook), "--x"]),
        (["./hooks/notify.sh"], [str(hook)]),
        (["notify-send", "a/b"], ["notify-send", "a/b"]),  # a bare name: looked up in PATH
        ([str(hook)], [str(hook)]),
    ]:
        (conf / "cluster.toml").write_text(CONFIG + f"command = {json.dumps(given)}\n")
        assert load_config(conf / "cluster.toml").notify.command == expected
    (conf / "cluster.toml").write_text(CONFIG + 'command = ["hooks/notify.sh"]\n')
    config = load_config(conf / "cluster.toml")
    notifier, store = _notifier(tmp_path, **config.notify.model_dump())
    assert _deliver(notifier, store, "failed") == []
    assert json.loads((conf / "hooks" / "got.json").read_text())["event"] == "failed"
