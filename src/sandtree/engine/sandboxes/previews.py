"""Preview origins: every exposed port of every sandbox is served under a host name of its own,
`p<port>-<sandbox id>.<preview domain>` (E2B's `PORT-ID.domain`), so each is its own browser origin.

Why: a page a sandbox serves is written by whatever runs in the sandbox. Served on an origin it
shared with other sandboxes' pages, it could register a service worker over that whole origin (a
`Service-Worker-Allowed: /` answer) and then answer, in any browser that once opened it, every
later preview of any sandbox there: read those pages and their signed URLs. Per host name, the
browser keeps each preview's workers, storage and host-only cookies to itself.

The preview base says where previews are reached: a URL whose host starts with `*.` (`*` stands
for `p<port>-<id>`), e.g. `https://*.previews.example.com` behind a proxy with a wildcard DNS name
and certificate, or `http://*.localhost:8081` (the default of `sandtree serve`: browsers resolve
every `*.localhost` name to loopback themselves). Pure functions: no I/O."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ...errors import InvalidInput

__all__ = ["preview_host", "parse_host", "preview_url", "check_base", "base_domain"]

_LABEL = re.compile(r"^p(\d{1,5})-([0-9a-f]{32})$")


def preview_host(sid: str, port: int, domain: str) -> str:
    return f"p{port}-{sid}.{domain}"


def check_base(base: str) -> str:
    """A preview base (the module doc), or InvalidInput saying what is wrong."""
    parts = urlsplit(base or "")
    if parts.scheme not in ("http", "https") or not (parts.netloc or "").startswith("*.") \
            or parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise InvalidInput(f"a preview base is http(s)://*.DOMAIN[:PORT], not {base!r}", base=base)
    domain = base_domain(base)
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", domain):
        raise InvalidInput(f"the preview base's domain {domain!r} is no DNS name", base=base)
    return base.rstrip("/")


def base_domain(base: str) -> str:
    """The domain under which previews are named (`*.DOMAIN[:PORT]` less `*.` and the port)."""
    netloc = urlsplit(base).netloc
    return netloc[2:].rsplit(":", 1)[0].lower() if ":" in netloc else netloc[2:].lower()


def preview_url(base: str, sid: str, port: int) -> str:
    """The origin of port `port` of sandbox `sid` (its full id) under preview base `base`."""
    return base.replace("*", f"p{port}-{sid}", 1)


def parse_host(host: str, domain: str) -> tuple[str, int] | None:
    """(sandbox id, port) a Host header names under `domain`, or None: not a preview's name."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    label, dot, rest = name.partition(".")
    if not dot or rest != domain:
        return None
    m = _LABEL.match(label)
    if m is None or not 1 <= int(m.group(1)) <= 65535 or m.group(1) != str(int(m.group(1))):
        return None
    return m.group(2), int(m.group(1))
