#!/usr/bin/env python
"""Compile the CPU ops (examples/vtrace/csrc/*.cpp: MinAtar's sparse torso, the V-trace loss's
gradients) for the torch of this interpreter, unless they are already built for these sources
and this torch; `make install` runs it.

    python scripts/build_ops.py
"""

import sys
import time

from examples.vtrace import ops


def main() -> int:
    path = ops.library_path()
    if path.exists():
        print(f"Compiled ops: {path} (built before)")
        return 0
    print(f"Compiled ops: compiling into {path.parent} ...", flush=True)
    start = time.monotonic()
    try:
        ops.build()
    except Exception as error:  # the compiler's own output is above
        print(f"error: the compiled ops did not compile: {error}", file=sys.stderr)
        return 1
    print(f"Compiled ops: built in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
