"""How a row of the operation table shows on the `sandtree` command line, when not as the row is: `Cli`, declared
beside the row (`@via("cli", Cli(...))` above its @op). Without one a row is the verb of its own name (`_` -> `-`),
its parameters without a default are positionals, the others flags (--name-of-it), its answer printed as JSON (with
--json) or plainly; cli/derive.py makes the parser and the handler from that. Imports only the standard library
(the table is loaded by the remote client: no argparse here)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Cli"]


@dataclass(frozen=True)
class Cli:
    """A row's verb on the command line.

    verb: its words when not the row's name ("image rm", "branch create").
    args: the parameters taken as positionals, in order (default: those without a default). A name may end in
        "?" (optional: the row's default when absent) or "+" (one or more: the operation is called once per value,
        unless the parameter is itself a list).
    dest: parameter -> the argument's name on the command line when it differs ("sid" -> "sandbox"); a flag's
        spelling follows it (--on-idle for idle_action -> "on_idle").
    short: parameter -> its short flag ("-i").
    choices: parameter -> the values the flag takes (argparse checks them before the engine does).
    defaults: parameter -> the command line's own default where it is deliberately not the row's (a display
        choice: `sandtree audit` shows 50 lines); the conformance test holds every other flag to the row's.
    resolve: parameters that name images beyond the row's images= (rollback's `to`, a bundle's images): resolved
        to full IDs before the call, as the row's images are.
    omit: parameters the verb does not offer (in-process objects, or a second spelling of one it has).
    show: the printer (cli/printers.py) when the plain answer does not read well.
    handler: the verb is written by hand in cli/ ("module.function"): it is more than this one operation (`port`
        exposes, lists and signs; `shell` starts, attaches and stops). The maker builds nothing for it; the
        conformance test checks that `verb` exists and runs this function.
    help: the verb's one-line help when the row's first docstring line does not fit.
    """
    verb: str | None = None
    args: tuple[str, ...] | None = None
    dest: dict = field(default_factory=dict)
    short: dict = field(default_factory=dict)
    choices: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    resolve: tuple[str, ...] = ()
    omit: tuple[str, ...] = ()
    show: str | None = None
    handler: str | None = None
    help: str | None = None
