# lerobot-train's own parsing, resolution and checks, for the topology train launches; the
# memory plan of that topology, refusing a run that cannot fit before anything is queued.


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
        # lerobot-pipe validate's arguments, one param per flag (see flag_params).
        **flag_params(
            f"--nproc_per_node={config['launch']['nproc_per_node']}",
            f"--nnodes={config['launch']['nnodes']}",
            *memory_flags(),
            *train_flags(),
        ),
    shell:
        # With checkpoints present train resumes: validate the resumed config, as train
        # will run it. Messages go to the console too: they explain a bad config.
        """
        resume=$(lerobot-pipe resume-args {params.output_dir} 2>{log})
        lerobot-pipe validate --write_resolved={output} $resume {params} 2>&1 | tee -a {log}
        """
