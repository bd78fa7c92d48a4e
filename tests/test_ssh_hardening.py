"""The SSH transport's bad paths: known_hosts read tolerantly and appended to, never rewritten;
revoked keys refused; every ProxyJump hop checked like the host itself; the host helper's start
bounded by its timeout. Unit tests first (no network); then the same over real sshd hosts in
network namespaces (tests/beds/ssh.py, marked ssh)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import multiprocessing
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from orchestrator.config import SshBackend
from orchestrator.errors import TransportError
from orchestrator.transport.ssh import SshTransport
from orchestrator.transport.ssh.connect import connection_hops
from orchestrator.transport.ssh.helper import HelperClient, HelperTimeout
from orchestrator.transport.ssh.host_keys import (
    HostKeyError,
    HostKeyPolicy,
    KnownHosts,
    RevokedHostKeyError,
    UnknownHostKeyError,
    fingerprint,
)
from tests.beds import ssh as tb
from tests.conftest import ssh_testbed, wait_for


def new_key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()


def key_line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{names} {key.get_name()} {key.get_base64()}"


def sk_ed25519_line(names: str) -> str:
    """A FIDO (security key) host key: a type paramiko does not know."""
    blob = paramiko.Message()
    blob.add_string("sk-ssh-ed25519@openssh.com")
    blob.add_string(os.urandom(32))
    blob.add_string("ssh:")
    data = base64.b64encode(blob.asbytes()).decode()
    return f"{names} sk-ssh-ed25519@openssh.com {data}"


def hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def policy(path: Path, trust: bool = False) -> HostKeyPolicy:
    return HostKeyPolicy(path, trust, threading.Lock())


@pytest.fixture
def awkward(tmp_path: Path) -> tuple[Path, bytes, dict[str, paramiko.PKey]]:
    """A known_hosts file as users have them: comments, blank lines, a security-key host key,
    @cert-authority and @revoked lines, a hashed name, a wildcard, an unknown marker, junk."""
    keys = {name: new_key() for name in ("plain", "hashed", "ca", "revoked", "wild", "other")}
    text = "\n".join(
        [
            "# my hosts, kept by hand",
            key_line("plain.example,10.0.0.1", keys["plain"]) + " a trailing comment",
            "",
            sk_ed25519_line("fido.example"),
            key_line("*.corp.example", keys["ca"], "@cert-authority"),
            key_line("*", keys["revoked"], "@revoked"),
            key_line(hashed("hashed.example"), keys["hashed"]),
            key_line("*.wild.example,!bad.wild.example", keys["wild"]),
            key_line("marked.example", keys["other"], "@future-marker"),
            "not a key line",
            "broken.example ssh-ed25519 %%%not-base64%%%",
            "\t  # an indented comment",
        ]
    ).encode()  # no final newline: the user's editor left none
    path = tmp_path / "ssh" / "known_hosts"
    path.parent.mkdir()
    path.write_bytes(text)
    return path, text, keys


# --- known_hosts: read tolerantly -----------------------------------------------------------


def test_awkward_known_hosts_loads_and_each_line_means_what_ssh_means(awkward: tuple) -> None:
    path, _, keys = awkward
    known = KnownHosts.load(path)  # paramiko's own loader raises InvalidHostKey on @ lines

    def by_blob(name: str) -> list[bytes]:
        return [k.asbytes() for k in known.host_keys(name)]

    assert by_blob("plain.example") == by_blob("10.0.0.1") == [keys["plain"].asbytes()]
    assert by_blob("hashed.example") == [keys["hashed"].asbytes()]
    assert by_blob("a.wild.example") == [keys["wild"].asbytes()]
    assert by_blob("bad.wild.example") == []  # negated
    assert by_blob("fido.example") == []  # a key type paramiko cannot use: skipped
    assert by_blob("x.corp.example") == []  # a CA key is no host key
    assert by_blob("marked.example") == []  # an unknown marker: ignored, as ssh does
    assert known.is_revoked("anything", keys["revoked"])
    assert not known.is_revoked("anything", keys["plain"])
    assert known.has_cert_authority("x.corp.example")
    assert not known.has_cert_authority("plain.example")


def test_a_host_behind_awkward_known_hosts_gets_a_transport_error_not_a_crash(
    awkward: tuple,
) -> None:
    path, text, _ = awkward
    with socket.socket() as probe:  # a loopback port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = SshBackend.model_validate(
        {"type": "ssh", "known_hosts": str(path), "connect_timeout": 2.0,
         "hosts": [{"address": "127.0.0.1", "port": port, "name": "box"}]}
    )  # fmt: skip
    transport = SshTransport(backend.hosts[0], backend)
    with pytest.raises(TransportError, match=r"^box: cannot connect to .*127\.0\.0\.1"):
        transport.run(["true"])
    transport.close()
    assert path.read_bytes() == text


def test_prepare_loads_the_known_keys_of_that_host_only(awkward: tuple) -> None:
    path, _, keys = awkward
    client = paramiko.SSHClient()
    policy(path).prepare(client, "10.0.0.1", 22)
    assert client.get_host_keys().lookup("10.0.0.1") == {keys["plain"].get_name(): keys["plain"]}
    policy(path).prepare(client, "hashed.example", 2222)  # [hashed.example]:2222: not known
    assert len(client.get_host_keys()) == 0


# --- trusting a new key: one appended line ----------------------------------------------------


def test_trusting_a_key_appends_exactly_one_line_and_keeps_every_other_byte(
    awkward: tuple,
) -> None:
    path, text, _ = awkward
    key = new_key()
    client = paramiko.SSHClient()
    policy(path, trust=True).missing_host_key(client, "[10.9.9.9]:2222", key)
    line = f"[10.9.9.9]:2222 {key.get_name()} {key.get_base64()}\n".encode()
    assert path.read_bytes() == text + b"\n" + line  # the unterminated last line stays whole
    assert client.get_host_keys().lookup("[10.9.9.9]:2222") is not None
    policy(path, trust=True).missing_host_key(paramiko.SSHClient(), "[10.9.9.9]:2222", key)
    assert path.read_bytes() == text + b"\n" + line  # known now: nothing more written


def test_trusting_creates_a_private_file_where_there_was_none(tmp_path: Path) -> None:
    path = tmp_path / "new" / "known_hosts"
    key = new_key()
    policy(path, trust=True).missing_host_key(paramiko.SSHClient(), "h.example", key)
    assert path.read_text() == key_line("h.example", key) + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_key_changed_meanwhile_is_refused_not_recorded(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    old = new_key()
    path.write_text(key_line("h.example", old) + "\n")
    before = path.read_bytes()
    with pytest.raises(paramiko.BadHostKeyException):
        policy(path, trust=True).missing_host_key(paramiko.SSHClient(), "h.example", new_key())
    assert path.read_bytes() == before


def _trust_many(path: str, names: list[str]) -> None:
    """One process (or thread) trusting hosts, with its own thread lock: only the file lock
    stands between it and the others."""
    for name in names:
        HostKeyPolicy(Path(path), True, threading.Lock()).missing_host_key(
            paramiko.SSHClient(), name, new_key()
        )


def test_concurrent_trust_from_threads_and_processes_keeps_every_line(awkward: tuple) -> None:
    path, text, _ = awkward
    path.write_bytes(text + b"\n")
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_trust_many, args=(str(path), [f"p{i}-{j}.example" for j in range(5)]))
        for i in range(3)
    ]
    for proc in procs:
        proc.start()
    threads = [
        threading.Thread(
            target=_trust_many, args=(str(path), [f"t{i}-{j}.example" for j in range(5)])
        )
        for i in range(6)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    data = path.read_bytes()
    assert data.startswith(text + b"\n")
    added = data[len(text) + 1 :].decode().splitlines()
    names = sorted(line.split()[0] for line in added)
    expected = sorted(
        f"{w}{i}-{j}.example" for w, n in (("p", 3), ("t", 6)) for i in range(n) for j in range(5)
    )
    assert names == expected  # every line, each once, each whole


def test_the_same_host_trusted_at_once_is_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    key = new_key()
    barrier = threading.Barrier(8)

    def trust() -> None:
        barrier.wait()
        HostKeyPolicy(path, True, threading.Lock()).missing_host_key(
            paramiko.SSHClient(), "same.example", key
        )

    threads = [threading.Thread(target=trust) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert path.read_text() == key_line("same.example", key) + "\n"


# --- revoked and certificate-authority lines --------------------------------------------------


@pytest.mark.parametrize("trust", [False, True])
def test_a_revoked_key_is_refused_naming_host_and_fingerprint(awkward: tuple, trust: bool) -> None:
    path, text, keys = awkward
    with pytest.raises(RevokedHostKeyError) as err:
        policy(path, trust).missing_host_key(paramiko.SSHClient(), "10.0.0.7", keys["revoked"])
    message = str(err.value)
    assert "\n" not in message
    assert f"host key {fingerprint(keys['revoked'])} for 10.0.0.7 is marked @revoked" in message
    assert path.read_bytes() == text


def test_a_revoked_key_also_listed_as_known_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    key = new_key()
    path.write_text(
        key_line("h.example", key) + "\n" + key_line("h.example", key, "@revoked") + "\n"
    )
    client = paramiko.SSHClient()
    pol = policy(path, trust=True)
    pol.prepare(client, "h.example", 22)
    assert client.get_host_keys().lookup("h.example") is None  # so paramiko asks the policy
    with pytest.raises(RevokedHostKeyError, match=r"h\.example is marked @revoked"):
        pol.missing_host_key(client, "h.example", key)


def test_an_unknown_key_under_a_cert_authority_is_refused_with_the_reason(awkward: tuple) -> None:
    path, text, _ = awkward
    key = new_key()
    with pytest.raises(UnknownHostKeyError) as err:
        policy(path).missing_host_key(paramiko.SSHClient(), "gpu1.corp.example", key)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"unknown host key {fingerprint(key)} for gpu1.corp.example")
    assert "@cert-authority lines for gpu1.corp.example, which orchestrate does not use" in message
    assert "add the host's own key" in message
    assert f"ssh-keyscan gpu1.corp.example >> {path}" in message
    with pytest.raises(UnknownHostKeyError) as plain:
        policy(path).missing_host_key(paramiko.SSHClient(), "other.example", key)
    assert "@cert-authority" not in str(plain.value)
    assert path.read_bytes() == text


def test_an_unwritable_known_hosts_is_one_line_naming_the_host(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.mkdir()  # a directory: cannot be opened for appending, even by root
    with pytest.raises(HostKeyError, match=r"cannot (read|record) .*known_hosts"):
        policy(path, trust=True).missing_host_key(paramiko.SSHClient(), "h.example", new_key())


# --- every ProxyJump hop is checked ------------------------------------------------------------


def test_every_hop_of_a_proxyjump_chain_gets_our_policy_and_its_own_known_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host target\n  HostName 10.1.0.3\n  ProxyJump root@10.1.0.1,jump2\n"
        "Host jump2\n  HostName 10.1.0.2\n  Port 2222\n"
    )
    monkeypatch.setenv("HOME", str(home))
    keys = {name: new_key() for name in ("10.1.0.3", "10.1.0.1", "[10.1.0.2]:2222")}
    known = tmp_path / "known_hosts"
    known.write_text("".join(key_line(name, key) + "\n" for name, key in keys.items()))
    backend = SshBackend.model_validate(
        {"type": "ssh", "known_hosts": str(known), "connect_timeout": 3.0,
         "hosts": [{"address": "target"}]}
    )  # fmt: skip
    conn = SshTransport(backend.hosts[0], backend).new_connection()
    hops = connection_hops(conn)
    # (fabric orders a multi-hop ProxyJump chain its own way: only the set of hops matters here)
    assert hops[0] is conn
    assert sorted((h.host, h.port) for h in hops) == [
        ("10.1.0.1", 22),
        ("10.1.0.2", 2222),
        ("10.1.0.3", 22),
    ]
    for hop in hops:
        name = hop.host if hop.port == 22 else f"[{hop.host}]:{hop.port}"
        assert isinstance(hop.client._policy, HostKeyPolicy)  # not fabric's AutoAddPolicy
        assert hop.client.get_host_keys().lookup(name) == {keys[name].get_name(): keys[name]}
        assert len(hop.client.get_host_keys()) == 1
    for gateway in hops[1:]:
        assert gateway.connect_timeout == 3.0


# --- the host helper's start is bounded -------------------------------------------------------


def _construct_in_thread(
    channel: paramiko.Channel, timeout: float, payload: Callable[[], bytes] = bytes
) -> tuple[list, float]:
    """HelperClient(...) on a thread, so that a start that never returns fails the test rather
    than hanging it."""
    outcome: list = []

    def construct() -> None:
        try:
            outcome.append(HelperClient(channel, "h7", timeout, payload))
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=construct, daemon=True)
    thread.start()
    thread.join(timeout + 5)
    return outcome, time.monotonic() - started


@pytest.fixture
def channel() -> Iterator[paramiko.Channel]:
    """A paramiko channel with no transport: what the host sends is what the test feeds."""
    chan = paramiko.Channel(1)
    yield chan
    chan.in_buffer.close()  # ends any reader still waiting on it
    chan.in_stderr_buffer.close()


@pytest.mark.parametrize("sent", [b"", b'{"ready": tru'], ids=["nothing", "half-a-line"])
def test_a_helper_that_never_says_ready_times_out_naming_the_host(
    channel: paramiko.Channel, sent: bytes
) -> None:
    channel.in_buffer.feed(sent)
    outcome, elapsed = _construct_in_thread(channel, 0.5)
    assert outcome, "HelperClient still waiting for the ready line"
    assert isinstance(outcome[0], HelperTimeout), outcome
    assert isinstance(outcome[0], TransportError)
    assert str(outcome[0]) == "h7: the worker helper sent no ready line within 0.5s"
    assert elapsed >= 0.5  # order: it waited its timeout (then returned: `outcome` above)


def test_a_helper_that_says_something_else_and_stays_is_reported_in_one_line(
    channel: paramiko.Channel,
) -> None:
    channel.in_buffer.feed(b"Python 2.7 says hello\n")
    channel.in_stderr_buffer.feed(b"Traceback (most recent call last):\n  oops\nImportError: x\n")
    outcome, _ = _construct_in_thread(channel, 0.5)  # stderr stays open
    assert outcome and isinstance(outcome[0], TransportError), outcome
    assert not isinstance(outcome[0], HelperTimeout)
    message = str(outcome[0])
    assert "\n" not in message
    assert message.startswith("h7: cannot start the worker helper")
    assert message.endswith("Traceback (most recent call last): oops ImportError: x")


def test_a_helper_that_says_ready_serves_with_no_timeout_on_its_reader(
    channel: paramiko.Channel,
) -> None:
    channel.in_buffer.feed(b'{"ready": 1, "root": "/home/u/.cache/orchestrate/worker-0a"}\n')
    outcome, _ = _construct_in_thread(channel, 0.5)
    assert outcome and isinstance(outcome[0], HelperClient), outcome
    assert outcome[0].root == "/home/u/.cache/orchestrate/worker-0a"
    assert channel.gettimeout() is None
    time.sleep(0.7)  # past the ready timeout: the reader still waits, the helper is still open
    assert not outcome[0].closed


def test_a_helper_that_asks_for_the_worker_package_is_sent_it_on_its_channel(
    channel: paramiko.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[bytes] = []
    monkeypatch.setattr(channel, "sendall", lambda data: sent.append(bytes(data)))
    channel.in_buffer.feed(b'{"need": 1}\n{"ready": 1, "root": "/c/worker-0a"}\n')
    outcome, _ = _construct_in_thread(channel, 0.5, payload=lambda: b"PACKAGE")
    assert outcome and isinstance(outcome[0], HelperClient), outcome
    assert sent == [b"7\nPACKAGE"] and outcome[0].root == "/c/worker-0a"


def test_a_helper_that_cannot_install_the_package_is_reported_in_one_line(
    channel: paramiko.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel, "sendall", lambda data: None)
    channel.in_buffer.feed(b'{"need": 1}\n')
    channel.in_buffer.close()  # it exits, having said why on stderr
    channel.in_stderr_buffer.feed(b"cannot install the worker package: No space left on device\n")
    channel.in_stderr_buffer.close()
    outcome, _ = _construct_in_thread(channel, 0.5, payload=lambda: b"PACKAGE")
    assert outcome and isinstance(outcome[0], TransportError), outcome
    assert str(outcome[0]) == (
        "h7: cannot start the worker helper: cannot install the worker package: "
        "No space left on device"
    )


@pytest.mark.parametrize("garbage", [b"[1]\n", b"not json\n", b'{"id": "x"}\n', b"5\n"])
def test_a_malformed_helper_reply_fails_the_waiting_call_at_once_naming_the_host(
    channel: paramiko.Channel, garbage: bytes
) -> None:
    """Regression: a reply that is not a JSON object killed the reader thread and left the call
    waiting for its whole timeout."""
    channel.in_buffer.feed(b'{"ready": 1, "root": "/c/worker-0a"}\n')
    outcome, _ = _construct_in_thread(channel, 0.5)
    assert outcome and isinstance(outcome[0], HelperClient), outcome
    helper = outcome[0]
    channel.sendall = lambda data: None  # type: ignore[method-assign]  # the host: this test
    failed: list[BaseException] = []

    def call() -> None:
        try:
            helper.call("watch", {}, 60)
        except BaseException as exc:
            failed.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    channel.in_buffer.feed(garbage)
    caller.join(30)  # order: the call's own timeout is 60 s
    assert not caller.is_alive(), "the call waited on after a malformed reply"
    assert isinstance(failed[0], TransportError) and not isinstance(failed[0], HelperTimeout)
    assert str(failed[0]).startswith("h7: the worker helper sent a malformed reply"), failed
    with pytest.raises(TransportError, match=r"^h7: the worker helper sent a malformed reply"):
        helper.call("watch", {}, 60)  # and every later call, at once


class _SilentChannel:
    """A channel whose host never answers the exec request: paramiko waits for that reply with
    no timeout; closing the channel ends the wait, as paramiko's does."""

    def __init__(self) -> None:
        self.closed_event = threading.Event()
        self.closed = False

    def exec_command(self, command: str) -> None:
        self.closed_event.wait(30)
        raise paramiko.SSHException("Channel closed.")

    def close(self) -> None:
        self.closed = True
        self.closed_event.set()


