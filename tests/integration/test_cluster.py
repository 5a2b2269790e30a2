"""Many peers as one job through Hydra's submitit launcher: two CartPole peers started by
submitit's local executor train together; a peer that gets the preemption signal stops cleanly,
is requeued by submitit and resumes from the checkpoint; and the sbatch script of a Slurm array
job, as submitit writes it for `-m hydra/launcher=slurm peer='range(8)'`, checked without Slurm.
"""

import os
import signal
import subprocess
import sys

import psutil
import pytest
import torch
from helpers import CARTPOLE, experiment, read_rows, wait_until
from submitit.core.utils import DelayedSubmission


def sweep(broker, savedir, *overrides):
    """experiment()'s command line with -m, which Hydra takes only before the overrides."""
    args = experiment(broker, savedir, *overrides)
    return args[:3] + ["-m"] + args[3:]


def job_logs(savedir):
    """The output of every peer that submitit started, one text per log file."""
    # Under savedir/submitit (hydra/launcher=local|slurm) or savedir/hydra/.submitit (the
    # plugin's submitit_local): <job>_<task>_log.out, and .err without stderr_to_stdout.
    return {p: p.read_text(errors="replace") for p in sorted(savedir.rglob("*_log.*"))}


def all_output(savedir):
    return "\n".join(f"--- {p}\n{text}" for p, text in job_logs(savedir).items())


def peer_processes(launcher):
    """The processes that submitit runs the peers in (not its controllers, not EnvPool workers)."""
    try:
        below = psutil.Process(launcher.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = []
    for proc in below:
        try:
            # EnvPool workers are forks of the peer, with its command line: not the peer.
            if "submitit.local._local" in " ".join(proc.parent().cmdline()):
                found.append(proc)
        except (psutil.NoSuchProcess, AttributeError):  # gone, or no parent any more
            pass
    return found


@pytest.mark.slow
def test_local_launcher_starts_peers_that_train_together(children, broker, tmp_path):
    savedir = tmp_path / "group"
    # Long enough that the first peer cannot finish alone while submitit still starts the
    # second (60k steps did once in CI: neither log ever showed two peers).
    total = 200_000
    args = sweep(
        broker, savedir, "hydra/launcher=local", "peer=range(2)",
        # Stats are all-reduced once per log interval: short intervals, for a short run.
        *[o for o in CARTPOLE if not o.startswith("log_interval=")], "log_interval=0.5",
        f"total_steps={total}", "tensorboard=true",
    )  # fmt: skip
    launcher = children(args, "launcher", cwd=tmp_path)
    # Returns once submitit has seen both peers finish.
    assert launcher.wait(timeout=480) == 0, launcher.output + all_output(savedir)
    output = all_output(savedir)
    assert "Traceback" not in output and "terminate called" not in output, output
    # Each peer ran as its own submitit job, named after its index, with its own folder.
    assert len(job_logs(savedir)) == 2, output
    assert "Peer peer0 of" in output and "Peer peer1 of" in output, output
    logs = sorted((savedir / "peers").glob("*/logs.tsv"))
    assert [p.parent.name for p in logs] == ["peer0", "peer1"]
    tables = [read_rows(log) for log in logs]
    # The peers trained together: one that started late may find the other near its end.
    assert any(r["peers"] == "2" for rows in tables for r in rows), tables
    for log, rows in zip(logs, tables, strict=True):
        assert int(rows[-1]["env_train_steps"]) >= total - 16 * 5 * 4, rows[-1]
        assert list(log.parent.glob("events.out.tfevents.*")), "tensorboard=true wrote nothing"
    saved = torch.load(savedir / "checkpoint.tar", weights_only=True)
    assert saved["env_train_steps"] >= total - 16 * 5 * 4


@pytest.mark.slow
def test_preempted_peer_checkpoints_is_requeued_and_resumes(children, broker, tmp_path):
    savedir = tmp_path / "preempt"
    # The plugin's own submitit_local, as the command line has it; one peer (the leader).
    args = sweep(
        broker, savedir, "hydra/launcher=submitit_local", "peer=range(1)", *CARTPOLE,
        "total_steps=100000000",
    )  # fmt: skip
    launcher = children(args, "launcher", cwd=tmp_path)
    log = savedir / "peers" / "peer0" / "logs.tsv"
    assert wait_until(lambda: log.exists() and len(read_rows(log)) >= 2, 240), all_output(savedir)
    [first] = peer_processes(launcher)
    # What Slurm does at --signal=USR2@120 (and submitit's local executor before its timeout).
    first.send_signal(signal.SIGUSR2)
    resumed = wait_until(lambda: "Resumed from" in all_output(savedir), 180)
    output = all_output(savedir)
    assert resumed, launcher.output + output
    assert "Checkpoint written" in output and "Handing SIGUSR2 to submitit" in output, output
    assert "Requeued job" in output, output  # submitit's own log line
    assert not first.is_running()
    saved = torch.load(savedir / "checkpoint.tar", weights_only=True)
    line = next(s for s in output.splitlines() if s.startswith("Resumed from"))
    assert f"model version {saved['model_version']}" in line and saved["model_version"] > 0

    # The requeued peer appends to the same logs.tsv; a cancel (SIGTERM) stops it for good.
    def trained_after_resume():
        rows = read_rows(log)
        return rows and int(rows[-1]["model_version"]) > saved["model_version"]

    assert wait_until(trained_after_resume, 120), all_output(savedir)
    [second] = wait_until(lambda: [p for p in peer_processes(launcher) if p.pid != first.pid], 30)
    second.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=120) == 0, launcher.output + all_output(savedir)
    rows = read_rows(log)
    assert int(rows[-1]["model_version"]) > saved["model_version"]
    assert "Traceback" not in all_output(savedir), all_output(savedir)


