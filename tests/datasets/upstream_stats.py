"""LeRobot's feature statistics of the episodes test_stats.py wrote; run with LeRobot's Python.

    <upstream python> upstream_stats.py <spec.json>

``spec.json``: ``episodes`` (an npz of ``<episode>/<feature>`` numeric arrays), ``num_episodes``,
``features`` (LeRobot's feature dicts), ``images`` (feature -> per episode, its PNG paths) and
``out``, where LeRobot's ``compute_episode_stats`` of each episode and their ``aggregate_stats``
are written as JSON (``episode_<i>`` and ``aggregated``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from lerobot.datasets.compute_stats import aggregate_stats, compute_episode_stats


def _json(stats: dict) -> dict:
    return {key: {k: np.asarray(v).tolist() for k, v in s.items()} for key, s in stats.items()}


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    arrays = np.load(spec["episodes"])
    per_episode = []
    for e in range(spec["num_episodes"]):
        data = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith(f"{e}/")}
        data |= {key: paths[e] for key, paths in spec["images"].items()}
        per_episode.append(compute_episode_stats(data, spec["features"]))
    out = {f"episode_{e}": _json(stats) for e, stats in enumerate(per_episode)}
    out["aggregated"] = _json(aggregate_stats(per_episode))
    Path(spec["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
