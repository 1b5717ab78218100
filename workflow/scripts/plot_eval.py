"""Success rate and rewards of each evaluated checkpoint against its step, the best one marked,
from the evaluate rule's eval/<step>/eval_info.json and eval/best.json (params: the files; for a
report during a run those that exist, maybe none, and best.json once one was written)."""

import contextlib
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (
    ("pc_success", "success (%)"),
    ("avg_max_reward", "mean max reward"),
    ("avg_sum_reward", "mean sum reward"),
)


def main(snakemake) -> None:
    overall = {
        int(Path(p).parent.name): json.loads(Path(p).read_text())["overall"]
        for p in snakemake.params.evaluated
    }
    steps = sorted(overall)
    best_step = None
    if snakemake.params.best and Path(snakemake.params.best).is_file():
        best_step = int(json.loads(Path(snakemake.params.best).read_text())["step"])
    if best_step not in overall:  # a report during a run: best.json may lag the evaluations
        best_step = None
    env = snakemake.params.env or {}
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(6, 6.5), sharex=True)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        ax.plot(steps, [overall[s][key] for s in steps], marker="o")
        if best_step is not None:
            ax.plot(
                [best_step],
                [overall[best_step][key]],
                marker="*",
                markersize=14,
                linestyle="none",
                color="tab:red",
                label=f"best: step {best_step}",
            )
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-5, 105)
    # Below the panels: inside one, the legend could cover the star wherever the best lands.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", fontsize="small")
    episodes = f"{overall[steps[0]]['n_episodes']} episodes per checkpoint" if steps else "none yet"
    axes[0].set_title(f"{snakemake.params.run}: {env.get('type', '')} env, {episodes}")
    axes[-1].set_xlabel("step")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(snakemake.output[0])
    plt.close(fig)


with open(snakemake.log[0], "w") as log, contextlib.redirect_stderr(log):  # noqa: F821
    main(snakemake)  # noqa: F821  (injected by Snakemake's script directive)
