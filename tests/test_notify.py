"""[notify]: a hook command and a webhook (a real HTTP server on loopback) receive the job's
events as JSON, with its status; a webhook that fails is retried; a hook that fails or hangs
becomes an event and never holds supervision up."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import CliResult, fake_job, status_json

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
