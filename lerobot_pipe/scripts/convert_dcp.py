"""``lerobot-convert-dcp``: merge a step's model DCP shards into safetensors, offline.

    lerobot-convert-dcp --checkpoint_dir=outputs/train/act/checkpoints/005000
    lerobot-convert-dcp --checkpoint_dir=.../005000/pretrained_model --output_dir=exported/005000
    lerobot-convert-dcp --checkpoint_dir=.../last --delete_dcp=true --push_to_hub=me/act_policy

A bad flag exits with status 2, a failed conversion or push with 1, Ctrl-C with 130; each with
a one-line reason.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from lerobot_pipe.configs.parser import required
from lerobot_pipe.scripts.help import command_help, parse_command
from lerobot_pipe.scripts.logs import report_error, run_reported

PROG = "lerobot-convert-dcp"

log = logging.getLogger("lerobot_pipe.convert")


@dataclass
class ConvertOptions:
    """Write model.safetensors (adapter_model.safetensors for a PEFT run) next to the DCP folder
    pytorch_model_fsdp_0/, or a complete pretrained-model folder into --output_dir. No GPU and
    no process group are needed; only the model's DCP folder is read. Running it again is a
    no-op. The output appears atomically (temporary file + rename); it is fsynced only with
    --delete_dcp, before the shards go (otherwise the shards stay the source, and a file damaged
    by a power cut is found and rewritten by the next run).

    SECURITY: DCP's .metadata is a Python pickle (loading it can run code), so --checkpoint_dir
    must be a LOCAL folder written by your own run. URLs and Hub repo ids are refused."""

    # LOCAL step folder (checkpoints/005000, checkpoints/last) or its pretrained_model/; never a
    # URL or Hub id: DCP metadata is a pickle
    checkpoint_dir: str = required()
    # write a complete pretrained-model folder here (configs and processors copied); default:
    # write the weights into the source pretrained_model/
    output_dir: str | None = None
    # delete pytorch_model_fsdp_0/ after the written file was read back, compared tensor by
    # tensor with the shards and fsynced
    delete_dcp: bool = False
    # with --ema.enable=true runs: the EMA policy folder's output (default: pretrained_model_ema/
    # beside an --output_dir named pretrained_model, else <output_dir>_ema)
    ema_output_dir: str | None = None
    # after converting, publish the folder to this Hub repo id (an EMA policy to <repo id>-ema)
    push_to_hub: str | None = None
    private: bool = False  # create the Hub repo as private


def _converted_ema_policy(options: ConvertOptions) -> Path | None:
    """The converted EMA policy folder of this conversion, when the checkpoint has one."""
    from lerobot_pipe.convert.dcp_to_safetensors import ema_output_folder
    from lerobot_pipe.utils.locate import ema_policy_dir, pretrained_dir

    source = ema_policy_dir(pretrained_dir(options.checkpoint_dir))
    if source is None:
        return None
    return ema_output_folder(options.output_dir, options.ema_output_dir) or source


def usage() -> str:
    return command_help(f"{PROG} --checkpoint_dir=DIR [--flag=value ...]", ConvertOptions)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options, status = parse_command(PROG, ConvertOptions, argv, usage)
    if options is None:
        return status
    if options.push_to_hub:  # a bad repo id fails before anything is converted
        from lerobot_pipe.hub.publish import PublishError, validate_repo_id

        try:
            validate_repo_id(options.push_to_hub)
        except PublishError as e:
            report_error(PROG, f"--push_to_hub: {e}")
            return 2
    from lerobot_pipe.convert.dcp_to_safetensors import ConversionError, convert_checkpoint

    status, weights = run_reported(
        PROG,
        "conversion",
        lambda: convert_checkpoint(
            options.checkpoint_dir,
            output_dir=options.output_dir,
            delete_dcp=options.delete_dcp,
            ema_output_dir=options.ema_output_dir,
        ),
        expected=(ConversionError,),
        expected_status=1,
        interrupted="interrupted; nothing was deleted",
    )
    if status:
        return status
    print(weights)

    if options.push_to_hub:
        folder = weights.parent  # the (output or source) pretrained-model folder
        try:
            from lerobot_pipe.hub.publish import PublishError, publish_folder
        except ImportError as e:
            report_error(PROG, f"cannot push to the Hub: {e}")
            return 1
        try:
            receipt = publish_folder(folder, options.push_to_hub, private=options.private)
        except PublishError as e:
            report_error(PROG, f"push to {options.push_to_hub} failed: {e}")
            return 1
        log.info("Pushed %s to %s (commit %s)", folder, receipt.repo_id, receipt.commit_id)
        ema = _converted_ema_policy(options)
        if ema is not None:  # --ema.enable=true runs: the EMA policy to <repo_id>-ema
            from lerobot_pipe.hub.publish import ema_repo_id

            ema_repo = ema_repo_id(options.push_to_hub)
            try:
                receipt = publish_folder(ema, ema_repo, private=options.private)
            except PublishError as e:
                report_error(PROG, f"push to {ema_repo} failed: {e}")
                return 1
            log.info("Pushed %s to %s (commit %s)", ema, receipt.repo_id, receipt.commit_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
