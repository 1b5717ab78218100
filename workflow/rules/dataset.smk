# The embedded synthetic LeRobot v3.0 dataset, used when the config names no dataset.


rule dataset:
    output:
        directory(SYNTHETIC_DATASET),
    log:
        f"{RESULTS}/logs/dataset.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        synthetic=config["dataset"]["synthetic"],
        cameras=",".join(config["dataset"]["synthetic"]["cameras"]),
        pixels_only=str(config["dataset"]["synthetic"]["pixels_only"]).lower(),
    shell:
        # Written beside the output and renamed: an interrupted job leaves no output.
        """
        rm -rf {output}.tmp
        lerobot-pipe make-dataset --root={output}.tmp \
            --num_episodes={params.synthetic[num_episodes]} \
            --episode_length={params.synthetic[episode_length]} \
            --seed={params.synthetic[seed]} --cameras={params.cameras:q} \
            --image_size={params.synthetic[image_size]} \
            --pixels_only={params.pixels_only} >{log} 2>&1
        mv {output}.tmp {output}
        """
