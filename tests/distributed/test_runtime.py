"""run_on_main: rank 0 runs, every rank gets the same outcome (as publishing uses it)."""

import os
from pathlib import Path

import pytest
from launch import run_distributed

from lerobot_pipe.distributed.runtime import run_on_main
from lerobot_pipe.hub import PublishError
from lerobot_pipe.utils.hub_http import redacted


def publish_from_main_process(fn, *args, **kwargs):
    return run_on_main(
        fn, *args, error_type=PublishError, describe=redacted, what="publishing", **kwargs
    )


def _ok(marker_dir: str, value: int) -> dict:
    Path(marker_dir, f"ok-{os.getpid()}").write_text("")
    return {"value": value}


def _fail(marker_dir: str) -> None:
    Path(marker_dir, f"fail-{os.getpid()}").write_text("")
    raise PublishError("no write access to model repo alice/x (403)")


def _crash() -> None:
    raise ValueError("disk full")


def _rank_fn(tmp: str) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        out: dict = {"rank": dist.get_rank(), "ok": publish_from_main_process(_ok, tmp, value=7)}
        for name, fn, args in (("error", _fail, (tmp,)), ("crash", _crash, ())):
            try:
                publish_from_main_process(fn, *args)
            except Exception as err:
                out[name] = [type(err).__name__, str(err)]
        return out
    finally:
        dist.destroy_process_group()


def test_without_process_group_just_calls(tmp_path):
    assert publish_from_main_process(_ok, str(tmp_path), value=3) == {"value": 3}
    with pytest.raises(PublishError, match="403"):
        publish_from_main_process(_fail, str(tmp_path))


def test_two_ranks_share_result_and_error(tmp_path):
    pytest.importorskip("torch.distributed")
    rank0, rank1 = run_distributed(_rank_fn, 2, str(tmp_path), timeout=120)
    assert (rank0["rank"], rank1["rank"]) == (0, 1)
    for result in (rank0, rank1):
        assert result["ok"] == {"value": 7}
        assert result["error"] == ["PublishError", "no write access to model repo alice/x (403)"]
    # Rank 0 re-raises the original exception, the others a PublishError saying what happened.
    assert rank0["crash"] == ["ValueError", "disk full"]
    assert rank1["crash"] == ["PublishError", "publishing failed on rank 0: ValueError: disk full"]
    # fn ran on rank 0 only.
    assert len(list(tmp_path.glob("ok-*"))) == len(list(tmp_path.glob("fail-*"))) == 1
