"""The test tiers: the fast tier (`make test-fast`, `pytest --tier=fast`) and the rest
(`--tier=rest`); tests/conftest.py applies them, tests/test_fast_tier.py checks them."""

from __future__ import annotations

import pytest

# The fast tier (`make test-fast`): no test that launches torchrun or snakemake end to end (slow),
# runs released LeRobot (interop) or needs a SLURM cluster (slurm). `--tier=rest` is the other
# tests, so that CI runs the whole suite once and still times the fast tier on its own.
FAST_TIER = "not slow and not interop and not slurm"
# Runs last in the fast tier: it reads what the tier's tests imported.
MODULE_CHECK = "test_fast_tier.py::test_every_module_is_imported_by_a_fast_test"
# The longest runs of the unmarked tests (a module, a test, or one case of it), marked slow here
# so that the fast tier stays within 5 minutes on 2 cores (these took ~9.5 of its 14 minutes on
# 2 busy cores, 2026-12): convergence runs and the multi-process parity matrices, whole modules
# where their tests share one expensive fixture. Shorter tests of the same code stay in the tier
# (test_tiny_act_learns_synthetic_task, test_sharded_losses_match_ddp_and_single, the DDP cases).
LEFT_TO_THE_FULL_SUITE = (
    "tests/training/test_learns.py::test_tiny_act_learns_the_task_from_pixels_alone",
    "tests/training/test_learns.py::test_tiny_diffusion_learns_the_camera_task",
    "tests/distributed/test_diffusion_trainer.py",
    "tests/distributed/test_act_cameras.py",
    "tests/distributed/test_fsdp_options.py::test_fsdp_option_matches_ddp",
    "tests/distributed/test_sharded.py::test_resharding_matrix",
    "tests/distributed/test_mixed_precision.py::test_mixed_precision_trains_and_resumes[bf16-fsdp2]",
    "tests/distributed/test_mixed_precision.py::test_mixed_precision_trains_and_resumes[fp16-fsdp2]",
    "tests/training/test_checkpoint_async.py::test_sharded_async_gathers_the_same_bytes",
    "tests/training/test_checkpoint_async.py::test_async_writes_the_same_bytes_and_resumes_the_same[fsdp2]",
    "tests/training/test_trackio.py::test_trackio_logs_metrics_offline",
    "tests/training/test_wandb.py::test_offline_mode_needs_no_network",
    "tests/training/test_resume_exact.py::test_resume_two_to_two_with_randomness_restores_every_rank",
    "tests/faults/test_kill_conversion.py::test_kill_during_conversion[convert:before_replace]",
    "tests/faults/test_kill_conversion.py::test_kill_during_conversion[convert:after_replace]",
    "tests/hub_training/test_train_from_hub.py::test_dataset_repo_push_and_policy_path",
    "tests/security/test_security.py::test_token_appears_in_no_written_file_or_log",
    "tests/workflow/test_workflow_static.py::test_publish_selects_the_configured_steps",
    "tests/workflow/test_workflow_static.py::test_only_complete_checkpoints_are_converted",
)
# Where tests/conftest.py leaves the entries of LEFT_TO_THE_FULL_SUITE that matched no test.
UNMATCHED_LEFT_OUT = pytest.StashKey[list]()
