# torchrun training. A Snakemake checkpoint: the convert jobs are discovered after it,
# from the complete checkpoints it left in TRAIN_DIR (never a declared output, so a
# failed or rerun job cannot delete them). Any change of the train or launch config
# reruns it, and a rerun (after a kill, with more steps, on another topology) resumes
# from the newest complete checkpoint; one that already reached `steps` finds nothing
# to train and leaves the checkpoints untouched.


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
        flags=train_flags(),
        nproc_per_node=config["launch"]["nproc_per_node"],
        nnodes=config["launch"]["nnodes"],
        world_size=WORLD_SIZE,
        rdzv_port=config["launch"]["rdzv_port"],
        output_dir=TRAIN_DIR,
        last_step_file=LAST_STEP_FILE,
    shell:
        # In a SLURM allocation of more than one process: srun starts one torchrun per
        # node, with c10d rendezvous on the first node. Otherwise a standalone torchrun.
        """
        export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 # threads: sets both to 2 per rank
        resume=$(lerobot-pipe resume-args --output_dir={params.output_dir} 2>{log})
        train=$(which lerobot-train)
        if [ -n "${{SLURM_JOB_ID:-}}" ] && [ {params.world_size} -gt 1 ]; then
            nodes=$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%N)
            head=$(scontrol show hostnames "$nodes" | head -n 1)
            echo "SLURM job $SLURM_JOB_ID: srun + torchrun on $nodes," \
                "rendezvous $head:{params.rdzv_port}" >>{log}
            srun --nodes={params.nnodes} --ntasks={params.nnodes} --ntasks-per-node=1 \
                --cpus-per-task=$(({params.nproc_per_node} * {resources.cpus_per_task})) \
                --kill-on-bad-exit=1 \
                torchrun --nnodes={params.nnodes} \
                --nproc-per-node={params.nproc_per_node} \
                --rdzv-backend=c10d --rdzv-id="$SLURM_JOB_ID" \
                --rdzv-endpoint="$head:{params.rdzv_port}" \
                "$train" $resume {params.flags} >>{log} 2>&1
        else
            echo "torchrun --standalone on $(hostname)" >>{log}
            torchrun --standalone --nproc-per-node={params.nproc_per_node} \
                "$train" $resume {params.flags} >>{log} 2>&1
        fi
        cp {params.last_step_file} {output}.tmp
        mv {output}.tmp {output}
        """
