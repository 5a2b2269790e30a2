#!/usr/bin/env python
"""Compile MinAtar's sparse torso op (examples/vtrace/csrc/minatar_torso.cpp) for the torch of
this interpreter, unless it is already built for this source and torch; `make install` runs it.

    python scripts/build_minatar_torso.py
"""

import sys
import time

from examples.vtrace import minatar_torso


def main() -> int:
    path = minatar_torso.library_path()
    if path.exists():
        print(f"MinAtar torso op: {path} (built before)")
        return 0
    print(f"MinAtar torso op: compiling into {path.parent} ...", flush=True)
    start = time.monotonic()
    try:
        minatar_torso.build()
    except Exception as error:  # the compiler's own output is above
        print(f"error: the MinAtar torso op did not compile: {error}", file=sys.stderr)
        return 1
    print(f"MinAtar torso op: built in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
