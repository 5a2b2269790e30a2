"""The V-trace (IMPALA) experiment: python -m examples.vtrace.experiment ..."""

import os

# With torch_threads > 1, OpenMP's idle threads would spin between operations on the cores the
# env processes need; asleep, two learner threads gave the Pong agent 8-11% more steps/s on a
# learner-bound 2-core machine (docs/atari.md). OpenMP reads it once, when torch loads it; a
# value the user set stays.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
