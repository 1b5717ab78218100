# torchrun training. `train` is a Snakemake checkpoint: the conversions of checkpoints that no
# rule names in advance are discovered after it, from the complete checkpoints in TRAIN_DIR
# (never a declared output, so a failed or rerun job cannot delete them). Any change of the
# train or launch config reruns it, and a rerun (after a kill, with more steps, on another
# topology) resumes from the newest complete checkpoint; one that already reached its end
# launches nothing and leaves the checkpoints untouched.
#
# With segments (launch.segment_steps, by default every train.save_freq steps) training runs as
# train_segment jobs, one per segment end k, each resuming where the one before stopped and
# stopping at step k (--stop_after_step; the schedule follows train.steps). Each writes a small
# receipt (segments/<k>.json) that the conversion of checkpoint k waits for, so conversion,
# evaluation and publishing of k run while segment k+1 trains; `train` then only records the
# final checkpoint. docs/design.md, "Checkpoints that flow".
def train_resources():
    """sbatch resources of the train job; local runs use only threads."""
    slurm = config["slurm"]
    resources = {
        "nodes": config["launch"]["nnodes"],
        "tasks": WORLD_SIZE,
        # One task per training process, spread evenly over the nodes.
        "slurm_extra": f"--ntasks-per-node={config['launch']['nproc_per_node']}",
        "cpus_per_task": slurm["cpus_per_task"],
        "mem_mb": slurm["mem_mb"],
        "runtime": slurm["runtime"],
    }
    if WORLD_SIZE > 1:
        # The shell then runs in the batch step and starts one torchrun per node itself.
        resources["mpi"] = "srun"
    if slurm["gpus_per_node"]:
        resources["gres"] = f"gpu:{slurm['gpus_per_node']}"
        # Else the plugin passes --ntasks-per-gpu=<tasks>; no per-GPU task binding is
        # wanted: each node's torchrun gives its ranks the node's GPUs itself.
        resources["tasks_per_gpu"] = 0
    for key in ("partition", "account"):
        if slurm[key]:
            resources[f"slurm_{key}"] = slurm[key]
    return resources


def without_steps(flags):
    """A segment's flags: --steps, which grows with a longer run, is read from validate's
    resolved config instead (launch-train --steps_from), so a finished segment's params stay."""
    return [flag for flag in flags if not flag.startswith("--steps=")]


def previous_segment(wildcards):
    """The receipt of the segment before (resume from its checkpoint); none for the first."""
    ends = [step_name(end) for end in segment_ends()]
    at = ends.index(wildcards.step)
    return SEGMENT.format(step=ends[at - 1]) if at else []


if SEGMENTED:

    rule train_segment:
        input:
            # ancient: a new validate (train.steps grown) does not rerun finished segments.
            dataset=ancient(dataset_input),
            resolved=ancient(rules.validate.output[0]),
            previous=ancient(previous_segment),
        output:
            SEGMENT,
        log:
            f"{RESULTS}/logs/train/{{step}}.log",
        conda:
            "../../envs/lerobot_pipe.yaml"
        threads: config["launch"]["nproc_per_node"]
        resources:
            **train_resources(),
        # Training first: a free core goes to the next segment before a conversion.
        priority: 10
        params:
            # lerobot-pipe launch-train's arguments, one param per flag (see flag_params).
            **flag_params(
                f"--nproc_per_node={config['launch']['nproc_per_node']}",
                f"--nnodes={config['launch']['nnodes']}",
                f"--rdzv_port={config['launch']['rdzv_port']}",
                *without_steps(train_flags()),
            ),
            stop_after_step=lambda wildcards: f"--stop_after_step={int(wildcards.step)}",
        shell:
            # As the unbroken train job below; launch-train pins the checkpoints it will save
            # (reason pending) until they are evaluated, and writes the receipt {output} last.
            """
            export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 # threads: sets both to 2 per rank
            exec lerobot-pipe launch-train --cpus_per_task={resources.cpus_per_task} \
                --log={log} --history=%s --steps_from={input.resolved} \
                --receipt={output} --pin_pending=true {params}
            """ % TRAIN_HISTORY

    checkpoint train:
        input:
            SEGMENT.format(step=step_name(TOTAL_STEPS)),
        output:
            f"{RESULTS}/final_checkpoint.json",
        log:
            f"{RESULTS}/logs/train.log",
        conda:
            "../../envs/lerobot_pipe.yaml"
        params:
            history=TRAIN_HISTORY,
        shell:
            # The last segment's checkpoint record; the log links to the run's whole log.
            """
            lerobot-pipe final-checkpoint --receipt={input} --output={output} \
                --log={log} --history={params.history}
            """

else:
    checkpoint train:
        input:
            dataset_input,
            rules.validate.output[0],
        output:
            f"{RESULTS}/final_checkpoint.json",
        log:
            f"{RESULTS}/logs/train.log",
        conda:
            "../../envs/lerobot_pipe.yaml"
        threads: config["launch"]["nproc_per_node"]
        resources:
            **train_resources(),
        params:
            # lerobot-pipe launch-train's arguments, one param per flag (see flag_params).
            **flag_params(
                f"--nproc_per_node={config['launch']['nproc_per_node']}",
                f"--nnodes={config['launch']['nnodes']}",
                f"--rdzv_port={config['launch']['rdzv_port']}",
                *train_flags(),
            ),
        shell:
            # lerobot-pipe launch-train (lerobot_pipe/pipeline/train_job.py) replaces this shell, so
            # that it is snakemake's own child: it stops while another trainer holds the run,
            # launches nothing when the checkpoints already reach `steps`, starts torchrun (srun +
            # torchrun in a SLURM allocation of several processes), shows progress here, keeps the
            # whole log in {log}, and stops training when snakemake is gone.
            """
            export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 # threads: sets both to 2 per rank
            exec lerobot-pipe launch-train --cpus_per_task={resources.cpus_per_task} \
                --log={log} --final_checkpoint={output} {params}
            """
