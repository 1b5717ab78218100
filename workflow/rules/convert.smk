# One job per complete checkpoint step: a loadable pretrained_model/ in its own tree
# (DCP shards merged into model.safetensors; steps without DCP weights are copied), and beside
# it the EMA policy pretrained_model_ema/ when the run kept one (train.ema.enable). With
# training segments it waits for the receipt of the segment that saves the step (so it runs while
# the next segment trains); without evaluation it then removes the step's `pending` pin.


rule convert:
    input:
        convert_input,
    output:
        directory(f"{RESULTS}/converted/{{step}}/{PRETRAINED_MODEL_DIR}"),
    log:
        f"{RESULTS}/logs/convert/{{step}}.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        step_dir=lambda wildcards: STEP_DIR.format(step=wildcards.step),
        ema_dir=lambda wildcards: (
            f"{RESULTS}/converted/{wildcards.step}/{PRETRAINED_MODEL_EMA_DIR}"
        ),
        unpin=unpin_pending,
    shell:
        # Written beside the output and renamed: an interrupted job leaves no output.
        # A failure's cause goes to the terminal too (its error lines, else the end of the log).
        """
        rm -rf {output}.tmp {params.ema_dir}.tmp
        lerobot-pipe convert-dcp --checkpoint_dir={params.step_dir} \
            --output_dir={output}.tmp --ema_output_dir={params.ema_dir}.tmp >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        if [ -d {params.ema_dir}.tmp ]; then
            rm -rf {params.ema_dir}
            mv {params.ema_dir}.tmp {params.ema_dir}
        fi
        mv {output}.tmp {output}
        {params.unpin}
        """
