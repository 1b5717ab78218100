# With eval.env set: one lerobot-eval job per complete checkpoint, from its converted
# pretrained_model/ (a DCP-only checkpoint is converted first), the same seeds for every step;
# then the best checkpoint (a Snakemake checkpoint: publish.steps: best reads it), pinned in the
# training folder so that retention (train.checkpoint_keep_last) never deletes it. With training
# segments each evaluation also updates best.json (and the pin) from the evaluations so far and
# removes the step's `pending` pin; the best job then writes it once more from all of them.


rule evaluate:
    input:
        rules.convert.output[0],
    output:
        f"{EVAL_DIR}/{{step}}/eval_info.json",
    log:
        f"{RESULTS}/logs/evaluate/{{step}}.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        # lerobot-eval's flags, one param per flag (see flag_params), then the step's folders.
        **flag_params(*eval_flags()),
        checkpoint_dir=lambda wildcards: shlex.quote(
            f"--checkpoint_dir={STEP_DIR.format(step=wildcards.step)}"
        ),
        output_dir=lambda wildcards: shlex.quote(
            f"--output_dir={EVAL_DIR}/{wildcards.step}"
        ),
        flow=f"--update_best={BEST} --unpin_pending=true" if SEGMENTED else "",
    shell:
        # lerobot-pipe eval-checkpoint (lerobot_pipe/pipeline/evaluate_job.py) pins the checkpoint
        # while it runs and writes eval_info.json last. A failure's cause goes to the terminal
        # too (its error lines, else the end of the log).
        """
        lerobot-pipe eval-checkpoint {params} --policy.path={input} >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        """


checkpoint best:
    input:
        evaluated_steps,
    output:
        best=BEST,
        # Written by this job alone: with segments the evaluations rewrite best.json as they
        # land, and Snakemake takes a checkpoint whose outputs all exist for done (publish.steps:
        # best would read a best of some evaluations only).
        chosen=f"{RESULTS}/best_checkpoint.json",
    log:
        f"{RESULTS}/logs/best.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        eval_infos=lambda wildcards, input: ",".join(input),
        train_dir=TRAIN_DIR,
    shell:
        """
        lerobot-pipe choose-best --eval_infos={params.eval_infos:q} --output={output.best} \
            --train_dir={params.train_dir} 2>&1 | tee {log}
        cp {output.best} {output.chosen}
        """
