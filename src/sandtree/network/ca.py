"""A link's own certificate authority: what lets the egress daemon terminate a sandbox's TLS to a
host a secret is for (intercept.py), so that it can put the real value into the request.

One CA per link, made when the link has secrets, never written to disk: its key lives in the
daemon's memory only; the sandbox trusts its certificate (trust.py bundles it into the run's trust
store). EC P-256, valid from 5 minutes ago (clock skew) for `days` (1..30, default 30: a live
sandbox may live that long; a new link gets a new CA).

Name constraints (critical, RFC 5280): when the CA is made for a known set of hosts, it may sign
only for those names (a `*.example.org` host permits `example.org` and its subdomains: DNS name
constraints cannot say "subdomains only" in a way every verifier reads) and for no IP address.
So a leaked CA key lets its holder impersonate, to that one sandbox, only the hosts the sandbox's
own secrets are for -- which the daemon already does -- not the rest of the internet.

Leaf certificates are made on demand per host name (one EC key per CA, shared by its leaves:
key generation is the costly part) and cached with their SSLContext; a leaf is valid as long as
its CA. The private keys reach OpenSSL through a memfd (load_cert_chain takes only a path), never
a file on disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from collections import OrderedDict

from ..errors import InvalidInput
from .policy import Rule

__all__ = ["CA", "placeholder", "constraints", "MAX_DAYS", "CACHE"]

MAX_DAYS = 30
CACHE = 256                    # leaf contexts kept per CA (a link talks to few hosts a secret is for)
_SKEW = datetime.timedelta(minutes=5)


def _load() -> None:
    """cryptography's modules (and ssl, for a CA's server contexts), as this module's names, on the first CA:
    every engine (each `sandtree run`) loads this module, and importing them costs a good part of a run's
    start-up; only secrets and TLS links use them."""
    global x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID, ssl
    # not at the top: ~50 ms of every engine's start
    import cryptography.hazmat.primitives.asymmetric.ec, cryptography.hazmat.primitives.serialization, \
        cryptography.x509.oid, ssl
    x509, ec = cryptography.x509, cryptography.hazmat.primitives.asymmetric.ec
    hashes, serialization = cryptography.hazmat.primitives.hashes, cryptography.hazmat.primitives.serialization
    ExtendedKeyUsageOID, NameOID = x509.oid.ExtendedKeyUsageOID, x509.oid.NameOID


def placeholder(name: str) -> str:
    """What the sandbox sees instead of secret `name`'s value: recognisable (it names the secret)
    and unguessable (128 random bits), made only of characters that need no quoting in a URL, a
    header, JSON or a shell."""
    return f"sandtree-secret-{name}-{secrets.token_hex(16)}"


def _host(name: str) -> str:
    """`name` as a plain host name (lower case, no root dot), or InvalidInput."""
    try:
        rule = Rule.parse(name)
    except InvalidInput:
        rule = None
    if rule is None or rule.kind != "name" or rule.ports:
        raise InvalidInput(f"not a host name: {name!r}")
    return rule.target


class CA:
    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        _load()
        self._key = key
        self._cert = cert
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    @classmethod
    def new(cls, label: str, hosts=None, days: int = MAX_DAYS) -> "CA":
        """A fresh CA named after `label` (the link's key). `hosts`: the secrets' host rules
        ("api.example.org", "*.example.org"); given, the CA is constrained to them."""
        if not 1 <= days <= MAX_DAYS:
            raise InvalidInput(f"CA validity must be 1..{MAX_DAYS} days, not {days}")
        _load()
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandtree"),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"sandtree link CA {label}"[:64])])
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - _SKEW).not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                                key_encipherment=False, data_encipherment=False,
                                                key_agreement=False, key_cert_sign=True, crl_sign=True,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
        if hosts is not None:
            builder = builder.add_extension(constraints(hosts), critical=True)
        return cls(key, builder.sign(key, hashes.SHA256()))

    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def certificate(self) -> x509.Certificate:
        return self._cert

    def leaf(self, hostname: str) -> x509.Certificate:
        """A server certificate for `hostname` signed by this CA."""
        host = _host(hostname)
        now = datetime.datetime.now(datetime.timezone.utc)
        ski = self._cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(self._cert.subject).public_key(self._leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - _SKEW).not_valid_after(self._cert.not_valid_after_utc)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=False, crl_sign=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                               critical=False)
                .sign(self._key, hashes.SHA256()))

    def server_context(self, hostname: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for `hostname` (made once, then cached); ALPN
        offers http/1.1 only (the interceptor speaks HTTP/1.x)."""
        host = _host(hostname)
        ctx = self._contexts.get(host)
        if ctx is not None:
            self._contexts.move_to_end(host)
            return ctx
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        chain = self.leaf(host).public_bytes(serialization.Encoding.PEM) + self.pem()
        key = self._leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        fd = os.memfd_create("sandtree-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain + key)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        self._contexts[host] = ctx
        while len(self._contexts) > CACHE:
            self._contexts.popitem(last=False)
        return ctx


def constraints(hosts) -> x509.NameConstraints:
    """Name constraints permitting the DNS names of `hosts` (host rules) and no IP address."""
    _load()
    permitted = []
    for h in hosts:
        base = h[2:] if isinstance(h, str) and h.startswith("*.") else h
        name = _host(base)
        if name not in permitted:
            permitted.append(name)
    if not permitted:
        raise InvalidInput("a constrained CA needs at least one host")
    excluded = [x509.IPAddress(ipaddress.ip_network(n)) for n in ("0.0.0.0/0", "::/0")]
    return x509.NameConstraints(permitted_subtrees=[x509.DNSName(n) for n in permitted],
                                excluded_subtrees=excluded)
