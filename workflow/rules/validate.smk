# lerobot-train's own parsing, resolution and checks, for the topology train launches.


rule validate:
    input:
        dataset_input,
    output:
        f"{RESULTS}/resolved_train_config.json",
    log:
        f"{RESULTS}/logs/validate.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        flags=train_flags(),
        nproc_per_node=config["launch"]["nproc_per_node"],
        nnodes=config["launch"]["nnodes"],
        output_dir=TRAIN_DIR,
    shell:
        # With checkpoints present train resumes: validate the resumed config, as train
        # will run it. Messages go to the console too: they explain a bad config.
        """
        resume=$(lerobot-pipe resume-args --output_dir={params.output_dir} 2>{log})
        lerobot-pipe validate \
            --nproc_per_node={params.nproc_per_node} --nnodes={params.nnodes} \
            --write_resolved={output} $resume {params.flags} 2>&1 | tee -a {log}
        """
