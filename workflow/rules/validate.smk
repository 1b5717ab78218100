# lerobot-train's own parsing, resolution and checks, for the topology train launches; the
# memory plan of that topology, refusing a run that cannot fit before anything is queued. With
# training segments: `train_flags` holds the flags validate checked, one a line, --steps and the
# memory plan's flags left out; each segment launches with them (an ancient input: a validate
# run again reruns no finished segment, whatever changed), and the train job waits for the
# marker `validated`, so that a validate run again reruns it and Snakemake finds the segments
# still to train.


rule validate:
    input:
        dataset_input,
    output:
        resolved=f"{RESULTS}/resolved_train_config.json",
        valid=f"{RESULTS}/validated",
        flags=f"{RESULTS}/train_flags",
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
        lerobot-pipe validate --write_resolved={output.resolved} $resume {params} 2>&1 | tee -a {log}
        printf '%s\n' {params} | grep -v -e '^--steps=' -e '^--mem_mb=' -e '^--gpus_per_node=' -e '^--gpu_memory_gb=' >{output.flags}
        echo valid >{output.valid}
        """
