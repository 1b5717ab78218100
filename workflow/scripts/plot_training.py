"""Loss curve and throughput of one training run, from lerobot-train's metrics.jsonl."""

import contextlib
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path: Path) -> dict[int, dict]:
    """One record per step. A resumed run logs again the steps after its checkpoint: the
    latest record of a step wins, as it is the one the final weights come from."""
    records: dict[int, dict] = {}
    if not path.exists():
        print(f"{path} does not exist: the figures will be empty", file=sys.stderr)
        return records
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[int(record["step"])] = record
    return dict(sorted(records.items()))


def plot(records: dict[int, dict], key: str, ylabel: str, title: str, out: str) -> None:
    points = [(step, r[key]) for step, r in records.items() if r.get(key) is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(snakemake) -> None:
    records = read_metrics(Path(snakemake.params.metrics))
    run = snakemake.params.run
    plot(records, "loss", "training loss", f"{run}: loss", snakemake.output.loss)
    plot(
        records,
        "samples_per_s",
        "samples / s (all ranks)",
        f"{run}: throughput",
        snakemake.output.throughput,
    )


with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):  # noqa: F821
    main(snakemake)  # noqa: F821  (injected by Snakemake's script directive)
