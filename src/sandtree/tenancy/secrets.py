"""Stored secrets as each caller sees them (the store itself: network/secretstore.py).

* The operator (the in-process engine, the CLI on the server, an admin token) manages the global
  namespace, and any tenant's with `tenant=`; a global secret is usable by the tenants it lists
  (`tenants`, "*": all), never readable by them.
* A tenant manages and lists only its own namespace (`tenant=` another's is Forbidden), and its
  listing adds the global secrets shared with it (names and hosts).
* No answer, audit row or error holds a value: set/remove are audited by name and namespace.

Use by name: a run's `secrets=` entry {"stored": REF} (or a bare name in a list) is looked up
when the engine parses it (`Tenancy.stored_secret`, given to engine/runs/network.py). The tenant view
qualifies a tenant's references first (`qualify`: `<tenant>~<REF>`, as tags and branches are
stored); the lookup then tries that tenant's own secret, then a global one shared with it. An
unqualified reference is the operator's: the global namespace. A name the caller may not use
answers exactly as one that does not exist.
"""

from __future__ import annotations

from ..errors import Forbidden, InvalidInput, NotFound
from ..network.secretstore import EVERY_TENANT, StoredSecret
from ..network.trust import stored_ref
from .tenant import OPERATOR, SEP, Tenant, check_tenant_name

__all__ = ["namespace", "set_secret", "list_secrets", "remove_secret", "lookup", "qualify"]


def namespace(by: Tenant | None, tenant: str | None) -> str | None:
    """The namespace a call manages: the operator's `tenant` (None: global), a tenant's own."""
    if by is None or by.admin:
        return None if tenant is None else check_tenant_name(tenant)
    if tenant not in (None, by.name):
        raise Forbidden("a tenant manages only its own secrets", scope="admin")
    return by.name


def set_secret(tenancy, name: str, value: str, hosts, tenants, tenant: str | None, by: Tenant | None) -> dict:
    owner = namespace(by, tenant)
    shared = _tenants(tenants, owner, by)
    info = tenancy.engine.secret_store.set(owner, name, value, hosts, shared).info()
    tenancy.record(by or OPERATOR, "secret set", detail={"secret": name, "namespace": owner or "global"})
    return info


def list_secrets(tenancy, tenant: str | None, by: Tenant | None) -> list[dict]:
    store = tenancy.engine.secret_store
    owner = namespace(by, tenant)
    out = [s.info() for s in store.list(owner)]
    if owner is not None and by is not None and not by.admin:      # a tenant: what the operator shares too
        own = {s["name"] for s in out}
        out += [{**s.info(), "shared": True} for s in store.list(None) if s.usable_by(owner) and s.name not in own]
        for s in out:
            s.pop("tenants", None)                 # who else may use a global one is not the tenant's to see
    return out


def remove_secret(tenancy, name: str, tenant: str | None, by: Tenant | None) -> None:
    owner = namespace(by, tenant)
    if not isinstance(name, str):
        raise InvalidInput("a secret's name must be a string")
    tenancy.engine.secret_store.remove(owner, name)
    tenancy.record(by or OPERATOR, "secret remove", detail={"secret": name, "namespace": owner or "global"})


def lookup(store, ref) -> StoredSecret:
    """The stored secret a (qualified) reference names; NotFound, alike for absent and hidden."""
    if not isinstance(ref, str) or not ref:
        raise InvalidInput("a stored secret is named by a non-empty string")
    owner, sep, name = ref.partition(SEP)
    if not sep:
        owner, name = None, ref
    found = store.get(owner, name) if owner is None or _safe(owner) else None
    if found is None and owner is not None:
        shared = store.get(None, name)
        found = shared if shared is not None and shared.usable_by(owner) else None
    if found is None:
        raise NotFound(f"no stored secret {name!r}", secret=name)
    return found


def qualify(tenant: str, secrets):
    """A tenant's `secrets=` with every stored reference in its namespace (`<tenant>~<REF>`);
    entries with a value pass unchanged (the engine checks their shape). A reference with the
    separator in it names nothing the tenant may use."""
    if isinstance(secrets, (list, tuple)):
        secrets = {n: {"stored": True} for n in secrets} if all(isinstance(n, str) for n in secrets) else secrets
    if not isinstance(secrets, dict):
        return secrets                                      # not a shape: the engine refuses it
    out = {}
    for name, spec in secrets.items():
        ref = stored_ref(name, spec) if isinstance(name, str) else None
        if isinstance(ref, str) and ref:
            if SEP in ref:
                raise NotFound(f"no stored secret {ref!r}", secret=ref)
            spec = {**spec, "stored": f"{tenant}{SEP}{ref}"}
        out[name] = spec
    return out


def _tenants(tenants, owner: str | None, by: Tenant | None) -> tuple[str, ...]:
    if tenants is None:
        return ()
    if isinstance(tenants, str):
        tenants = [t for t in tenants.split(",") if t.strip()]
    if not isinstance(tenants, (list, tuple)):
        raise InvalidInput("tenants must list tenant names (or '*': every tenant)")
    if tenants and (owner is not None or (by is not None and not by.admin)):
        raise Forbidden("only the operator's (global) secrets are shared with tenants", scope="admin")
    if not all(isinstance(t, str) for t in tenants):
        raise InvalidInput("tenants must list tenant names (or '*': every tenant)")
    return tuple(t.strip() if t.strip() == EVERY_TENANT else check_tenant_name(t.strip()) for t in tenants)


def _safe(owner: str) -> bool:
    try:
        check_tenant_name(owner)
        return True
    except InvalidInput:
        return False
