"""E2B's protocols, so E2B's own SDKs (`e2b`, `e2b-code-interpreter`) work unmodified against
`sandtree serve` with only their URL and key set:

    E2B_API_URL=http://HOST:PORT/e2b            the control plane (control.py): sandboxes, templates,
                                                snapshots, volumes, secrets, as E2B's REST API has them
    E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox
                                                requests to one sandbox: E2B's clients name it in the
                                                E2b-Sandbox-Id and E2b-Sandbox-Port headers
    E2B_API_KEY=<a sandtree token>              (none needed on a loopback server without tokens)

A request to a sandbox is also recognised by its host name, `<port>-<sandbox id>.<domain>`, as E2B's
own cloud addresses them (behind a TLS front that keeps the Host). dispatch.py sends either to the
app serving that port: envd, E2B's in-sandbox API (envd/: Connect-RPC process and filesystem
services, /files, /health) on 49983, the code interpreter (interpreter.py) on 49999.

An adapter like the rest of http/: every call goes to the engine as the caller's tenant sees it,
and E2B's capabilities that sandtree lacked are rows of the operation table, on every surface.
"""


from . import envd, interpreter  # noqa: F401,E402 - they register their ports with dispatch.py as they load
from .control import control_router as e2b_router  # noqa: E402 - the control plane's routes

__all__ = ["e2b_router"]
