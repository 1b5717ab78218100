"""The pipeline's config (config/config.yaml) in the words of its keys.

:func:`config_problems` checks a config against the workflow's JSON schema and names each
problem by its key, one line each (Snakemake's own validate() prints the whole schema and config
for an unknown key). :func:`with_config_keys` adds, to a lerobot-train message that names flags,
the config keys that set them (``--checkpoint_format`` is ``train.checkpoint_format``);
:func:`with_eval_config_keys` does the same for the evaluate rule's lerobot-eval flags.
"""

from __future__ import annotations

import re

# lerobot-train flags the pipeline sets itself (the schema refuses them under `train`).
_SET_BY_PIPELINE = {"output_dir", "job_name", "resume", "config_path", "stop_after_step"}
# --dataset.* flags that come from the config's own `dataset` section.
_DATASET_KEYS = {"dataset.root", "dataset.repo_id", "dataset.revision", "dataset.eval_split"}
_FLAG = re.compile(r"--([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def config_problems(config: dict, schema: dict) -> list[str]:
    """Every way ``config`` breaks ``schema``, one line each, naming the key."""
    from jsonschema import Draft202012Validator

    problems = []
    for error in Draft202012Validator(schema).iter_errors(config):
        path = ".".join(str(part) for part in error.absolute_path)
        prefix = f"{path}." if path else ""
        if error.validator == "additionalProperties":
            allowed = list(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed)):
                problems.append(
                    f"unknown config key {prefix}{key}; allowed here: {', '.join(allowed)} "
                    "(config/README.md)"
                )
        elif error.validator == "not" and path == "train":
            forbidden = [
                key
                for option in error.schema["not"].get("anyOf", [])
                for key in option.get("required", [])
                if key in error.instance
            ]
            for key in forbidden:
                problems.append(
                    f"config key train.{key}: the pipeline sets --{key} itself; remove it "
                    "(config/README.md)"
                )
        else:
            problems.append(f"config key {path or '(top level)'}: {error.message}")
    return problems


def config_key(flag: str) -> str | None:
    """The pipeline config key that sets lerobot-train's ``--<flag>`` (None: the pipeline's)."""
    if flag in _SET_BY_PIPELINE:
        return None
    if flag.startswith("dataset."):
        return flag if flag in _DATASET_KEYS else None
    return f"train.{flag}"


def eval_config_key(flag: str) -> str | None:
    """The pipeline config key behind lerobot-eval's ``--<flag>`` in the evaluate rule (None:
    the pipeline's own, such as --policy.path and --output_dir)."""
    if flag.startswith(("env.", "eval.")):
        return flag if flag.startswith("eval.") else f"eval.{flag}"
    return "eval.seed" if flag == "seed" else None


def with_eval_config_keys(message: str) -> str:
    """``message`` and, after it, the ``eval`` config key behind the first lerobot-eval flag it
    names: the one refused (the flags after it are suggestions, "Known: ...")."""
    flags = _FLAG.findall(message)
    key = eval_config_key(flags[0]) if flags else None
    return f"{message} [config: {key}]" if key else message


def with_config_keys(message: str) -> str:
    """``message`` and, after it, the config keys behind the flags (and world size) it names."""
    found = [config_key(flag) for flag in _FLAG.findall(message)]
    if "world size" in message:
        found.append("launch.nproc_per_node x launch.nnodes")
    keys = list(dict.fromkeys(key for key in found if key))
    if not keys:
        return message
    return f"{message} [config: {', '.join(keys)}]"


def policy_fields(config: dict, given: dict, default: dict) -> dict:
    """The run's ``train.policy`` mapping. Snakemake merges the config files of the command line
    (``given``) over the workflow's ``default`` (config/config.yaml) key by key; when ``given``
    names another policy type (``snakemake --configfile config/smolvla.yaml``) the default's
    policy fields belong to its own type, and only the given ones are kept."""
    merged = config.get("train", {}).get("policy", {})
    theirs = given.get("train", {}).get("policy")
    default_type = default.get("train", {}).get("policy", {}).get("type")
    if not isinstance(theirs, dict) or theirs.get("type", default_type) == default_type:
        return merged
    return {key: merged[key] for key in theirs}
