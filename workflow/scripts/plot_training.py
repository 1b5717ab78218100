"""Loss curve, throughput and step-time split of one training run, from lerobot-train's
metrics.jsonl."""

import contextlib
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> dict[int, dict]:
    """One record per step: a step's training record and its held-out loss record (``eval_loss``)
    merged. A resumed run logs again the steps after its checkpoint: the latest value of a step
    wins, as it is the one the final weights come from."""
    records: dict[int, dict] = {}
    if not path.exists():
        print(f"{path} does not exist: the figures will be empty", file=sys.stderr)
        return records
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records.setdefault(int(record["step"]), {}).update(record)
    return dict(sorted(records.items()))


def plot(
    records: dict[int, dict],
    keys: dict[str, str],
    ylabel: str,
    title: str,
    out: str,
) -> None:
    """One curve per key (key -> legend label); a legend when there are several curves."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    drawn = 0
    for key, label in keys.items():
        points = [(step, r[key]) for step, r in records.items() if r.get(key) is not None]
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker=".", label=label)
            drawn += 1
    if drawn > 1:
        ax.legend(fontsize="small")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


# lerobot-train's step-time split (LeRobot's names), each the slowest rank's mean over the
# logged window; step_s is the whole step.
PHASES = (
    ("dataloading_s", "waiting for data"),
    ("preprocessing_s", "preprocessing"),
    ("update_s", "forward, backward, optimizer"),
)


def plot_throughput(records: dict[int, dict], title: str, out: str) -> None:
    """Samples per second above, and below where each step's time went: the phases stacked,
    the whole step as a line. Records of an older lerobot-train have no split: the lower
    panel stays empty."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5.5), sharex=True)
    points = [(step, r["samples_per_s"]) for step, r in records.items() if "samples_per_s" in r]
    if points:
        steps, values = zip(*points, strict=True)
        top.plot(steps, values, marker=".")
    top.set_ylabel("samples / s (all ranks)")
    top.set_title(title)
    top.grid(alpha=0.3)
    split = {s: r for s, r in records.items() if all(k in r for k, _ in PHASES)}
    if split:
        steps = list(split)
        bottom.stackplot(
            steps,
            *[[split[s][key] for s in steps] for key, _ in PHASES],
            labels=[f"{label} ({key})" for key, label in PHASES],
            alpha=0.8,
        )
        if all("step_s" in r for r in split.values()):
            step_s = [split[s]["step_s"] for s in steps]
            bottom.plot(steps, step_s, color="black", linewidth=1, label="step (step_s)")
        bottom.legend(fontsize="small", loc="upper right")
    bottom.set_xlabel("step")
    bottom.set_ylabel("seconds per step (slowest rank)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(snakemake) -> None:
    records = read_metrics(Path(snakemake.params.metrics))
    run = snakemake.params.run
    # The held-out loss (--eval_steps with --dataset.eval_split) beside the training loss.
    curves = {"loss": "training loss", "eval_loss": "held-out loss (eval_loss)"}
    plot(records, curves, "loss", f"{run}: loss", snakemake.output.loss)
    plot_throughput(records, f"{run}: throughput", snakemake.output.throughput)


with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):  # noqa: F821
    main(snakemake)  # noqa: F821  (injected by Snakemake's script directive)
