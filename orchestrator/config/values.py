"""The values a cluster.toml holds: limits, address/user/label rules, and message helpers.

Pure: every rule here is a function of its value alone.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

DEFAULT_SSH_PORT = 22
MAX_PORT = 65535
# cluster.toml is small: anything bigger is not one (and is never read whole).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
# A config nests 6 deep at most (backend.hosts[i].setup[j][k]); refused well beyond that.
MAX_NESTING = 16
# Any duration: far beyond any sensible timeout, and well inside what sleeps and waits accept.
MAX_SECONDS = 30 * 24 * 3600
MAX_RESTARTS = 1000
# Linux: one argv or environment string, with its NUL, must fit in MAX_ARG_STRLEN (32 pages).
MAX_ARG_STRLEN = 128 * 1024
# The env and args orchestrate adds must leave room under ARG_MAX (usually 2 MiB, shared with
# the host's own environment and TF_CONFIG): 8 bytes a pointer besides each string.
EXEC_BUDGET = 1024 * 1024


_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,127}")
_PORT = re.compile(r"[0-9]{1,5}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def show(value: object, limit: int = 60) -> str:
    """A value for a one-line message: repr (control characters escaped), cut to `limit`."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """Text for a one-line message: as is when printable, else its repr."""
    return text if text.isprintable() else repr(text)


def _is_ip(address: str) -> bool:
    if "%" in address:  # no IPv6 zone ids: the zone is not an address other hosts can reach
        return False
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def _is_hostname(address: str) -> bool:
    """RFC 1123 labels ('_' allowed too: ssh_config Host aliases often have one)."""
    name = address.removesuffix(".")
    if not name or len(name) > 253 or re.fullmatch(r"[0-9.]+", name):
        return False  # all digits and dots: an IPv4 address or nothing
    return all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def normalized_address(address: str) -> str:
    """The same host spelled the same way: hostnames ignore case, IPs in canonical form."""
    if _is_ip(address):
        return str(ipaddress.ip_address(address))
    return address.lower().removesuffix(".")


def _check_address(address: str) -> str:
    if _is_ip(address) or _is_hostname(address):
        return address
    raise ValueError(_address_problem(address))


def _address_problem(address: str) -> str:
    user, at, rest = address.rpartition("@")
    host, port = rest, None
    bracketed = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", rest)
    if bracketed:
        host, port = bracketed.group(1), bracketed.group(2)
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    clean = (
        (not at or _USER.fullmatch(user))
        and (port is None or (_PORT.fullmatch(port) and 1 <= int(port) <= MAX_PORT))
        and (_is_ip(host) or _is_hostname(host))
    )
    if clean and (at or port is not None):
        held = [w for w, there in (("a user", at), ("a port", port is not None)) if there]
        keys = [f'user = "{user}"'] if at else []
        keys += [f"port = {int(port)}"] if port is not None else []
        return (
            f'{show(address)} holds {" and ".join(held)}: write address = "{host}" '
            f"with {' and '.join(keys)} (this host's `user` and `port` keys)"
        )
    if clean and bracketed:
        return f'{show(address)}: write an IPv6 address without brackets: address = "{host}"'
    bad = [c for c in address if not (c.isascii() and (c.isalnum() or c in "._:-"))]
    if address.startswith("-"):
        why = "starts with '-'"
    elif bad and (bad[0].isspace() or not bad[0].isprintable()):
        why = "holds whitespace or a control character"
    elif bad:
        why = f"holds {bad[0]!r}"
    else:
        why = "is neither a hostname nor an IP address"
    hint = " (a user and a port go in this host's `user` and `port` keys)" if at or port else ""
    return (
        f"not a host address: {show(address)} {why}; give a hostname (letters, digits, '-', "
        f"'_', dots) or an IPv4/IPv6 address{hint}"
    )


def _check_user(user: str) -> str:
    if _USER.fullmatch(user):
        return user
    raise ValueError(
        f"not a user name: {show(user)} (letters, digits, '_', '.', '-', '@'; "
        "not starting with '-' or '.')"
    )


def _check_label(label: str) -> str:
    if label.isprintable():
        return label
    raise ValueError(f"must be printable, without control characters: {show(label)}")


MAX_PATH = 1024  # characters of a path in cluster.toml (Linux's PATH_MAX is 4096 bytes)
MAX_NAME = 255  # bytes of one path component (NAME_MAX)


def _check_path(path: Path) -> Path:
    text = str(path)
    if not text.isprintable():  # newlines, escapes, bidi overrides: printed raw otherwise
        raise ValueError(f"must be printable, without control characters: {show(text)}")
    if len(text) > MAX_PATH:
        raise ValueError(f"a path of at most {MAX_PATH} characters (got {len(text)})")
    for part in path.parts:
        if len(part.encode()) > MAX_NAME:
            raise ValueError(f"each part of the path at most {MAX_NAME} bytes: {show(part)}")
    return path


def _check_interpreter(python: str) -> str:
    # A path may hold spaces ("/opt/my envs/bin/python"); a name may not, and no word of a
    # path may be an option ("/usr/bin/python3 -u"): it is one executable, never a command.
    words = python.split()
    spaced = len(words) > 1 and ("/" not in words[0] or any(w.startswith("-") for w in words))
    if not python or not python.isprintable() or python != python.strip() or spaced:
        raise ValueError(
            f"must be one executable (a name or a path), not a command line: {show(python)}"
        )
    return python


def _check_module(module: str) -> str:
    """What `python -m` takes: dotted identifiers (never an option such as '-c')."""
    if not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"must be a module name such as 'pkg.train' (got {show(module)})")
    return module


def oneline(what: BaseException | str) -> str:
    """A message on one line: whitespace runs (newlines too) made one space, the rest escaped."""
    return printable(" ".join(str(what).split()))


def key_path(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            # A key of control characters or spaces is shown quoted and escaped.
            name = item if _PLAIN_KEY.fullmatch(item) and len(item) <= 60 else show(item)
            parts.append(("." if parts else "") + name)
    return "".join(parts)


HostAddress = Annotated[str, Field(min_length=1), AfterValidator(_check_address)]
UserName = Annotated[str, AfterValidator(_check_user)]
Label = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_check_label)]
Interpreter = Annotated[str, AfterValidator(_check_interpreter)]
ModuleName = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_check_module)]
# A command run on a host: an argv list whose program is named.
Argv = Annotated[list[str], AfterValidator(lambda argv: _check_argv(argv))]


def _check_argv(argv: list[str]) -> list[str]:
    if not argv or not argv[0]:
        raise ValueError(f"an argv list whose first item is the program (got {show(argv)})")
    return argv


def check_url(url: str) -> str:
    """[notify] webhook's check: the URL as urlsplit, urllib and http.client read it, so that
    a POST can be tried at all (ValueError, one line, if not)."""
    if len(url) > 2048:
        raise ValueError("must be at most 2048 characters")
    if any(not c.isprintable() or c.isspace() for c in url):
        raise ValueError("must not hold spaces or control characters")
    if not url.isascii():  # http.client sends the request line as ASCII
        raise ValueError("must be ASCII (percent-encode other characters)")
    import urllib.parse
    import urllib.request  # here: its imports only for a webhook

    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a port that is no number, or out of range, raises
        urllib.request.Request(url)
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {oneline(exc)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL naming a host")
    return url