def fake_slurm(tmp_path):
    """No Slurm here: stand-ins for its commands. sbatch keeps the script that submitit hands to
    it and answers with job id 4242; scontrol writes down how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\ncp "$1" {tmp_path}/sbatch_script.sh\necho "Submitted batch job 4242"\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol_calls\n')
    # submitit checks that srun exists before it submits anything.
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def submit_array(children, tmp_path, savedir, env, count, broker, *overrides):
    """Run the launcher until submitit has handed the array job to sbatch; returns the pickled
    jobs, one per array task, in task order."""
    args = sweep(broker, savedir, "hydra/launcher=slurm", f"peer=range({count})", *overrides)
    launcher = children(args, "launcher", cwd=tmp_path, env=env)
    pickles = lambda: sorted(savedir.glob("submitit/4242_*/4242_*_submitted.pkl"))  # noqa: E731
    # After submitting, the launcher waits for the jobs (and polls the missing sacct): stop it.
    assert wait_until(lambda: len(pickles()) == count, 120), launcher.output
    launcher.stop()
    return pickles()


def test_slurm_array_job_script(children, tmp_path):
    savedir = tmp_path / "atari"
    env = fake_slurm(tmp_path)
    overrides = ["env.name=ALE/Breakout-v5", "hydra.launcher.partition=gpu"]
    pickles = submit_array(children, tmp_path, savedir, env, 8, "10.0.0.5:4431", *overrides)
    script = (tmp_path / "sbatch_script.sh").read_text()
    for line in [
        "#SBATCH --array=0-7%8",  # one array job, eight peers
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --nodes=1",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --cpus-per-task=10",  # num_actor_cpus
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1440",
        "#SBATCH --signal=USR2@120",  # the preemption/time-limit signal, 2 minutes ahead
        "#SBATCH --requeue",
        f"#SBATCH --output={savedir}/submitit/%A_%a/%A_%a_0_log.out",
        "export SUBMITIT_EXECUTOR=slurm",
    ]:
        assert line in script.splitlines(), f"{line!r} not in:\n{script}"
    assert f"-m submitit.core._submit {savedir}/submitit/%j" in script
    assert script.splitlines()[-1].startswith("srun --unbuffered"), script
    # Array task i runs the experiment with peer=i.
    for i, path in enumerate(pickles):
        overrides = DelayedSubmission.load(path).args[0]
        assert f"peer={i}" in overrides and "env.name=ALE/Breakout-v5" in overrides, overrides


def slurm_task(children, savedir, env, task):
    """Array task `task` of job 4242 as srun would start it: the command line of the sbatch
    script, with the variables that Slurm sets for the task."""
    slurm = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": str(4243 + task),
             "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": str(task), "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}  # fmt: skip
    args = [sys.executable, "-u", "-m", "submitit.core._submit", f"{savedir}/submitit/%j"]
    return children(args, f"task{task}", cwd=savedir.parent, env={**env, **slurm})


@pytest.mark.slow
def test_slurm_tasks_train_together_and_requeue_on_preemption(children, broker, tmp_path):
    """The Slurm path without the scheduler: the jobs that submitit pickled for sbatch, run as
    srun would run them; the preemption signal ends in `scontrol requeue <job>`."""
    savedir = tmp_path / "slurm"
    env = fake_slurm(tmp_path)
    overrides = [*[o for o in CARTPOLE if not o.startswith("log_interval=")],
                 "log_interval=0.5", "total_steps=100000000"]  # fmt: skip
    submit_array(children, tmp_path, savedir, env, 2, broker, *overrides)
    tasks = [slurm_task(children, savedir, env, i) for i in range(2)]
    logs = [savedir / "peers" / f"peer{i}" / "logs.tsv" for i in range(2)]
    together = lambda: all(  # noqa: E731
        log.exists() and any(r["peers"] == "2" for r in read_rows(log)) for log in logs
    )
    assert wait_until(together, 240), "\n".join(t.output for t in tasks)
    # Slurm signals every process of the job step, EnvPool workers included (here the job of
    # task 0 alone: the other peer goes on).
    os.killpg(tasks[0].proc.pid, signal.SIGUSR2)
    assert tasks[0].wait(timeout=120) is not None, tasks[0].output
    assert "Handing SIGUSR2 to submitit" in tasks[0].output, tasks[0].output
    calls = (tmp_path / "scontrol_calls").read_text().split("\n")
    assert "requeue 4242_0" in calls, calls
    os.killpg(tasks[1].proc.pid, signal.SIGTERM)  # scancel
    assert tasks[1].wait(timeout=120) == 0, tasks[1].output
    for task in tasks:
        assert "Traceback" not in task.output, task.output
    assert (savedir / "checkpoint.tar").exists()


def test_sweeping_peers_without_a_launcher_is_refused(tmp_path):
    """Hydra's basic launcher would run peer=0 to the end before it starts peer=1."""
    args = sweep("127.0.0.1:1", tmp_path / "s", "peer=range(2)", "env.name=CartPole-v1")
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "hydra/launcher=local" in result.stderr, result.stderr
