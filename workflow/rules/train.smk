# torchrun training. A Snakemake checkpoint: the convert jobs are discovered after it,
# from the complete checkpoints it left in TRAIN_DIR (never a declared output, so a
# failed or rerun job cannot delete them). Any change of the train or launch config
# reruns it, and a rerun (after a kill, with more steps, on another topology) resumes
# from the newest complete checkpoint; one that already reached `steps` launches
# nothing and leaves the checkpoints untouched.


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
