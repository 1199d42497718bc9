"""A benchmark's scratch directory, removed only when nothing is mounted under it: never delete through a
mount (PLATFORM.md's DANGER; sandboxes mount only in their own namespaces, so one left here is a bug to see)."""

import shutil
import sys


def remove_unless_mounted(work: str) -> None:
    with open("/proc/self/mountinfo") as f:
        if any(work in line for line in f):
            print(f"a mount is left under {work}: not deleting it", file=sys.stderr)
            return
    shutil.rmtree(work, ignore_errors=True)
