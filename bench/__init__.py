"""Throughput, learning and memory benchmarks for the examples: `python -m bench` (see
__main__.py). One module per part: machine.py (the machine and its arithmetic peak), limits.py
(the V-trace env, learner and acting limits), agent.py (V-trace peers: speed, memory, scaling),
a2c.py (a2c.py against Stable-Baselines3), report.py (table and results.json), and processes.py
(child processes that are always stopped, shared with the tests). The GPU check:
gpu_wheels.sh (here, with network), then gpu_check.sh (on the GPU machine), which runs
gpu_run.py."""
