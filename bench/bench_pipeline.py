"""Benchmark the Snakemake pipeline against the same commands run by a plain shell script.

    .venv/bin/python bench/bench_pipeline.py [--reps=3] [--noop-reps=3] [--noop-steps=100]
                                             [--skip-noop] [--keep]

A: ``snakemake --cores 2`` on the embedded default config (config/config.yaml), from scratch, in a
   fresh temporary copy of the workflow (Snakefile, workflow/, config/, envs/), run with that copy
   as the working directory. The default target ``all`` is built: dataset -> validate -> train ->
   one convert per checkpoint -> the report figures (plot_training) and table (checkpoint_table).
B: the same commands the rules run, generated from the same config values into one sequential
   bash script (``run_pipeline.sh``) run in another fresh temporary copy: ``lerobot-pipe
   make-dataset``; ``lerobot-pipe resume-args`` + ``lerobot-pipe validate``; ``lerobot-pipe
   resume-args`` + ``torchrun --standalone ... lerobot-train`` (what the train rule's
   ``lerobot-pipe launch-train`` starts, without its checks and watchdog); one
   ``lerobot-convert-dcp`` per complete checkpoint; the two report scripts, each run by
   ``python`` with a stand-in for the ``snakemake`` object that Snakemake's ``script:``
   directive injects. The report is in both sides, as the default target builds it.

A and B alternate (order rotating each repetition); medians and A/B are printed, with the
training loop's own samples/s of each run. Target A/B <= 1.15.
A's console output is time-stamped line by line, so its wall time splits into Snakemake start-up
(process start -> first job), the jobs (each job's start and "Finished" lines) and the gaps
between them; B's script marks each command, so the two can be compared job by job.

No-op rerun: a run whose train output holds ``--noop-steps`` complete checkpoints. It trains the
tiny default for 100 steps with ``save_freq=50`` (2 real checkpoints, 50 and 100) through the
pipeline, then fabricates the other 98 step folders by copying step 50 and rewriting only its
``training_state/training_step.json`` (``step``, ``samples_consumed``); the file manifest in that
JSON lists every other file of the step and stays valid (checked with
``verify_files``). The converted outputs of the fabricated steps are copies of step
50's, touched after the step files, with the provenance record Snakemake would have written for
their convert jobs (step 50's record, paths and input checksum changed). One
``snakemake --cores 2`` settles the report table (its input list grew), then ``--noop-reps`` further ``snakemake --cores 2`` runs, which must print
"Nothing to be done", are timed. The same no-op is timed on A's last run (3 checkpoints) for
comparison, and the import time of ``snakemake.api`` (start-up floor) is probed each time.

Because the SLURM executor plugin is installed with the pipeline extra, it is imported by every
snakemake process and runs ``scontrol show config`` (timeout 10 s) at import: the script probes
how long ``scontrol show config`` takes before each timed snakemake run and prints it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from base64 import urlsafe_b64encode
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# BENCH_VENV: another venv (a git worktree has none of its own).
VENV_BIN = Path(os.environ.get("BENCH_VENV", REPO / ".venv")) / "bin"
WORKFLOW_PARTS = ("Snakefile", "workflow", "config", "envs")
TARGET = 1.15
LABELS = {
    "A": "snakemake --cores 2 (all)",
    "B": "plain shell script",
}


# --------------------------------------------------------------------------- environment


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID"):
        env.pop(key, None)
    return env


ENV = child_env()


def fresh_copy(base: Path, name: str) -> Path:
    work = Path(tempfile.mkdtemp(prefix=f"{name}_", dir=base))
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, work / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, work / part)
    return work


def run_stamped(cmd: list[str], cwd: Path, log: Path, timeout: float = 900) -> tuple[float, list]:
    """Run cmd, stamping every console line with the seconds since the start. Returns (wall s,
    [(t, line)]). Raises on a non-zero exit, naming the log."""
    lines = []
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            t = time.perf_counter() - t0
            lines.append((t, line.rstrip("\n")))
            out.write(f"{t:9.3f} {line}")
        rc = proc.wait(timeout=timeout)
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd} (exit {rc}); log {log}\n{tail}")
    return wall, lines


def scontrol_probe() -> float | None:
    """Seconds `scontrol show config` takes (what the SLURM plugin runs at import), or None."""
    if not shutil.which("scontrol"):
        return None
    t0 = time.perf_counter()
    subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, timeout=30, check=False, env=ENV
    )
    return time.perf_counter() - t0


def import_probe() -> float:
    """Seconds for a fresh python to import snakemake.api (all executor plugins included)."""
    t0 = time.perf_counter()
    subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import snakemake.api"], env=ENV, check=True, timeout=120
    )
    return time.perf_counter() - t0


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --------------------------------------------------------------------------- B: the shell script
# The helpers below mirror workflow/rules/common.smk (dotted_flags, train_flags): the dry-run
# check in main() compares the result with the commands Snakemake itself prints.


def _flag_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def dotted_flags(mapping: dict, prefix: str = ""):
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from dotted_flags(value, f"{prefix}{key}.")
        else:
            yield f"--{prefix}{key}={'null' if value is None else _flag_value(value)}"


def pipeline_values(config: dict) -> dict:
    results = f"results/{config['run']}"
    synthetic = not (config["dataset"]["root"] or config["dataset"]["repo_id"])
    if not synthetic:
        raise SystemExit("this benchmark expects the default synthetic dataset in the config")
    if config["hub_repo_id"]:
        raise SystemExit("this benchmark expects publishing off (hub_repo_id empty)")
    if config["launch"]["nnodes"] != 1:
        raise SystemExit("this benchmark runs one node")
    train_dir = f"{results}/train"
    flags = {
        **config["train"],
        "dataset": {"root": f"{results}/dataset", "repo_id": None, "revision": None},
        "output_dir": train_dir,
        "job_name": config["run"],
    }
    return {
        "results": results,
        "train_dir": train_dir,
        "flags": " ".join(shlex.quote(f) for f in dotted_flags(flags)),
        "nproc": config["launch"]["nproc_per_node"],
        "nnodes": config["launch"]["nnodes"],
        "synthetic": config["dataset"]["synthetic"],
        "run": config["run"],
    }


REPORT_STUB = r'''
import glob, runpy, sys

class Named(list):
    """Like Snakemake's Namedlist: a list whose items also have names."""
    def __init__(self, items=(), **named):
        super().__init__(list(items) + [v for v in named.values() if isinstance(v, str)])
        self.__dict__.update(named)

