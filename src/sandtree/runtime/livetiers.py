"""The engine's live sandboxes over every tier that has them (namespaces: live.py, gvisor:
gvisor_live.py), behind the one LiveTier interface: a start names its tier, and every other call
goes to the tier that started the handle (LiveHandle.tier, stored with it). So sandboxes, pools,
ports and live runs hold one LiveTier and never ask which tier runs a sandbox.

A command's process (popen) belongs to its sandbox's tier: callers that keep one take that tier
with of(handle) (engine/processes/popen.py signals and reads its exit through it).
"""

from __future__ import annotations

from typing import Callable

from .base import LiveTier, RunSpec
from .liveproc import LiveHandle

__all__ = ["LiveTiers"]


class LiveTiers(LiveTier):
    def __init__(self, tier: Callable[[str], LiveTier], default: Callable[[], str]):
        """tier(name): that tier's LiveTier (RuntimeUnavailable if this host has none);
        default(): the tier of a start that names none (the engine's default, now)."""
        self._make, self._default = tier, default
        self._tiers: dict[str, LiveTier] = {}

    def _tier(self, name: str) -> LiveTier:
        got = self._tiers.get(name)
        if got is None:
            got = self._tiers[name] = self._make(name)
        return got

    def of(self, h: LiveHandle) -> LiveTier:
        return self._tier(h.tier)

    def named(self, tier: str | None) -> LiveTier:
        return self._tier(tier or self._default())

    def available(self, tier: str | None = None) -> tuple[bool, str]:
        return self.named(tier).available()

    def hibernate_available(self, tier: str | None = None, link: bool = False) -> tuple[bool, str]:
        return self.named(tier).hibernate_available(link)

    def handle(self, stored: dict) -> LiveHandle:
        return LiveHandle.from_dict(stored)

    def start(self, spec: RunSpec, lifetime: float, *, detach: bool = True, restore: str | None = None,
              tier: str | None = None) -> LiveHandle:
        return self.named(tier).start(spec, lifetime, detach=detach, restore=restore)

    # every call on a sandbox: its own tier's
    def stop(self, h, wait: float = 5.0, *, idle: bool = False) -> None:
        self.of(h).stop(h, wait, idle=idle)

    def retime(self, h, deadline: float) -> None:
        self.of(h).retime(h, deadline)

    def alive(self, h) -> bool:
        return self.of(h).alive(h)

    def foreign(self, h) -> bool:
        return self.of(h).foreign(h)

    def exec(self, h, spec: RunSpec, ahead=None):
        return self.of(h).exec(h, spec, ahead=ahead)

    def popen(self, h, spec: RunSpec, *, stdin=None, stdout=None, stderr=None, pty: bool = False, ahead=None):
        return self.of(h).popen(h, spec, stdin=stdin, stdout=stdout, stderr=stderr, pty=pty, ahead=ahead)

    def enter_ahead(self, h, relay: tuple[int, int] | None = None):
        return self.of(h).enter_ahead(h, relay=relay)

    def hold_program(self, h) -> tuple[str | None, str | None, bool]:
        return self.of(h).hold_program(h)

    def scratch(self, h) -> int:
        return self.of(h).scratch(h)

    def root(self, h) -> int:
        return self.of(h).root(h)

    def own_mounts(self, h) -> set[int]:
        return self.of(h).own_mounts(h)

    def freeze(self, h, frozen: bool = True, *, checkpoint: bool = False) -> bool:
        return self.of(h).freeze(h, frozen, checkpoint=checkpoint)

    def frozen(self, h) -> bool:
        return self.of(h).frozen(h)

    def memory(self, h) -> int | None:
        return self.of(h).memory(h)

    def stats(self, h) -> dict | None:
        return self.of(h).stats(h)

    def usage(self, h) -> dict | None:
        return self.of(h).usage(h)

    def lingering(self, h) -> bool:
        return self.of(h).lingering(h)

    def processes(self, h) -> list[dict]:
        return self.of(h).processes(h)

    def outsiders(self, h) -> list[int]:
        return self.of(h).outsiders(h)

    def end_spawners(self, h) -> int:
        return self.of(h).end_spawners(h)

    def dump_finished(self, h, images: str) -> bool:
        return self.of(h).dump_finished(h, images)

    def dump(self, h, images: str, ghost_limit: int, link: bool = False, leave_running: bool = False,
             meanwhile=None):
        return self.of(h).dump(h, images, ghost_limit, link=link, leave_running=leave_running, meanwhile=meanwhile)

    # a command's process, not a sandbox: callers holding one use of(handle) (module doc)
    def returncode(self, report: bytes, fallback: int | None) -> int | None:
        return self._tier("namespaces").returncode(report, fallback)

    def signal_command(self, proc, sig: int) -> None:
        self._tier("namespaces").signal_command(proc, sig)
