"""Secrets as the surfaces give them, and what the sandbox is given so that it trusts its link's CA.

    secrets={"NAME": {"value": "...", "hosts": ["api.example.org", "*.example.org"]}}
    secrets={"NAME": {"file": "/path", "hosts": [...]}}      only where the caller allows host files
    secrets={"NAME": {"stored": True}}   or   secrets=["NAME", ...]      the server's stored secret NAME
    secrets={"NAME": {"stored": "OTHER", "hosts": [...]}}    stored OTHER as $NAME, to fewer hosts

A stored secret (secretstore.py) brings its value and hosts; a request may name fewer hosts (each
within one of the stored ones), never others (Forbidden): whoever stored it decided where it goes.

The sandbox sees `NAME=<placeholder>` (ca.placeholder) in its environment; the egress daemon puts
the value in place of the placeholder only in requests on a connection it dialled itself, by one of
the listed hosts' names (the policy must allow it by name or `*`), over TLS on port 443 verified
for that name (intercept.py, proxy.py): never plain HTTP, never an address the sandbox chose. Values
may not hold CR, LF or NUL: a value goes into request heads, where those would let it forge
headers or requests. Hosts are host-name rules of the network policy (policy.Rule: a name or a
leading `*.`; no address, no port, not `*`).

The trust store: the run's `/dev/sandtree/ca.pem` = the image's own bundle (IMAGE_BUNDLES, the
first one the image has) + the link's CA, and `sandbox_env` points the usual variables at it.
"""

from __future__ import annotations

import re

from ..errors import Forbidden, InvalidInput
from .ca import CA, placeholder
from .policy import Rule
from .state import Secret

__all__ = ["parse_secrets", "stored_ref", "check_name", "check_hosts", "check_value", "sandbox_env", "bundle",
           "link_ca", "placeholders", "CA_VARIABLES", "IMAGE_BUNDLES", "RUNTIME_PATH", "MAX_SECRETS", "MAX_VALUE",
           "MIN_VALUE", "MAX_HOSTS", "MAX_NAME"]

MAX_SECRETS = 64
MAX_VALUE = 16 * 1024          # bytes of a value (UTF-8): it goes into request heads
MIN_VALUE = 4                  # shorter values would be masked all over the responses (intercept.py)
MAX_HOSTS = 32                 # hosts per secret
MAX_NAME = 128
RUNTIME_PATH = "/dev/sandtree/ca.pem"
# Where images keep their CA bundle: Debian/Ubuntu/Alpine/Arch, Fedora/RHEL, openSUSE, the
# OpenSSL default of other builds.
IMAGE_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                 "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem")
# The variables TLS clients read for their trust store: OpenSSL (and Python's ssl, Go, Ruby),
# requests, pip, Node (added to its own store), git, curl.
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS",
                "GIT_SSL_CAINFO", "CURL_CA_BUNDLE")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FORBIDDEN = re.compile(r"[\r\n\x00]")


def parse_secrets(value, *, host_files: bool = False, stored=None) -> list[Secret]:
    """Secrets from what the surfaces send (None, {} or []: none), each with a fresh placeholder.
    `host_files`: whether {"file": path} may read a file of the host (the local SDK and CLI, not a
    tenant of a server). `stored(ref)`: the stored secret (secretstore.StoredSecret) a
    {"stored": ...} entry names (NotFound when the caller has none by that name); None: such
    entries are refused. Bad input raises InvalidInput naming the secret; nothing is read then
    unless every entry's shape was valid."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):             # ["NAME", ...]: stored secrets by name
        if not all(isinstance(n, str) for n in value):
            raise InvalidInput("a list of secrets names stored secrets: every entry must be a name")
        value = {n: {"stored": True} for n in value}
    if not isinstance(value, dict):
        raise InvalidInput(f"secrets must be a mapping of NAME to {{'value' or 'file' or 'stored', 'hosts'}} "
                           f"or a list of stored secrets' names, not {type(value).__name__}")
    if len(value) > MAX_SECRETS:
        raise InvalidInput(f"secrets: at most {MAX_SECRETS} ({len(value)} given)")
    checked = []
    for name, spec in value.items():
        checked.append((name, *_check(name, spec, host_files)))
    out = []
    for name, hosts, literal, path, ref in checked:
        if ref is not None:
            out.append(_from_store(name, ref, hosts, stored))
            continue
        text = literal if path is None else _read(name, path)
        _check_value(name, text)
        out.append(Secret(name=name, value=text, placeholder=placeholder(name), hosts=hosts))
    return out


def stored_ref(name: str, spec) -> str | None:
    """The stored secret an entry names (its own name for `True`), None for a value or file."""
    if not isinstance(spec, dict) or "stored" not in spec:
        return None
    return name if spec["stored"] is True else spec["stored"]


def _from_store(name: str, ref: str, hosts: tuple[str, ...], stored) -> Secret:
    if stored is None:
        raise InvalidInput(f"secret {name}: stored secrets are not available here")
    found = stored(ref)
    for h in hosts:                                  # narrower only: each within a stored host
        rule = Rule.parse(h)
        if not any(Rule.parse(s).covers(rule) for s in found.hosts):
            raise Forbidden(f"secret {name}: host {h} is not within the stored secret's hosts "
                            f"({', '.join(found.hosts)}): a request may narrow them, not widen them",
                            secret=name)
    return Secret(name=name, value=found.value, placeholder=placeholder(name), hosts=hosts or found.hosts,
                  stored=found.name)


def check_name(name) -> str:
    """A secret's name: an environment variable's, not one of the trust-store variables."""
    if not isinstance(name, str) or not _ENV_NAME.match(name) or len(name) > MAX_NAME:
        raise InvalidInput(f"secret name {name!r} is not a valid environment variable name "
                           f"(letters, digits, '_', not starting with a digit, at most {MAX_NAME})")
    if name in CA_VARIABLES:
        raise InvalidInput(f"secret name {name!r} is one of the trust-store variables the sandbox is given")
    return name


def check_hosts(name: str, hosts) -> tuple[str, ...]:
    """The hosts a secret may be sent to, as canonical name rules (InvalidInput naming the secret)."""
    return _hosts(name, hosts)


def check_value(name: str, text: str) -> None:
    """A value's size and characters (the message names the secret, never the value)."""
    _check_value(name, text)


