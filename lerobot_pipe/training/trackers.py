"""Where the logged metrics go: ``metrics.jsonl`` in the output folder, and trackio and Weights &
Biases when enabled. Main process only (the records are already reduced across ranks).

W&B follows LeRobot 0.6.1's ``WandBLogger``: the run lives in ``<output_dir>/wandb/``, named
``--job_name``, tagged ``policy:<type>``, ``seed:<seed>``, ``dataset:<repo_id>``, job type
``train_eval``; metrics are logged as ``train/<name>`` or ``eval/<name>`` at the training step;
each checkpoint's model files become a ``model`` artifact named
``policy_<type>-seed_<seed>-dataset_<repo>-<step>``. A resumed run continues the W&B run it
started: ``--wandb.run_id``, else the id of ``<output_dir>/wandb/latest-run`` (LeRobot's rule,
so either trainer continues the other's run). Torch-free.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import re
from collections.abc import Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from lerobot_pipe import constants as C
from lerobot_pipe.configs.checkpoint_format import CheckpointFormat
from lerobot_pipe.configs.parser import to_dict

if TYPE_CHECKING:
    from lerobot_pipe.configs.train import TrainConfig, WandBConfig

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")
_LEGACY_MODES = {"dryrun": "offline", "run": "online"}  # older WANDB_MODE values W&B still takes
_TAG_MAX = 64  # W&B refuses longer tags
MODES = ("train", "eval")


class TrackerError(RuntimeError):
    """A tracker could not start its run (a W&B login the server refused, ...): a user error,
    printed as one line."""


def wandb_mode(cfg: WandBConfig, env: Mapping[str, str] = os.environ) -> str:
    """The mode the run logs in: ``--wandb.mode``, else ``$WANDB_MODE`` (W&B's own variable),
    else online. (LeRobot 0.6.1 takes an unset mode as online and ignores ``$WANDB_MODE``.)"""
    mode = cfg.mode or env.get("WANDB_MODE") or "online"
    return _LEGACY_MODES.get(mode, mode) if cfg.mode is None else mode


def _has_wandb_credentials(env: Mapping[str, str]) -> bool:
    """A W&B API key or identity token is configured (no request is made): ``WANDB_API_KEY``,
    ``WANDB_IDENTITY_TOKEN_FILE``, or the host's entry in the netrc file ``wandb login`` writes."""
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = Path(env["NETRC"]).expanduser() if env.get("NETRC") else Path("~/.netrc").expanduser()
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_problem(cfg: WandBConfig, env: Mapping[str, str] = os.environ) -> str | None:
    """Why ``--wandb.*`` cannot log, checked before launch (None: it can), with what to do."""
    if not cfg.enable:
        return None
    if cfg.mode is not None and cfg.mode not in WANDB_MODES:
        return f"--wandb.mode={cfg.mode!r}: choose one of {', '.join(WANDB_MODES)}"
    if not cfg.project:
        return "--wandb.enable=true needs --wandb.project (default: lerobot)"
    if find_spec("wandb") is None:
        return "--wandb.enable=true needs the wandb package: pip install 'lerobot_pipe[wandb]'"
    mode = wandb_mode(cfg, env)
    if mode not in WANDB_MODES:
        return f"WANDB_MODE={mode!r}: choose one of {', '.join(WANDB_MODES)}"
    if mode == "online" and not _has_wandb_credentials(env):
        return (
            "--wandb.enable=true logs online but no W&B API key is configured: set "
            "WANDB_API_KEY or run `wandb login`, or pass --wandb.mode=offline (then "
            "`wandb sync <output_dir>/wandb/offline-run-*`)"
        )
    return None


def wandb_tags(cfg: TrainConfig) -> list[str]:
    """LeRobot's run tags (cfg_to_group): the policy type, the seed and the dataset (its repo
    id; the folder name for a local-only dataset), each cut to W&B's 64 characters."""
    dataset = cfg.dataset.repo_id or Path(cfg.dataset.root or "").name
    tags = [f"policy:{cfg.policy.type}", f"seed:{cfg.seed}", f"dataset:{dataset}"]
    return [tag[:_TAG_MAX] for tag in tags]


def artifact_name(cfg: TrainConfig, step_dir: Path) -> str:
    """LeRobot's checkpoint artifact name: the tags joined by '-', then the step folder's name,
    with ':' and '/' (which W&B refuses) as '_'."""
    dataset = cfg.dataset.repo_id or Path(cfg.dataset.root or "").name
    group = f"policy:{cfg.policy.type}-seed:{cfg.seed}-dataset:{dataset}"
    return re.sub(r"[:/]", "_", f"{group}-{step_dir.name}")


def saved_run_id(output_dir: Path) -> str | None:
    """The id of the W&B run in ``<output_dir>/wandb/latest-run`` (online ``run-<date>-<id>``
    or offline ``offline-run-<date>-<id>``, holding ``run-<id>.wandb``), if any."""
    files = list((output_dir / C.WANDB_DIR / C.WANDB_LATEST_RUN).glob("run-*.wandb"))
    if len(files) != 1:
        return None
    match = re.fullmatch(r"run-([^.]+)\.wandb", files[0].name)
    return match.group(1) if match else None


def model_files(pretrained: Path) -> list[Path]:
    """What a checkpoint's artifact holds (LeRobot's choice): LoRA's adapter files with the
    policy's config.json, else ``model.safetensors``. A DCP-only checkpoint has neither: none."""
    adapter = pretrained / C.ADAPTER_SAFETENSORS
    if adapter.exists():
        extra = [pretrained / C.ADAPTER_CONFIG_NAME, pretrained / C.CONFIG_NAME]
        return [adapter, *(p for p in extra if p.exists())]
    model = pretrained / C.MODEL_SAFETENSORS
    return [model] if model.exists() else []


class WandBLogger:
    """One W&B run of a training run (main process)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        resuming: bool,
        num_frames: int,
        num_episodes: int,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        os.environ.setdefault("WANDB_SILENT", "True")  # as LeRobot
        import wandb

        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self._frames = max(num_frames, 1)
        self._frames_per_episode = max(num_frames, 1) / max(num_episodes, 1)
        run_id = cfg.wandb.run_id or (saved_run_id(self.output_dir) if resuming else None)
        if resuming and run_id is None:
            log.warning(
                "--wandb.enable=true on a resumed run whose folder holds no W&B run "
                "(%s/latest-run) and no --wandb.run_id: logging to a new W&B run",
                self.output_dir / C.WANDB_DIR,
            )
        self._wandb = wandb
        mode = wandb_mode(cfg.wandb, env)
        try:
            self.run = wandb.init(
                id=run_id,
                project=cfg.wandb.project,
                entity=cfg.wandb.entity,
                name=cfg.job_name,
                notes=cfg.wandb.notes,
                tags=wandb_tags(cfg) if cfg.wandb.add_tags else None,
                dir=str(self.output_dir),
                config=to_dict(cfg),
                save_code=False,
                job_type="train_eval",
                # "allow": the run continues when the server has it, and starts under the same
                # id when it does not (an offline run, or one that never synced).
                resume="allow" if run_id else None,
                mode=mode,
            )
        except Exception as e:  # noqa: BLE001 - wandb's errors (login, network) as one line
            message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            hint = (
                "; check WANDB_API_KEY or `wandb login`, or pass --wandb.mode=offline"
                if mode == "online"
                else ""
            )
            raise TrackerError(f"W&B could not start its run ({mode}): {message}{hint}") from e
        self.run_id = self.run.id
        self._artifacts = not cfg.wandb.disable_artifact
        log.info("W&B run %s (%s): %s", self.run_id, self.run.settings.mode, self._url())

    def _url(self) -> str:
        try:
            return self.run.get_url() or str(self.output_dir / C.WANDB_DIR)
        except Exception:  # noqa: BLE001 - offline runs have no URL
            return str(self.output_dir / C.WANDB_DIR)

    def log(self, record: Mapping[str, Any], mode: str = "train") -> None:
        """``record`` (with its ``step``) as ``<mode>/<key>``; a train record also carries
        LeRobot's ``steps``, ``samples``, ``episodes`` and ``epochs``."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        step = int(record["step"])
        values = {k: v for k, v in record.items() if k not in ("step", "epoch", "samples")}
        if mode == "train" and "samples" in record:
            samples = record["samples"]
            values |= {
                "steps": step,
                "samples": samples,
                "episodes": samples / self._frames_per_episode,
                "epochs": samples / self._frames,
            }
        data = {
            f"{mode}/{k}": v
            for k, v in values.items()
            if isinstance(v, int | float | str) and not isinstance(v, bool)
        }
        if data:
            self.run.log(data, step=step)

    def log_checkpoint(self, step_dir: Path) -> None:
        """The checkpoint's model files as a ``model`` artifact (unless disabled). The files are
        copied into W&B's staging area now, so retention may delete the folder afterwards."""
        if not self._artifacts:
            return
        files = model_files(step_dir / C.PRETRAINED_MODEL_DIR)
        if not files:
            # --checkpoint_format=dcp: the weights are DCP shards only (LeRobot, finding no
            # model.safetensors, logs none either). Said once.
            log.warning(
                "%s holds no model.safetensors: no W&B model artifact is logged for it%s",
                step_dir,
                " or later checkpoints (--checkpoint_format=safetensors_dcp writes both; "
                "--wandb.disable_artifact=true silences this)"
                if self.cfg.checkpoint_format is CheckpointFormat.DCP
                else "",
            )
            self._artifacts = self.cfg.checkpoint_format is not CheckpointFormat.DCP
            return
        artifact = self._wandb.Artifact(artifact_name(self.cfg, step_dir), type="model")
        for path in files:
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        self.run.finish()


class MetricsLog:
    """metrics.jsonl in the output dir (main rank), plus trackio and W&B when enabled.

    :meth:`log` takes a train record (``step`` and the reduced metrics) or, with
    ``mode="eval"``, an evaluation record (e.g. ``{"step", "eval_loss", "eval_samples"}``: a
    record of its own in metrics.jsonl, told apart by having no ``loss``; sent to the trackers
    as ``eval/<key>``); :meth:`checkpoint` each checkpoint once it is durable."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        start_step: int,
        is_main: bool,
        num_frames: int = 1,
        num_episodes: int = 1,
        resumed_from: Path | None = None,
    ) -> None:
        self.path = Path(cfg.output_dir) / C.METRICS_LOG
        self.enabled = is_main
        self.trackio = None
        self.wandb: WandBLogger | None = None
        # The checkpoint resumed from was logged by the run that wrote it.
        self._logged: set[Path] = {resumed_from} if resumed_from is not None else set()
        if not is_main:
            return
        if self.path.exists():  # drop lines beyond the resumed step so the curve stays one run
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln and json.loads(ln)["step"] <= start_step
            ]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        if cfg.trackio.enable:
            import trackio

            self.trackio = trackio
            trackio.init(
                project=cfg.trackio.project,
                name=cfg.trackio.run_name or cfg.job_name,
                config=to_dict(cfg),
                resume="allow",
            )
        if cfg.wandb.enable:
            self.wandb = WandBLogger(
                cfg, resuming=start_step > 0, num_frames=num_frames, num_episodes=num_episodes
            )

    def log(self, record: dict, mode: str = "train") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.trackio is not None:
            prefix = "" if mode == "train" else f"{mode}/"
            self.trackio.log(
                {f"{prefix}{k}": v for k, v in record.items() if k != "step"}, step=record["step"]
            )
        if self.wandb is not None:
            self.wandb.log(record, mode)

    def checkpoint(self, step_dir: Path | None) -> None:
        """A durable checkpoint (each logged once; None: nothing new)."""
        if not self.enabled or step_dir is None or step_dir in self._logged:
            return
        self._logged.add(step_dir)
        if self.wandb is not None:
            self.wandb.log_checkpoint(step_dir)

    def close(self) -> None:
        if self.trackio is not None:
            self.trackio.finish()
        if self.wandb is not None:
            self.wandb.finish()
