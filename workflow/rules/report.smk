# Figures and tables for `snakemake --report report.html`: those of the finished run (plot_training,
# plot_eval, checkpoint_table: rule all's), and the same from what exists now (the *_now rules,
# no inputs, so they never wait for or start another job): `lerobot-pipe report` (make report)
# writes the report from them while the run goes on, or after it failed.


rule plot_training:
    input:
        rules.train.output[0],
    output:
        loss=report(
            f"{RESULTS}/report/loss.svg",
            caption="../report/loss.rst",
            category="Training",
            subcategory=RUN,
            labels={"run": RUN, "figure": "loss"},
        ),
        throughput=report(
            f"{RESULTS}/report/throughput.svg",
            caption="../report/throughput.rst",
            category="Training",
            subcategory=RUN,
            labels={"run": RUN, "figure": "throughput"},
        ),
    log:
        f"{RESULTS}/logs/plot_training.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        # lerobot-train appends to it at every logging step, beside the checkpoints.
        metrics=METRICS,
        run=RUN,
    script:
        "../scripts/plot_training.py"


rule plot_eval:
    input:
        evaluated=evaluated_steps,
        best=BEST,
    output:
        report(
            f"{RESULTS}/report/eval.svg",
            caption="../report/eval.rst",
            category="Evaluation",
            subcategory=RUN,
            labels={"run": RUN, "figure": "eval"},
        ),
    log:
        f"{RESULTS}/logs/plot_eval.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        evaluated=lambda wildcards, input: list(input.evaluated),
        best=lambda wildcards, input: input.best,
        run=RUN,
        env=config["eval"]["env"],
    script:
        "../scripts/plot_eval.py"


rule checkpoint_table:
    input:
        converted=converted_steps,
        published=published_steps if PUBLISHING else [],
        evaluated=evaluated_steps if EVALUATING else [],
        best=BEST if EVALUATING else [],
    output:
        report(
            f"{RESULTS}/report/checkpoints.html",
            caption="../report/checkpoints.rst",
            category="Checkpoints",
            subcategory=RUN,
            labels={"run": RUN, "table": "checkpoints"},
        ),
    log:
        f"{RESULTS}/logs/checkpoint_table.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    params:
        converted=lambda wildcards, input: list(input.converted),
        published=lambda wildcards, input: list(input.published),
        evaluated=lambda wildcards, input: list(input.evaluated),
        best=lambda wildcards, input: input.best or None,
        evaluating=EVALUATING,
        train_dir=TRAIN_DIR,
        metrics=METRICS,
        run=RUN,
    script:
        "../scripts/checkpoint_table.py"


# The same figures and table from what exists when the job runs (now_report: their paths).


use rule plot_training as plot_training_now with:
    input:
        [],
    output:
        loss=now_report(
            "loss.svg", "../report/loss.rst", "Training", {"figure": "loss"}
        ),
        throughput=now_report(
            "throughput.svg",
            "../report/throughput.rst",
            "Training",
            {"figure": "throughput"},
        ),
    log:
        f"{RESULTS}/logs/plot_training_now.log",


use rule plot_eval as plot_eval_now with:
    input:
        [],
    output:
        now_report("eval.svg", "../report/eval.rst", "Evaluation", {"figure": "eval"}),
    log:
        f"{RESULTS}/logs/plot_eval_now.log",
    params:
        evaluated=evaluations_now,
        best=best_now,
        run=RUN,
        env=config["eval"]["env"],


use rule checkpoint_table as checkpoint_table_now with:
    input:
        [],
    output:
        now_report(
            "checkpoints.html",
            "../report/checkpoints.rst",
            "Checkpoints",
            {"table": "checkpoints"},
        ),
    log:
        f"{RESULTS}/logs/checkpoint_table_now.log",
    params:
        converted=lambda wildcards: existing(
            f"{RESULTS}/converted/*/{PRETRAINED_MODEL_DIR}"
        ),
        published=lambda wildcards: existing(f"{RESULTS}/published/*.json"),
        evaluated=evaluations_now,
        best=best_now,
        evaluating=EVALUATING,
        train_dir=TRAIN_DIR,
        metrics=METRICS,
        run=RUN,


rule report_now:
    input:
        rules.plot_training_now.output,
        rules.plot_eval_now.output if EVALUATING else [],
        rules.checkpoint_table_now.output,