class _Transport:
    def __init__(self, channel: _SilentChannel) -> None:
        self.channel = channel

    def open_session(self, timeout: float | None = None) -> _SilentChannel:
        return self.channel


def test_a_host_that_never_answers_the_exec_request_times_out() -> None:
    silent = _SilentChannel()
    with pytest.raises(HelperTimeout, match=r"^h7: the worker helper did not start: no reply"):
        HelperClient.start(_Transport(silent), "python -m worker.hostd", "h7", 0.5)  # type: ignore[arg-type]
    assert silent.closed  # the timeout closed it: the channel's own 30 s wait never ended it


# --- over real sshd hosts ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    with ssh_testbed(tmp_path_factory, 2, epochs=1, name="hardening-bed") as bed:
        yield bed


def known_line(bed: tb.Testbed, host: tb.TestHost) -> str:
    return next(
        line
        for line in Path(bed.known_hosts).read_text().splitlines()
        if line.startswith(host.address + " ")
    )


def sshd_sessions(host: tb.TestHost) -> set[int]:
    """sshd's per-connection processes on the host (children of the listener we started)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
            except OSError:
                continue
            if int(text[text.rfind(")") + 2 :].split()[1]) == host.sshd_pid:
                found.add(int(entry.name))
    return found


def no_new_sessions(host: tb.TestHost, before: set[int]) -> None:
    """Every connection made since `before` is gone: nothing of ours is left half open."""
    wait_for(lambda: sshd_sessions(host) <= before, 5)


@pytest.fixture
def jump_home(bed: tb.Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """~/.ssh/config reaching h1 as `inner`, through h0 as its ProxyJump host."""
    jump, target = bed.hosts
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host inner\n  HostName {target.address}\n  ProxyJump {jump.address}\n"
        f"Host *\n  User root\n  IdentityFile {bed.identity_file}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return "inner"


def jump_transport(bed: tb.Testbed, known: Path, trust: bool = False) -> SshTransport:
    backend = SshBackend.model_validate(
        {"type": "ssh", "known_hosts": str(known), "trust_unknown_hosts": trust,
         "connect_timeout": 5.0, "python": bed.python,
         "hosts": [{"address": "inner", "name": "inner"}]}
    )  # fmt: skip
    return SshTransport(backend.hosts[0], backend)


@pytest.mark.ssh
def test_an_unknown_jump_host_key_is_refused(
    bed: tb.Testbed, jump_home: str, tmp_path: Path
) -> None:
    jump, target = bed.hosts
    known = tmp_path / "known_hosts"
    known.write_text(known_line(bed, target) + "\n")  # the target's key only
    transport = jump_transport(bed, known)
    before = sshd_sessions(jump)
    try:
        with pytest.raises(TransportError) as err:
            transport.run(["hostname"])
    finally:
        transport.close()
    message = str(err.value)
    assert message.startswith("inner: unknown host key ssh-ed25519 SHA256:"), message
    assert f" for {jump.address}, not in {known}" in message
    assert known.read_text() == known_line(bed, target) + "\n"
    no_new_sessions(jump, before)  # the refused hop was closed


@pytest.mark.ssh
def test_a_changed_jump_host_key_is_refused_even_when_trusting(
    bed: tb.Testbed, jump_home: str, tmp_path: Path
) -> None:
    jump, target = bed.hosts
    known = tmp_path / "known_hosts"
    impostor = paramiko.Ed25519Key.from_private_key_file(bed.identity_file)  # any other key
    text = key_line(jump.address, impostor) + "\n" + known_line(bed, target) + "\n"
    known.write_text(text)
    transport = jump_transport(bed, known, trust=True)
    try:
        with pytest.raises(
            TransportError, match=rf"^inner: host key for {jump.address} has CHANGED"
        ):
            transport.run(["hostname"])
    finally:
        transport.close()
    assert known.read_text() == text


@pytest.mark.ssh
def test_a_known_jump_host_works_and_closing_leaves_no_hop_open(
    bed: tb.Testbed, jump_home: str, tmp_path: Path
) -> None:
    jump, target = bed.hosts
    known = tmp_path / "known_hosts"
    known.write_text(known_line(bed, jump) + "\n" + known_line(bed, target) + "\n")
    transport = jump_transport(bed, known)
    before = {host.name: sshd_sessions(host) for host in bed.hosts}
    try:
        assert transport.run(["hostname"]).stdout.strip() == b"h1"
        assert sshd_sessions(jump) - before["h0"]  # it did go through the jump host
    finally:
        transport.close()
    no_new_sessions(jump, before["h0"])  # fabric's close alone leaves the jump hop open
    no_new_sessions(target, before["h1"])


@pytest.mark.ssh
def test_trusting_an_unknown_jump_host_records_its_key(
    bed: tb.Testbed, jump_home: str, tmp_path: Path
) -> None:
    jump, target = bed.hosts
    known = tmp_path / "known_hosts"
    before = "# hand-kept\n" + known_line(bed, target) + "\n"
    known.write_text(before)
    transport = jump_transport(bed, known, trust=True)
    try:
        assert transport.run(["hostname"]).stdout.strip() == b"h1"
    finally:
        transport.close()
    assert known.read_text() == before + known_line(bed, jump) + "\n"


@pytest.mark.ssh
def test_a_host_whose_helper_never_says_ready_fails_in_time_and_reconnects(
    bed: tb.Testbed, tmp_path: Path
) -> None:
    host = bed.hosts[1]
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 29.5\n")  # a "python" that never says ready
    silent.chmod(0o755)
    backend = SshBackend.model_validate(
        {"type": "ssh", "user": "root", "identity_file": bed.identity_file,
         "known_hosts": bed.known_hosts, "connect_timeout": 1.5, "python": str(silent),
         "hosts": [{"address": host.address, "name": "h1"}]}
    )  # fmt: skip
    transport = SshTransport(backend.hosts[0], backend)
    before = sshd_sessions(host)
    try:
        started = time.monotonic()
        with pytest.raises(HelperTimeout, match=r"^h1: the worker helper sent no ready line"):
            transport.observe(None, [])
        assert time.monotonic() - started < 29.5  # order: before the fake python ends itself
        no_new_sessions(host, before)  # the connection was dropped...
        assert transport.run(["hostname"]).stdout.strip() == b"h1"  # ...and the next reconnects
    finally:
        transport.close()
        for pid in tb_pids(host, b"sleep\x0029.5"):
            os.kill(pid, 9)


def tb_pids(host: tb.TestHost, needle: bytes) -> list[int]:
    """Processes in the host's namespace (all started by this test bed) whose argv holds needle."""
    out = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True)
    found = []
    for pid in out.stdout.split():
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found