R = sys.argv[2]
run = sys.argv[3]
if sys.argv[1] == "plot_training":
    sm = type("S", (), {})()
    sm.input = Named([f"{R}/final_checkpoint.json"])
    sm.output = Named(loss=f"{R}/report/loss.svg", throughput=f"{R}/report/throughput.svg")
    sm.params = Named(metrics=f"{R}/train/metrics.jsonl", run=run)
    sm.log = Named([f"{R}/logs/plot_training.log"])
else:
    converted = sorted(glob.glob(f"{R}/converted/*/pretrained_model"),
                       key=lambda p: int(p.split("/")[-2]))
    sm = type("S", (), {})()
    sm.input = Named(converted, converted=converted, published=[])
    sm.output = Named([f"{R}/report/checkpoints.html"])
    sm.params = Named(train_dir=f"{R}/train", metrics=f"{R}/train/metrics.jsonl", run=run)
    sm.log = Named([f"{R}/logs/checkpoint_table.log"])
runpy.run_path(f"workflow/scripts/{sys.argv[1]}.py", init_globals={"snakemake": sm},
               run_name="__main__")
'''


def shell_script(v: dict) -> str:
    s = v["synthetic"]
    R = v["results"]
    return f"""#!/usr/bin/env bash
# Generated by bench/bench_pipeline.py from config/config.yaml: the commands of the pipeline's
# rules (workflow/rules/*.smk), run one after the other. mark() records when each one starts.
set -euo pipefail
export OMP_NUM_THREADS=1
mark() {{ echo "$1 $EPOCHREALTIME" >> bench_marks.txt; }}
R={R}
mkdir -p $R/logs/convert $R/report

mark dataset
lerobot-pipe make-dataset --root=$R/dataset \\
    --num_episodes={s["num_episodes"]} --episode_length={s["episode_length"]} \\
    --seed={s["seed"]} > $R/logs/dataset.log 2>&1

mark validate
resume=$(lerobot-pipe resume-args --output_dir={v["train_dir"]} 2> $R/logs/validate.log)
lerobot-pipe validate --nproc_per_node={v["nproc"]} --nnodes={v["nnodes"]} \\
    --write_resolved=$R/resolved_train_config.json $resume {v["flags"]} \\
    2>&1 | tee -a $R/logs/validate.log

mark train
resume=$(lerobot-pipe resume-args --output_dir={v["train_dir"]} 2> $R/logs/train.log)
train=$(which lerobot-train)
echo "torchrun --standalone on $(hostname)" >> $R/logs/train.log
torchrun --standalone --nproc-per-node={v["nproc"]} \\
    "$train" $resume {v["flags"]} >> $R/logs/train.log 2>&1
cp {v["train_dir"]}/checkpoints/last/training_state/training_step.json $R/final_checkpoint.json

for f in {v["train_dir"]}/checkpoints/*/training_state/training_step.json; do
    step_dir=${{f%/training_state/training_step.json}}
    step=${{step_dir##*/}}
    [[ $step =~ ^[0-9]+$ ]] || continue
    mark convert_$step
    lerobot-convert-dcp --checkpoint_dir=$step_dir \\
        --output_dir=$R/converted/$step/pretrained_model > $R/logs/convert/$step.log 2>&1
done

mark plot_training
python bench_report_stub.py plot_training $R {shlex.quote(v["run"])}
mark checkpoint_table
python bench_report_stub.py checkpoint_table $R {shlex.quote(v["run"])}
mark end
"""


# --------------------------------------------------------------------------- runs and phases

HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


def snakemake_phases(lines: list, wall: float) -> dict:
    """Start-up, per-rule job seconds, idle gaps between jobs, and the tail, from A's
    time-stamped console lines."""
    starts, ends, rules, current = {}, {}, {}, None
    for t, line in lines:
        if m := HEADER.match(line):
            current = (m.group(1), t)
        elif (m := JOBID.match(line)) and current:
            starts[m.group(1)] = current[1]
            rules[m.group(1)] = current[0]
            current = None
        elif m := FINISHED.match(line):
            ends[m.group(1)] = t
    jobs = [(starts[j], ends[j], rules[j]) for j in starts if j in ends and rules[j] != "all"]
    if not jobs:
        return {}
    jobs.sort()
    first, last = jobs[0][0], max(e for _, e, _ in jobs)
    busy, cur_s, cur_e = 0.0, None, None  # union of the job intervals
    for s, e, _ in jobs:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    per_rule: dict[str, float] = {}
    for s, e, r in jobs:
        per_rule[r] = per_rule.get(r, 0.0) + (e - s)
    return {
        "startup": first,
        "busy": busy,
        "gaps": (last - first) - busy,
        "tail": wall - last,
        "per_rule": per_rule,
        "n_jobs": len(jobs),
    }


def shell_phases(marks_file: Path) -> dict:
    marks = [line.split() for line in marks_file.read_text().splitlines() if line.strip()]
    times = [(name, float(t)) for name, t in marks]
    per: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(times, times[1:], strict=False):
        key = "convert" if name.startswith("convert_") else name
        per[key] = per.get(key, 0.0) + (t_next - t)
    return per


def check_outputs(work: Path, results: str, expect_steps: int) -> dict:
    R = work / results
    converted = sorted(R.glob("converted/*/pretrained_model/model.safetensors"))
    missing = [p for p in ("report/loss.svg", "report/checkpoints.html") if not (R / p).is_file()]
    if len(converted) != expect_steps or missing:
        raise SystemExit(f"{work}: {len(converted)} converted steps, missing {missing}")
    final = json.loads((R / "final_checkpoint.json").read_text())
    last_loss, rates = None, []
    metrics = R / "train" / "metrics.jsonl"
    for line in metrics.read_text().splitlines():
        if line.strip() and "loss" in (rec := json.loads(line)):
            last_loss = rec["loss"]
            if rec.get("samples_per_s"):
                rates.append(rec["samples_per_s"])
    return {
        "final_step": final["step"],
        "last_loss": last_loss,
        # the training loop's own speed, first logging window (warm-up) left out
        "samples_per_s": statistics.median(rates[1:] or rates),
        "resolved": json.loads((R / "resolved_train_config.json").read_text()),
    }


def run_a(base: Path, results: str, expect_steps: int) -> dict:
    work = fresh_copy(base, "A")
    probe = scontrol_probe()
    wall, lines = run_stamped(["snakemake", "--cores", "2"], work, work / "console.log")
    out = check_outputs(work, results, expect_steps)
    return {
        "wall": wall,
        "work": work,
        "phases": snakemake_phases(lines, wall),
        "probe": probe,
        **out,
    }


def run_b(base: Path, script: str, results: str, expect_steps: int) -> dict:
    work = fresh_copy(base, "B")
    (work / "run_pipeline.sh").write_text(script)
    (work / "bench_report_stub.py").write_text(REPORT_STUB)
    wall, _ = run_stamped(["bash", "run_pipeline.sh"], work, work / "console.log")
    out = check_outputs(work, results, expect_steps)
    return {"wall": wall, "work": work, "phases": shell_phases(work / "bench_marks.txt"), **out}


def dry_run_check(base: Path, v: dict) -> None:
    """The commands B runs are the ones Snakemake runs: compare with `snakemake -n -p`."""
    work = fresh_copy(base, "dryrun")
    _, lines = run_stamped(["snakemake", "-n", "-p", "--cores", "2"], work, work / "console.log")
    text = "\n".join(line for _, line in lines)
    s = v["synthetic"]
    expected = [
        f"--num_episodes={s['num_episodes']}",
        f"--episode_length={s['episode_length']}",
        f"--seed={s['seed']}",
        f"--nproc_per_node={v['nproc']} --nnodes={v['nnodes']}",
        "exec lerobot-pipe launch-train --cpus_per_task=",
    ]
    missing = [e for e in expected if e not in text]
    n_flags = text.count(v["flags"])
    if missing or n_flags < 2:
        raise SystemExit(
            f"B's commands differ from `snakemake -n -p` (missing {missing}; the train flags "
            f"appear {n_flags}x, expected validate + train); see {work / 'console.log'}"
        )
    shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- no-op rerun


def _metadata_file(work: Path, output: str) -> Path:
    # Snakemake's own naming (snakemake/persistence/file.py: _record_path), short paths only.
    return work / ".snakemake" / "metadata" / urlsafe_b64encode(output.encode()).decode()


def copy_metadata(work: Path, results: str, template: str, name: str) -> None:
    """The provenance record Snakemake would have written had it run the convert job of a
    fabricated step: the template step's, with the step's paths and its input's checksum."""
    src = _metadata_file(work, f"{results}/converted/{template}/pretrained_model")
    record = json.loads(src.read_text())

    def sub(value):
        if isinstance(value, str):
            return value.replace(f"/{template}", f"/{name}")
        return [sub(x) for x in value] if isinstance(value, list) else value

    for key in ("input", "log", "params", "shellcmd"):
        record[key] = sub(record[key])
    step_file = f"{results}/train/checkpoints/{name}/training_state/training_step.json"
    digest = hashlib.sha256((work / step_file).read_bytes()).hexdigest()
    record["input_checksums"] = {step_file: f"sha256:{digest}"}
    dst = _metadata_file(work, f"{results}/converted/{name}/pretrained_model")
    dst.write_text(json.dumps(record))


def fabricate_steps(work: Path, results: str, total: int, template_step: int) -> int:
    from lerobot_pipe.checkpoint.layout import (
        list_complete_checkpoints,
        read_training_step,
        step_folder_name,
    )
    from lerobot_pipe.checkpoint.manifest import verify_files

    R = work / results
    ckpts = R / "train" / "checkpoints"
    template = ckpts / step_folder_name(template_step, total)
    converted_template = R / "converted" / template.name / "pretrained_model"
    info = read_training_step(template)
    made = []
    for step in range(1, total + 1):
        name = step_folder_name(step, total)
        if (ckpts / name).exists():
            continue
        shutil.copytree(template, ckpts / name, symlinks=True)
        new = dict(info, step=step)
        if "samples_consumed" in info:
            new["samples_consumed"] = step * info.get("global_batch_size", 0)
        (ckpts / name / "training_state" / "training_step.json").write_text(
            json.dumps(new, indent=4)
        )
        made.append(name)
    time.sleep(1.1)  # converted outputs strictly newer than every step file
    for name in made:
        dst = R / "converted" / name / "pretrained_model"
        shutil.copytree(converted_template, dst)
        shutil.copy2(
            R / "logs" / "convert" / f"{template.name}.log", R / "logs/convert" / f"{name}.log"
        )
        for p in [dst, *dst.rglob("*")]:
            os.utime(p)
        copy_metadata(work, results, template.name, name)
    complete = list_complete_checkpoints(R / "train")
    for step_dir in complete:  # every manifest still matches its files
        verify_files(step_dir, read_training_step(step_dir))
    return len(complete)


def noop_runs(work: Path, reps: int, label: str) -> list[dict]:
    out = []
    for i in range(reps):
        probe = scontrol_probe()
        wall, lines = run_stamped(
            ["snakemake", "--cores", "2"], work, work / f"noop_{label}_{i}.log"
        )
        text = "\n".join(line for _, line in lines)
        if "Nothing to be done" not in text:
            raise SystemExit(f"{label}: the rerun had work to do; see {work}/noop_{label}_{i}.log")
        imp = import_probe()
        out.append({"wall": wall, "probe": probe, "import": imp})
        print(
            f"  no-op {label} #{i + 1}: {wall:.2f} s (import snakemake.api {imp:.2f} s; "
            f"scontrol probe {probe if probe is None else round(probe, 2)} s)",
            flush=True,
        )
    return out


def build_noop_run(base: Path, config: dict, steps: int) -> tuple[Path, str]:
    work = fresh_copy(base, "noop")
    cfg = json.loads(json.dumps(config))
    save_freq = steps // 2
    cfg["run"] = f"noop{steps}"
    cfg["train"]["steps"] = steps
    cfg["train"]["save_freq"] = save_freq
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    results = f"results/{cfg['run']}"
    t0 = time.perf_counter()
    run_stamped(["snakemake", "--cores", "2"], work, work / "build.log")
    print(
        f"  trained {steps} steps (save_freq {save_freq}) + converted: "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    n = fabricate_steps(work, results, steps, save_freq)
    print(f"  {n} complete checkpoint steps verified (manifests valid)", flush=True)
    _, lines = run_stamped(["snakemake", "-n", "--cores", "2"], work, work / "dryrun.log")
    jobs = [m.group(1) for _, line in lines if (m := HEADER.match(line))]
    if any("missing provenance" in line for _, line in lines):
        raise SystemExit(f"fabricated steps lack Snakemake metadata; see {work}/dryrun.log")
    if any(j not in ("checkpoint_table", "all") for j in jobs):
        raise SystemExit(f"after fabrication Snakemake wants to run {jobs}; see {work}/dryrun.log")
    t0 = time.perf_counter()
    run_stamped(["snakemake", "--cores", "2"], work, work / "settle.log")
    print(
        f"  settling run ({', '.join(jobs) or 'nothing'}): {time.perf_counter() - t0:.2f} s",
        flush=True,
    )
    return work, results


# --------------------------------------------------------------------------- main


def med(xs):
    return statistics.median(xs)


# --------------------------------------------------------------------------- --flow
# Checkpoints that flow (launch.segment_steps): the same run trained in segments, each
# checkpoint converted and evaluated while the next segment trains, against one unbroken train
# job (segment_steps: 0), as the pipeline ran before.
FLOW_CONFIGS = {
    "default": {},
    "300 steps, a checkpoint every 30": {"train": {"steps": 300, "save_freq": 30}},
}


def run_flow(base: Path, name: str, override: dict, segmented: bool) -> dict:
    work = fresh_copy(base, "flow")
    config = {**override, "launch": {"segment_steps": None if segmented else 0}}
    (work / "override.yaml").write_text(yaml.safe_dump(config))
    start = time.time()
    wall, lines = run_stamped(
        ["snakemake", "--cores", "2", "--configfile", "config/config.yaml", "override.yaml"],
        work,
        work / "console.log",
    )
    results = work / "results" / "default"
    evals = sorted(results.glob("eval/*/eval_info.json"))
    steps = sorted(results.glob("train/checkpoints/0*/training_state/training_step.json"))
    phases = snakemake_phases(lines, wall)
    return {
        "wall": wall,
        "train_s": phases["per_rule"].get("train_segment", 0.0)
        + phases["per_rule"].get("train", 0.0),
        # From snakemake's start to the first checkpoint's evaluation, and to the last checkpoint.
        "first_eval": evals[0].stat().st_mtime - start,
        "last_checkpoint": steps[-1].stat().st_mtime - start,
        "n_checkpoints": len(steps),
        "last_loss": check_outputs(work, "results/default", len(steps))["last_loss"],
    }


def flow_main(reps: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench_flow_"))
    print(f"temporary folder {base}; load average {load_average()}", flush=True)
    try:
        for name, override in FLOW_CONFIGS.items():
            runs: dict[bool, list[dict]] = {True: [], False: []}
            for rep in range(reps):
                for segmented in (True, False) if rep % 2 == 0 else (False, True):
                    r = run_flow(base, name, override, segmented)
                    runs[segmented].append(r)
                    print(
                        f"{name}: rep {rep + 1} {'segments' if segmented else 'unbroken'} "
                        f"{r['wall']:.1f} s (training jobs {r['train_s']:.1f} s; first "
                        f"evaluation at {r['first_eval']:.1f} s, last checkpoint at "
                        f"{r['last_checkpoint']:.1f} s; last loss {r['last_loss']:.6f}; load "
                        f"{load_average()})",
                        flush=True,
                    )
            seg, one = runs[True], runs[False]
            boundaries = seg[0]["n_checkpoints"] - 1
            wall_s, wall_u = med([r["wall"] for r in seg]), med([r["wall"] for r in one])
            train_s, train_u = med([r["train_s"] for r in seg]), med([r["train_s"] for r in one])
            print(
                f"{name}: wall {wall_s:.1f} s in segments vs {wall_u:.1f} s unbroken "
                f"({wall_s / wall_u:.2f}x); training jobs {train_s:.1f} vs {train_u:.1f} s: "
                f"{(train_s - train_u) / boundaries:.1f} s per boundary ({boundaries}); first "
                f"evaluation at {med([r['first_eval'] for r in seg]):.1f} vs "
                f"{med([r['first_eval'] for r in one]):.1f} s; same last loss: "
                f"{len({round(r['last_loss'], 6) for r in seg + one}) == 1}",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of A and of B (>= 3)")
    ap.add_argument("--noop-reps", type=int, default=3)
    ap.add_argument("--noop-steps", type=int, default=100)
    ap.add_argument("--skip-noop", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    ap.add_argument(
        "--flow",
        action="store_true",
        help="instead: training in segments vs one unbroken train job (launch.segment_steps)",
    )
    args = ap.parse_args()
    if args.flow:
        flow_main(args.reps)
        return

    for tool in ("snakemake", "torchrun", "lerobot-train", "lerobot-pipe", "lerobot-convert-dcp"):
        if not (VENV_BIN / tool).exists():
            raise SystemExit(f"{VENV_BIN / tool} not found: run `make venv` first")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    v = pipeline_values(config)
    steps = config["train"]["steps"]
    expect_steps = len(
        set(range(config["train"]["save_freq"], steps + 1, config["train"]["save_freq"])) | {steps}
    )
    sides = "AB"
    base = Path(tempfile.mkdtemp(prefix="bench_pipeline_"))
    print(f"temporary folder {base}; load average {load_average()}", flush=True)
    try:
        dry_run_check(base, v)
        print("B's commands match `snakemake -n -p` (dataset, validate, train flags)", flush=True)
        script = shell_script(v)
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for rep in range(args.reps):
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]
            for side in order:
                if side == "B":
                    r = run_b(base, script, v["results"], expect_steps)
                    detail = f"train command {r['phases']['train']:.2f} s"
                else:
                    r = run_a(base, v["results"], expect_steps)
                    ph = r["phases"]
                    detail = (
                        f"start-up {ph['startup']:.2f}, jobs busy {ph['busy']:.2f}, gaps "
                        f"{ph['gaps']:.2f}, tail {ph['tail']:.2f}, train job "
                        f"{ph['per_rule']['train']:.2f} s; scontrol probe "
                        f"{r['probe'] if r['probe'] is None else round(r['probe'], 2)} s"
                    )
                runs[side].append(r)
                print(
                    f"rep {rep + 1} {side} {LABELS[side]:28s} {r['wall']:6.2f} s  "
                    f"(train loop {r['samples_per_s']:.0f} samples/s; {detail}; "
                    f"load {load_average()})",
                    flush=True,
                )
        a_runs, b_runs = runs["A"], runs["B"]

        # Same work on both sides.
        every = [r for side in sides for r in runs[side]]
        finals = {r["final_step"] for r in every}
        resolved_same = all(r["resolved"] == a_runs[0]["resolved"] for r in every)
        losses = sorted({round(r["last_loss"], 6) for r in every})
        print(
            f"same work: final step {finals}, resolved train config identical: {resolved_same}, "
            f"last logged loss {losses}"
        )

        walls = {side: [r["wall"] for r in runs[side]] for side in sides}
        meds = {side: med(walls[side]) for side in sides}
        ratio = meds["A"] / meds["B"]
        print()
        for side in sides:
            print(
                f"{side} {LABELS[side]:28s} median {meds[side]:6.2f} s  "
                f"[{', '.join(f'{w:.1f}' for w in walls[side])}]; train loop "
                f"{med([r['samples_per_s'] for r in runs[side]]):.0f} samples/s"
            )
        per_rep = [a / b for a, b in zip(walls["A"], walls["B"], strict=True)]
        print(
            f"A/B = {ratio:.3f}  (per repetition {', '.join(f'{x:.2f}' for x in per_rep)})  "
            f"target <= {TARGET}: {'PASS' if ratio <= TARGET else 'MISS'}"
        )

        print("\nwhere the time goes (medians, s):")
        snake = [side for side in sides if side != "B"]
        for k in ("startup", "busy", "gaps", "tail"):
            print(
                f"  {k:8s} "
                + "  ".join(f"{s}: {med([r['phases'][k] for r in runs[s]]):6.2f}" for s in snake)
            )
        rules = ("dataset", "validate", "train", "convert", "plot_training", "checkpoint_table")
        print(f"  {'job':18s} " + " ".join(f"{s + ' job':>9s}" for s in snake) + "  B command")
        for rule in rules:
            cells = [med([r["phases"]["per_rule"].get(rule, 0.0) for r in runs[s]]) for s in snake]
            b_t = med([r["phases"].get(rule, 0.0) for r in b_runs])
            print(f"  {rule:18s} " + " ".join(f"{c:9.2f}" for c in cells) + f"  {b_t:9.2f}")
        print(
            "  (job times are summed per rule; Snakemake runs the convert and report jobs 2 at a "
            "time on --cores 2, B one by one)"
        )
        probes = [r["probe"] for r in a_runs if r["probe"] is not None]
        if probes:
            print(
                f"  scontrol show config before each A run: {', '.join(f'{p:.2f}' for p in probes)} s "
                "(the SLURM executor plugin runs it at import, timeout 10 s)"
            )

        if not args.skip_noop:
            print(f"\nno-op rerun with {args.noop_steps} complete checkpoint steps:", flush=True)
            work, _ = build_noop_run(base, config, args.noop_steps)
            many = noop_runs(work, args.noop_reps, f"{args.noop_steps}steps")
            few = noop_runs(a_runs[-1]["work"], args.noop_reps, f"{expect_steps}steps")
            m_many, m_few = med([r["wall"] for r in many]), med([r["wall"] for r in few])
            imp = med([r["import"] for r in many + few])
            print(
                f"no-op snakemake --cores 2: {m_many:.2f} s with {args.noop_steps} steps, "
                f"{m_few:.2f} s with {expect_steps} (import of snakemake.api alone {imp:.2f} s)"
            )
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
