"""Checkpoints: what is written, in what order, what makes one complete, and how a run resumes.

The contract, relied on by resume, conversion and the pipeline:

1. Saving is a collective (:class:`~lerobot_pipe.checkpoint.manager.CheckpointManager`, in the
   training loop or in the background). DCP shards are written by every rank; single files
   (safetensors, JSON) only by the main process. Each rank fsyncs and hashes what it wrote.
2. Everything is written into ``checkpoints/.tmp-<step>/``; ``training_state/training_step.json``
   is written last inside it (itself via a temporary file and an atomic rename), once every
   rank's files are durable; then the folder is renamed to ``checkpoints/<step>/``.
3. A checkpoint is complete iff ``<step>/training_state/training_step.json`` exists. Nothing
   else ever looks at an incomplete one; ``.tmp-*`` leftovers of a killed save are removed when
   the next run starts. training_step.json carries the size and SHA-256 of every other file of
   the checkpoint (``"files"``), so a truncated, bit-flipped or missing file is found before a
   resume uses it (each rank checks a share); automatic resume then falls back to the newest
   checkpoint that verifies (:mod:`~lerobot_pipe.checkpoint.resume`, the one place that decides).
4. ``checkpoints/last`` is a relative symlink, replaced atomically and only ever pointing at a
   complete checkpoint. Retention deletes a checkpoint only after a newer one is complete, never
   the one ``last`` points to.

No pickle is ever loaded: tensors go through safetensors, everything else through JSON; the
exceptions are DCP's own ``.metadata``, read only from this run's own output, and LeRobot main's
``training_state/ema_state.pt`` when resuming one of its runs with ``--ema.enable=true``, read
with ``torch.load(weights_only=True)`` (tensors and plain containers only). The EMA shadow of
our own runs is ``pretrained_model_ema/``'s weights (safetensors or DCP).

Modules (torch-free ones can be imported by the Snakefile, the launcher and the CLI cheaply):

- :mod:`.layout` (torch-free): names, listing, completeness, temporaries, the atomic rename,
  ``last``, retention.
- :mod:`.manifest` (torch-free): file hashing, the shares of the split verification.
- :mod:`.resume` (torch-free before the process group): the one resume resolver.
- :mod:`.lerobot_state`: LeRobot's optimizer, RNG and scaler layouts.
- :mod:`.stateful`: the ``Stateful`` parts of a run (:class:`~.stateful.TrainState`).
- :mod:`.pretrained`: the ``pretrained_model/`` writer.
- :mod:`.gather`: full tensors from shards, over any process group.
- :mod:`.writer`: one save, in the loop or in the background (async), the same bytes either way.
- :mod:`.loader`: restoring a :class:`~.stateful.TrainState` on any topology.
- :mod:`.manager`: :class:`~.manager.CheckpointManager`, what the training loop calls.
"""