def _check(name, spec, host_files: bool):
    check_name(name)
    if not isinstance(spec, dict):
        raise InvalidInput(f"secret {name}: expected {{'value' or 'file', 'hosts'}}, not {type(spec).__name__}")
    unknown = set(spec) - {"value", "file", "stored", "hosts"}
    if unknown:
        raise InvalidInput(f"secret {name}: unknown field(s) {sorted(unknown)} (expected value, file or stored; hosts)")
    if sum(k in spec for k in ("value", "file", "stored")) != 1:
        raise InvalidInput(f"secret {name}: give exactly one of 'value', 'file' and 'stored'")
    if "stored" in spec:
        ref = stored_ref(name, spec)
        if not isinstance(ref, str) or not ref:
            raise InvalidInput(f"secret {name}: 'stored' is true (the stored secret {name}) or a stored "
                               "secret's name")
        return (_hosts(name, spec["hosts"]) if spec.get("hosts") is not None else ()), None, None, ref
    if "file" in spec:
        if not host_files:
            raise InvalidInput(f"secret {name}: 'file' is not allowed here (a host file): give 'value'")
        if not isinstance(spec["file"], str) or not spec["file"].startswith("/"):
            raise InvalidInput(f"secret {name}: 'file' must be an absolute path")
    elif not isinstance(spec["value"], str):
        raise InvalidInput(f"secret {name}: 'value' must be a string")
    return _hosts(name, spec.get("hosts")), spec.get("value"), spec.get("file"), None


def _hosts(name: str, hosts) -> tuple[str, ...]:
    if isinstance(hosts, str):
        hosts = [hosts]
    if not isinstance(hosts, (list, tuple)) or not hosts:
        raise InvalidInput(f"secret {name}: 'hosts' must list the host names it may be sent to")
    if len(hosts) > MAX_HOSTS:
        raise InvalidInput(f"secret {name}: at most {MAX_HOSTS} hosts ({len(hosts)} given)")
    out = []
    for h in hosts:
        try:
            rule = Rule.parse(h)
        except InvalidInput as e:
            raise InvalidInput(f"secret {name}: host {h!r}: {e.message}") from None
        if rule.kind not in ("name", "suffix") or rule.ports:
            raise InvalidInput(f"secret {name}: host {h!r} must be a host name or '*.' and a name "
                               "(no address, port or '*'): the value is sent only to that name, over TLS verified for it")
        text = str(rule)
        if text not in out:
            out.append(text)
    return tuple(out)


def _read(name: str, path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_VALUE + 2)
    except OSError as e:
        raise InvalidInput(f"secret {name}: cannot read {path}: {e.strerror}") from None
    if data.endswith(b"\n"):                       # a file written by `echo` ends with a newline
        data = data[:-2] if data.endswith(b"\r\n") else data[:-1]
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"secret {name}: {path} is not UTF-8 text") from None


def _check_value(name: str, text: str) -> None:
    size = len(text.encode())
    if size > MAX_VALUE:
        raise InvalidInput(f"secret {name}: the value is over {MAX_VALUE} bytes")
    if size < MIN_VALUE:
        raise InvalidInput(f"secret {name}: the value is shorter than {MIN_VALUE} bytes")
    if _FORBIDDEN.search(text):
        raise InvalidInput(f"secret {name}: the value holds CR, LF or NUL (it goes into request heads)")


def sandbox_env(ca_path: str = RUNTIME_PATH) -> dict[str, str]:
    """The variables that make the sandbox's TLS clients trust `ca_path` (the bundle)."""
    return {v: ca_path for v in CA_VARIABLES}


def bundle(ca_pem: bytes, image_bundle: bytes | None) -> bytes:
    """The image's trust store (its bundle's bytes, None when it has none) followed by the link's
    CA: what the sandbox trusts for the run. Everything it trusted before, it still trusts."""
    if not isinstance(ca_pem, bytes) or b"-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise InvalidInput("the link's CA must be a PEM certificate")
    head = image_bundle or b""
    if head and not head.endswith(b"\n"):
        head += b"\n"
    return head + ca_pem + (b"" if ca_pem.endswith(b"\n") else b"\n")


def link_ca(label: str, secrets: list[Secret], every_host: bool = False) -> CA | None:
    """The CA a link with `secrets` needs (None without secrets), constrained to their hosts: what
    the daemon keeps in LinkState.ca and whose pem() goes into the run's bundle. `every_host`: a
    taped link's (network/tape.py), which ends TLS for every host its policy allows: not
    constrained (its key, as every link CA's, is never on disk, and only this sandbox trusts it)."""
    if every_host:
        return CA.new(label)
    if not secrets:
        return None
    return CA.new(label, hosts=[h for s in secrets for h in s.hosts])


def placeholders(secrets: list[Secret]) -> dict[str, str]:
    """NAME -> placeholder: what the run's environment gets (never the values)."""
    return {s.name: s.placeholder for s in secrets}
