"""Tenancy: one engine, many tenants, each seeing only its own things.

A token is `stk_<id>_<secret>`: the id is public (list, revoke, audit), the secret random and
shown once; the store keeps sha256(secret) only (a 256-bit random secret needs no slow hash).
A token belongs to a tenant and carries scopes: import, run, list, cancel, tag (and admin: the
whole store, unfiltered, still audited).

`Tenancy.view(tenant)` (= `Engine.as_tenant`) is the engine's facade as that tenant sees it, so
every adapter (REST, MCP over --url, the Contree API, an in-process caller) gets the same rules.
The views are made from the operation table (derive.py): scope, visibility and audit come from
each operation's row; view.py writes by hand only the rules the table cannot say.

* Images are content-addressed and stored once; visibility is per tenant: an image is visible if
  the tenant imported/merged/pulled it (tenant_images), if one of its own operations produced it
  (tenant_ops joined with operations, so a queued run's result needs no hook when it finishes),
  or if it is public (public_images; `share`/`unshare` by an owner, or the admin CLI).
* Anything else answers exactly as a nonexistent thing would (same error class, same message):
  prefix resolution, lineage (branching/lineage's queries through the tenant's filter),
  operations, events, uploads and file sets never reveal it.
* Tags and branches are namespaced: stored as `<tenant>~<name>`; `~` is valid in neither a tag
  nor a branch name, so a tenant's refs never collide with global ones or another tenant's.
  Global tags (made by an operator) resolve for a tenant only when their image is public.
* Limits per tenant: concurrent runs (refused past the limit, LimitExceeded), max timeout and
  max output (a run asking for more is refused; a run asking nothing gets the cap).
* Every call that changes something is appended to the audit table with tenant and token id;
  a run's result and outcome are read from its operation row when the audit is queried.

Modules: tenant.py (a tenant, scopes, what it may see in SQL), tenancy.py (tokens, limits,
sharing, the audit log), sight.py (the tenant's side of each rule), limits.py, derive.py (the
methods from the table), auditing.py, view.py, operations.py, admin.py. The HTTP side (a bearer
token -> its view) is http/gate.py.
"""

from .admin import AdminOperations, AdminView
from .operations import TenantOperations
from .tenancy import Tenancy
from .tenant import ALL_SCOPES, OPERATOR, SCOPES, Tenant, check_public_registry, check_tenant_name, parse_scopes
from .view import TenantView

__all__ = ["Tenancy", "Tenant", "TenantView", "TenantOperations", "AdminView", "AdminOperations", "OPERATOR",
           "SCOPES", "ALL_SCOPES", "check_public_registry", "check_tenant_name", "parse_scopes"]
