# Figures and tables for `snakemake --report report.html`.


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
        train_dir=TRAIN_DIR,
        metrics=METRICS,
        run=RUN,
    script:
        "../scripts/checkpoint_table.py"
