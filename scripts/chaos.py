#!/usr/bin/env python3
"""The chaos run: `ampp train` under `ampp run --max-restarts` while faults hit it, compared with the
same run undisturbed.

Faults: this driver SIGKILLs a random worker about every --kill-every steps; inf losses are injected
at random steps and ranks (AMPP_TRAIN_TEST_INF_AT, in both runs: they are part of the run); rank 0
dies halfway through writing one checkpoint (AMPP_TRAIN_TEST_KILL_IN_SAVE). It then checks that
  - both runs exit 0 and their model.pt files are byte-identical,
  - skipped steps == injected overflows (a fp16 run with a static loss scale that never overflows
    on its own, so every skipped step is an injected one),
  - the output names every fault: each kill (rank, pid, last step), each injection (rank, step),
    the killed save,
  - no temporary checkpoint file is left behind.
Prints the numbers and exits 1 on any failed check.

  python3 scripts/chaos.py --ampp build/bin/ampp-faults                 # full: 1200 steps, ~11 kills
  python3 scripts/chaos.py --ampp build/bin/ampp-faults --short         # CI: 300 steps, 2 kills
"""
import argparse
import json
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

BATCH = 32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ampp", required=True, help="the test binary with fault hooks: build/bin/ampp-faults")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--kill-every", type=int, default=100, help="about this many steps between kills")
    p.add_argument("--infs", type=int, default=12, help="injected inf losses")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--short", action="store_true", help="300 steps, 3 injections (CI)")
    p.add_argument("--keep", help="keep the runs' folders here instead of a temporary folder")
    a = p.parse_args()
    if a.short:
        a.steps, a.infs = 300, 3
    return a


