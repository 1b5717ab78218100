"""Model card (the Hub repo's README.md) for a trained LeRobot policy.

Built with huggingface_hub's ``ModelCard`` / ``ModelCardData``, with the fields LeRobot's
``PreTrainedPolicy.generate_model_card`` sets (0.6.1): ``library_name: lerobot``,
``pipeline_tag: robotics``, ``model_name`` (the policy type), ``datasets``, ``base_model``,
``license`` and ``tags`` (``lerobot``, ``robotics``, the policy type, then ours). The body
describes the policy, tabulates the training summary and metrics, and shows how to load it.
Keys that look secret (containing "token", "secret", "password", "api_key", ...) are dropped at
any depth, and values that look like tokens are masked
(:func:`~lerobot_pipe.utils.hub_http.redact`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from lerobot_pipe import constants as C
from lerobot_pipe.utils.hub_http import redact
from lerobot_pipe.utils.repo_id import looks_like_repo_id

_SECRET_KEY_RE = re.compile(r"token|secret|password|passwd|api_?key|credential", re.IGNORECASE)
_BASE_TAGS = ("lerobot", "robotics")


def _is_secret_key(key: Any) -> bool:
    return bool(_SECRET_KEY_RE.search(str(key)))


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        if _is_secret_key(key):
            continue
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from _flatten(value, name)
        else:
            yield name, value


def _format_value(value: Any) -> str:
    if value is None:
        text = "–"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = str(value) if math.isnan(value) or math.isinf(value) else f"{value:.6g}"
    elif isinstance(value, list | tuple):
        text = ", ".join(_format_value(v) for v in value)
    else:
        text = str(value)
    text = redact(text)
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(header: tuple[str, str], rows: list[tuple[str, Any]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| `{_format_value(k)}` | {_format_value(v)} |" for k, v in rows]
    return "\n".join(lines)


def _dedup(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        if item and item not in seen:
            seen[item] = None
    return list(seen)


def make_model_card(
    *,
    repo_id: str,
    policy_type: str,
    dataset_repo_id: str | None,
    base_model: str | None,
    train_summary: dict,
    metrics: dict | None,
    license: str | None = "apache-2.0",  # noqa: A002 - the Hub's metadata field name
    tags: list[str] | None = None,
) -> str:
    """Return the README.md text (YAML front matter + Markdown body) for a policy repo."""
    metadata = ModelCardData(
        license=license or None,
        library_name="lerobot",
        pipeline_tag="robotics",
        tags=_dedup([*_BASE_TAGS, policy_type, "lerobot_pipe", *(tags or [])]),
        model_name=policy_type,
        datasets=[dataset_repo_id] if dataset_repo_id else None,
        base_model=base_model or None,
    )
    sections = [
        *_intro(repo_id, policy_type, dataset_repo_id, base_model),
        *_tables(train_summary, metrics),
        *_usage(repo_id, policy_type),
    ]
    body = "\n\n".join(sections) + "\n"
    return str(ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}"))


def _intro(
    repo_id: str, policy_type: str, dataset_repo_id: str | None, base_model: str | None
) -> list[str]:
    """The card's title and what the repository holds."""
    title = f"# {policy_type.upper() if len(policy_type) <= 5 else policy_type} policy: `{repo_id}`"
    what = [
        f"This repository holds a robot-learning policy of type **{policy_type}** in the "
        "[LeRobot](https://github.com/huggingface/lerobot) format (`config.json`, "
        "`model.safetensors` or a PEFT adapter, and the policy pre/post-processors), "
        "trained with `lerobot_pipe`."
    ]
    if dataset_repo_id:
        what.append(
            f"It was trained on the dataset "
            f"[`{dataset_repo_id}`](https://huggingface.co/datasets/{dataset_repo_id})."
        )
    if base_model:
        what.append(
            f"It was fine-tuned from [`{base_model}`](https://huggingface.co/{base_model})."
        )

    return [title, " ".join(what)]


