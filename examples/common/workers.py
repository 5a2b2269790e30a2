"""Keeping an EnvPool's worker processes from hanging the peer that owns them.

moolib's EnvPool forks a server process, which forks the workers that step the envs. Two things
can leave the main process waiting forever in ``EnvStepperFuture.result()``, a C++ call that only
returns when every worker of the batch has stepped and in which no Python signal handler runs:

- a signal sent to the whole process group (Ctrl-C in a terminal, ``kill -TERM -- -PGID``, a
  job scheduler) also reaches the server and the workers, and kills them mid-step;
- a worker dies on its own (the OOM killer, a segfault in an emulator).

``EnvWorkers`` answers both. ``forking()`` keeps SIGINT and SIGTERM away from the processes forked
inside it (shutdown is the main process's job; the workers follow it when it exits), ``create_env``
records each worker's pid, asks the kernel to kill the worker if its parent dies and, given a
``niceness``, lowers the priority of the thread that steps the envs, and
``result(future)`` waits for a step with the worker processes in view, raising ``EnvWorkerDied``
with the worker's pid and how it ended instead of blocking.

    workers = EnvWorkers(env_factory, num_processes)
    with workers.forking():
        envs = moolib.EnvPool(workers.create_env, num_processes=..., ...)
    env_out = workers.result(envs.step(0, action))
"""

import contextlib
import ctypes
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


class EnvWorkerDied(RuntimeError):
    """An EnvPool worker (or the server that forked it) is gone; the message says which and how."""


def describe_wait_status(status):
    """'exited with status 3' or 'was killed by SIGKILL' for a waitpid status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (as the kernel's OOM killer does)" if sig == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended (wait status {status})"


def process_end(pid):
    """None while `pid` runs; else how it ended, as describe_wait_status words.

    A dead worker stays a zombie until its parent (the EnvPool server, which never reaps) exits,
    and /proc shows a zombie's exit status (field 52 of stat, Linux 3.5+) without reaping it.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return "is gone (reaped, exit status unknown)"
    except OSError:  # no /proc (not Linux): cannot tell, so never claim a death
        return None
    state = fields[0]
    if state not in ("Z", "X"):
        return None
    status = int(fields[49]) if len(fields) > 49 else None
    return describe_wait_status(status) if status is not None else "ended"


def _set_parent_death_signal(sig):
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # only a safety net: the workers also leave when their server's pipe closes


class EnvWorkers:
    """Watches the worker processes of one moolib.EnvPool built from `env_factory`."""

    def __init__(self, env_factory, num_processes, poll_interval=0.2, niceness=0):
        self.env_factory = env_factory
        self.poll_interval = poll_interval
        self.niceness = niceness
        # Filled in by the workers themselves (shared memory, inherited through the fork):
        # slot i holds worker i's pid, and parents[i] the EnvPool server that forked it.
        self._pids = multiprocessing.Array("l", num_processes, lock=False)
        self._parents = multiprocessing.Array("l", num_processes, lock=False)
        self._count = multiprocessing.Value("l", 0)
        self._registered_in = None  # the pid of the process this object registered in
        self._requests = None
        self._dead = None
        self._last_check = -math.inf

    @contextlib.contextmanager
    def forking(self):
        """Block SIGINT and SIGTERM while the EnvPool forks: its server and workers inherit the
        blocked mask, so a signal to the process group leaves them running and the main process
        decides when to stop. A signal that arrives meanwhile reaches this process afterwards."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def create_env(self):
        """EnvPool's create_env: runs in a worker process; registers it once, then builds an env."""
        if self._registered_in != os.getpid():
            self._registered_in = os.getpid()
            try:
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_IGN)
            except ValueError:  # not the worker's main thread: the inherited mask still holds
                pass
            # If the server (our parent) dies, so do we: nobody else would ever read our output.
            _set_parent_death_signal(signal.SIGKILL)
            if self.niceness:
                # Linux keeps a niceness per thread: this is the thread that makes and steps
                # this process's envs.
                os.nice(self.niceness)
            with self._count.get_lock():
                slot = self._count.value
                self._count.value += 1
            if slot < len(self._pids):
                self._pids[slot] = os.getpid()
                self._parents[slot] = os.getppid()
        return self.env_factory()

    def worker_pids(self):
        return [pid for pid in self._pids[: min(self._count.value, len(self._pids))] if pid]

    def check(self):
        """Raise EnvWorkerDied if a registered worker, or the server that forked it, has ended."""
        if self._dead is not None:
            raise EnvWorkerDied(self._dead)
        count = min(self._count.value, len(self._pids))
        for server in sorted({p for p in self._parents[:count] if p}):
            how = process_end(server)
            if how is not None:
                self._dead = f"the EnvPool server process (pid {server}) {how}"
                raise EnvWorkerDied(self._dead)
        for index, pid in enumerate(self._pids[:count]):
            how = process_end(pid) if pid else None
            if how is not None:
                self._dead = f"env worker {index} (pid {pid}) {how}"
                raise EnvWorkerDied(self._dead)

    def check_now_and_then(self):
        """check(), every poll_interval at most: reading /proc at every step of every batch took
        ~7% of the main thread on Atari, and a step that does not come is caught by result()'s
        wait."""
        now = time.monotonic()
        if self._dead is not None or now - self._last_check >= self.poll_interval:
            self._last_check = now
            self.check()

    def watch(self, future, on_ready=None):
        """Hand moolib's step `future` to the helper thread now, which waits for it while this
        thread goes on, and calls `on_ready()` when its result is in; returns a WatchedStep,
        whose `ready` tells without waiting, for result()."""
        if self._requests is None:
            self._requests = queue.SimpleQueue()
            threading.Thread(target=self._wait_loop, name="env-results", daemon=True).start()
        watched = WatchedStep(on_ready)
        self._requests.put((future, watched))
        return watched

    def result(self, step):
        """The result of `step` (a WatchedStep from watch(), or moolib's step future itself),
        without ever blocking on a dead worker.

        moolib's step future has no done() and its result() blocks in C++ for up to 30 minutes,
        so a helper thread waits on it while this one checks the workers every poll_interval
        seconds. Python signal handlers run meanwhile (this thread waits in Python).
        """
        self.check_now_and_then()
        if not isinstance(step, WatchedStep):
            step = self.watch(step)
        while not step.ready.wait(self.poll_interval):
            self.check()
        if step.error is not None:
            raise step.error
        return step.value

    def _wait_loop(self):
        while True:
            future, watched = self._requests.get()
            try:
                watched.value = future.result()
            except Exception as e:  # handed to the waiting thread
                watched.error = e
            watched.ready.set()
            if watched.on_ready is not None:
                watched.on_ready()


class WatchedStep:
    """An env step that the helper thread of EnvWorkers waits for: its result or error, an
    Event set when either is in, and what to call then."""

    def __init__(self, on_ready=None):
        self.value, self.error, self.on_ready = None, None, on_ready
        self.ready = threading.Event()


def exit_now(code):
    """Exit at once, skipping interpreter teardown. After EnvWorkerDied a helper thread is still
    inside moolib's result() on the dead worker's shared memory, which a normal exit would free
    under it; os._exit is the one way out that cannot crash or wait there."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