def train_command(ampp, folder, steps, max_restarts):
    images = 100 * BATCH  # 100 steps per epoch
    return [ampp, "run", "--nproc-per-node", "2", "--max-restarts", str(max_restarts), "--stall-timeout", "60",
            "--", ampp, "train", "--data", f"synthetic:{images}", "--model", "cnn", "--batch-size", str(BATCH),
            "--epochs", str((steps + 99) // 100), "--steps", str(steps), "--opt-level", "O1", "--dtype", "fp16",
            "--loss-scale", "128", "--threads", "1", "--deterministic", "--log-every", "1", "--no-plots",
            "--checkpoint-every", "25", "--checkpoint-dir", str(folder / "ckpt"), "--out", str(folder / "out")]


def workers_of(launcher_pid):
    """{rank: pid} of the launcher's children (RANK from their environment)."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid != launcher_pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
            rank = [int(e[5:]) for e in env if e.startswith(b"RANK=")]
            if rank:
                found[rank[0]] = int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return found


def last_step(metrics):
    """The step of the last complete step record in metrics.jsonl (0 before the first)."""
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        if '"type":"step"' in line:
            try:
                return json.loads(line)["step"]
            except ValueError:
                continue
    return 0


def run(command, env, output_file, kill_points=(), rng=None):
    """Runs the launcher; SIGKILLs a random worker whenever the run passes the next kill point."""
    kills = []
    with open(output_file, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        metrics = pathlib.Path(command[command.index("--out") + 1]) / "metrics.jsonl"
        pending = list(kill_points)
        while proc.poll() is None:
            time.sleep(0.02)
            if pending and last_step(metrics) >= pending[0]:
                workers = workers_of(proc.pid)
                if len(workers) < 2:
                    continue  # between attempts
                rank = rng.choice(sorted(workers))
                try:
                    os.kill(workers[rank], signal.SIGKILL)
                except ProcessLookupError:
                    continue
                kills.append({"rank": rank, "pid": workers[rank], "step": last_step(metrics)})
                print(f"chaos: SIGKILL rank {rank} (pid {workers[rank]}) at about step {kills[-1]['step']}",
                      flush=True)
                pending.pop(0)
    return proc.returncode, kills


def check(failures, ok, message):
    print(("ok:   " if ok else "FAIL: ") + message, flush=True)
    if not ok:
        failures.append(message)


def records(folder, kind):
    lines = (folder / "out" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if f'"type":"{kind}"' in line]


def verify(a, ref, chaos, kills, infs, save_kill_step):
    failures = []
    ref_out, chaos_out = (ref / "output.txt").read_text(), (chaos / "output.txt").read_text()
    same = (ref / "out" / "model.pt").read_bytes() == (chaos / "out" / "model.pt").read_bytes()
    check(failures, same, "model.pt of the chaos run is byte-identical to the undisturbed run's")
    for name, folder in (("undisturbed", ref), ("chaos", chaos)):
        summary = records(folder, "summary")[-1]
        check(failures, summary["steps"] == a.steps and summary["skipped_steps"] == len(infs),
              f"{name}: {summary['steps']} steps, {summary['skipped_steps']} skipped == {len(infs)} injected")
    last = {r["step"]: r for r in records(chaos, "step")}
    for step, rank in infs:
        named = f"test fault: rank {rank}: inf loss injected at step {step}" in chaos_out
        check(failures, named and last[step]["skipped"], f"inf at step {step} on rank {rank}: named, step skipped")
    for k in kills:
        pattern = (rf"worker rank {k['rank']} \(local rank {k['rank']}, pid {k['pid']}\) failed with signal SIGKILL "
                   rf"\(last reported step \d+\)")
        check(failures, re.search(pattern, chaos_out) is not None,
              f"kill of rank {k['rank']} (pid {k['pid']}, about step {k['step']}) named by the launcher")
    named = (f"rank 0 killed halfway through the checkpoint of step {save_kill_step}" in chaos_out and
             re.search(rf"worker rank 0 \(local rank 0, pid \d+\) failed with signal SIGKILL \(last reported step "
                       rf"{save_kill_step}\)", chaos_out) is not None)
    check(failures, named, f"the checkpoint killed halfway (step {save_kill_step}) named by ampp train and the launcher")
    leftovers = [p.name for p in (chaos / "ckpt").iterdir() if ".tmp." in p.name]
    check(failures, not leftovers, f"no temporary checkpoint file left ({leftovers})")
    restarts = chaos_out.count("restarting the worker group")
    check(failures, restarts == len(kills) + 1, f"{restarts} restarts == {len(kills)} kills + 1 killed save")
    return failures


def main():
    a = parse_args()
    rng = random.Random(a.seed)
    infs = sorted((s, rng.randrange(2)) for s in rng.sample(range(2, a.steps + 1), a.infs))
    kill_points = [p + rng.randrange(-20, 21) for p in range(150, a.steps - 30, a.kill_every)]
    if a.short:
        kill_points = kill_points[:2]
    save_kill = 2  # rank 0's 2nd checkpoint (step 50) dies halfway, before the first driver kill
    root = pathlib.Path(a.keep or tempfile.mkdtemp(prefix="ampp-chaos-"))
    env = dict(os.environ, AMPP_TRAIN_TEST_INF_AT=",".join(f"{s}:{r}" for s, r in infs))
    print(f"chaos: {a.steps} steps, {len(infs)} inf injections, kills near steps {kill_points}, "
          f"save {save_kill} killed; folders in {root}", flush=True)
    timings = {}
    for name in ("undisturbed", "chaos"):
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        run_env = dict(env, AMPP_TRAIN_TEST_KILL_IN_SAVE=str(save_kill)) if name == "chaos" else env
        points = kill_points if name == "chaos" else ()
        start = time.monotonic()
        code, kills = run(train_command(a.ampp, folder, a.steps, len(points) + 3), run_env, folder / "output.txt",
                          points, rng)
        timings[name] = time.monotonic() - start
        if code != 0:
            print((folder / "output.txt").read_text()[-4000:])
            print(f"FAIL: the {name} run exited {code}")
            return 1
    failures = verify(a, root / "undisturbed", root / "chaos", kills, infs, save_kill * 25)
    print(f"chaos: {len(kills)} kills + 1 killed save, {len(infs)} injected overflows; wall time "
          f"{timings['chaos']:.1f} s vs {timings['undisturbed']:.1f} s undisturbed; "
          f"{'PASSED' if not failures else f'{len(failures)} check(s) FAILED'}")
    if not a.keep and not failures:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
