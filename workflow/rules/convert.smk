# One job per complete checkpoint step: a loadable pretrained_model/ in its own tree
# (DCP shards merged into model.safetensors; steps without DCP weights are copied).


rule convert:
    input:
        STEP_FILE,
    output:
        directory(f"{RESULTS}/converted/{{step}}/{PRETRAINED_MODEL_DIR}"),
    log:
        f"{RESULTS}/logs/convert/{{step}}.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        step_dir=lambda wildcards: STEP_DIR.format(step=wildcards.step),
    shell:
        # Written beside the output and renamed: an interrupted job leaves no output.
        # A failure's cause goes to the terminal too (its error lines, else the end of the log).
        """
        rm -rf {output}.tmp
        lerobot-convert-dcp --checkpoint_dir={params.step_dir} \
            --output_dir={output}.tmp >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        mv {output}.tmp {output}
        """
