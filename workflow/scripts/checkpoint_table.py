"""An HTML table of a run's checkpoints: step, topology, loss, evaluation (success, rewards, the
best one), converted folder, Hub commit. The files come as params: for a report during a run,
those that exist (best.json maybe not yet)."""

import contextlib
import html
import json
from pathlib import Path

from lerobot_pipe.constants import CHECKPOINTS_DIR, TRAINING_STATE_DIR, TRAINING_STEP

COLUMNS = ("step", "processes", "topology", "loss", "converted", "Hub revision", "commit")
EVAL_COLUMNS = ("success %", "avg max reward", "avg sum reward", "best")


def losses(metrics: Path) -> dict[int, float]:
    if not metrics.exists():
        return {}
    records = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
    return {int(r["step"]): r["loss"] for r in records if "loss" in r}


def row(converted: Path, train_dir: Path, loss: dict[int, float], receipts: dict[str, dict]):
    step = converted.parent.name
    # Gone when retention (train.checkpoint_keep_last) deleted the checkpoint after conversion.
    state_file = train_dir / CHECKPOINTS_DIR / step / TRAINING_STATE_DIR / TRAINING_STEP
    state = json.loads(state_file.read_text()) if state_file.is_file() else None
    receipt = receipts.get(step, {})
    topology = ""
    if state is not None:
        parallelism = state["parallelism"]
        topology = (
            f"{parallelism['mode']}: dp_replicate={parallelism['dp_replicate']}"
            f" x dp_shard={parallelism['dp_shard']}"
        )
    return (
        str(int(step)),
        str(state["world_size"]) if state is not None else "",
        topology,
        f"{loss[int(step)]:.4f}" if int(step) in loss else "",
        str(converted),
        str(receipt.get("revision", "")),
        str(receipt.get("commit_id", "")),
    )


def eval_cells(step: str, evaluations: dict[str, dict], best: str | None) -> tuple:
    overall = evaluations.get(step)
    if overall is None:
        return ("", "", "", "")
    return (
        f"{overall['pc_success']:.1f}",
        f"{overall['avg_max_reward']:.4f}",
        f"{overall['avg_sum_reward']:.4f}",
        "best" if step == best else "",
    )


def cells(tag: str, values) -> str:
    return "".join(f"<{tag}>{html.escape(v)}</{tag}>" for v in values)


def main(snakemake) -> None:
    loss = losses(Path(snakemake.params.metrics))
    receipts = {Path(p).stem: json.loads(Path(p).read_text()) for p in snakemake.params.published}
    rows = [
        row(Path(p), Path(snakemake.params.train_dir), loss, receipts)
        for p in snakemake.params.converted
    ]
    columns = COLUMNS
    if snakemake.params.evaluating:
        evaluations = {
            Path(p).parent.name: json.loads(Path(p).read_text())["overall"]
            for p in snakemake.params.evaluated
        }
        best = None
        if snakemake.params.best and Path(snakemake.params.best).is_file():
            best = json.loads(Path(snakemake.params.best).read_text())["step"]
        steps = [Path(p).parent.name for p in snakemake.params.converted]
        rows = [
            (*r[:4], *eval_cells(step, evaluations, best), *r[4:])
            for step, r in zip(steps, rows, strict=True)
        ]
        columns = (*COLUMNS[:4], *EVAL_COLUMNS, *COLUMNS[4:])
    body = "\n".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    Path(snakemake.output[0]).write_text(
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(snakemake.params.run)}: checkpoints</title>"
        "<style>table{border-collapse:collapse;font-family:sans-serif}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head>"
        f"<body><table>\n<tr>{cells('th', columns)}</tr>\n{body}\n</table></body></html>\n"
    )


with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):  # noqa: F821
    main(snakemake)  # noqa: F821  (injected by Snakemake's script directive)