def _tables(train_summary: dict, metrics: dict | None) -> list[str]:
    """The training configuration, and the last logged metrics when there are any."""
    summary_rows = list(_flatten(train_summary or {}))
    sections = [
        "## Training configuration",
        _table(("Setting", "Value"), summary_rows) if summary_rows else "_Not recorded._",
    ]
    metric_rows = list(_flatten(metrics or {}))
    if metric_rows:
        sections += ["## Metrics", _table(("Metric", "Value"), metric_rows)]
    return sections


def _usage(repo_id: str, policy_type: str) -> list[str]:
    """How to download and load the policy."""
    return [
        "## How to use",
        "Download the files with `huggingface_hub`:\n\n"
        "```python\n"
        "from huggingface_hub import snapshot_download\n\n"
        f'path = snapshot_download("{repo_id}")\n'
        "```\n\n"
        "or load the policy with LeRobot:\n\n"
        "```python\n"
        "from lerobot.policies.factory import get_policy_class\n\n"
        f'policy = get_policy_class("{policy_type}").from_pretrained("{repo_id}")\n'
        "policy.eval()\n"
        "```\n\n"
        "Intermediate checkpoints, when published, live under `checkpoints/<step>/` and are "
        "tagged `step-<step>`: fetch one with "
        f'`snapshot_download("{repo_id}", revision="step-005000", '
        'allow_patterns=["checkpoints/005000/*"])`.',
    ]


def model_card_for_checkpoint(pretrained_dir: str | Path, repo_id: str) -> str:
    """The model card of a checkpoint's ``pretrained_model/``, from its train_config.json, the
    topology in the step folder's training_step.json and the run's last logged metrics
    (``<output_dir>/metrics.jsonl``), each when it can be found."""
    pretrained_dir = Path(pretrained_dir)
    config = json.loads((pretrained_dir / C.TRAIN_CONFIG_NAME).read_text())
    policy = config.get("policy") or {}
    step_file = pretrained_dir.parent / C.TRAINING_STATE_DIR / C.TRAINING_STEP
    resolved = json.loads(step_file.read_text()) if step_file.is_file() else {}
    parallelism = resolved.get("parallelism") or {}
    accelerator = config.get("accelerator") or {}
    summary = {
        "policy": policy.get("type"),
        "steps": config.get("steps"),
        "batch_size": config.get("batch_size"),
        "effective_batch_size": resolved.get("global_batch_size"),
        "topology": parallelism.get("mode"),
        "dp_replicate": parallelism.get("dp_replicate"),
        "dp_shard": parallelism.get("dp_shard"),
        "mixed_precision": accelerator.get("mixed_precision"),
        "optimizer_lr": (config.get("optimizer") or {}).get("lr"),
        "seed": config.get("seed"),
        "peft": (config.get("peft") or {}).get("method_type"),
    }
    metrics = None
    metrics_file = Path(config.get("output_dir") or "") / C.METRICS_LOG
    if config.get("output_dir") and metrics_file.is_file():
        records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line]
        train = [r for r in records if "loss" in r]  # the others: held-out loss records
        if train:
            metrics = {k: train[-1][k] for k in ("step", "loss")}
            held_out = [r for r in records if "eval_loss" in r and r["step"] <= metrics["step"]]
            if held_out:
                metrics["eval_loss"] = held_out[-1]["eval_loss"]
    return make_model_card(
        repo_id=repo_id,
        policy_type=policy.get("type") or "unknown",
        dataset_repo_id=(config.get("dataset") or {}).get("repo_id"),
        base_model=_hub_repo_id_or_none(policy.get("pretrained_path")),
        train_summary={k: v for k, v in summary.items() if v is not None},
        metrics=metrics,
        license=policy.get("license") or "apache-2.0",
        tags=policy.get("tags"),
    )


def _hub_repo_id_or_none(path: str | None) -> str | None:
    """A base model the card can link to: a Hub repo id, not a local folder."""
    return path if path and looks_like_repo_id(path) else None
