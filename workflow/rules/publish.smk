# One commit at a time to the run's repository, whatever the executor's limits (flock).
COMMIT_LOCK = f"{RESULTS}/published/.commit.lock"


# One job per published step (publish.steps: the final one, all, or the best one evaluation
# chose): the converted pretrained_model/ goes to the Hub repository hub_repo_id, the final
# (with best: the best) step to the main revision, others as intermediate checkpoints. The
# receipt records the commit. The checkpoint is pinned against retention meanwhile.


rule publish:
    input:
        rules.convert.output[0],
    output:
        f"{RESULTS}/published/{{step}}.json",
    log:
        f"{RESULTS}/logs/publish/{{step}}.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    resources:
        # One commit at a time to the repository (a global limit in the profiles).
        hub_commits=1,
    params:
        repo_id=config["hub_repo_id"],
        intermediate=lambda wildcards: str(
            not published_main_step(wildcards.step)
        ).lower(),
        train_dir=TRAIN_DIR,
        private=str(config["publish"]["private"]).lower(),
        endpoint=(
            f"--endpoint={config['hub_endpoint']}" if config["hub_endpoint"] else ""
        ),
        lock=COMMIT_LOCK,
    shell:
        # lerobot-pipe publish writes the receipt atomically, after the commit. A failure's
        # cause goes to the terminal too (its error lines, else the end of the log). flock: one
        # commit at a time also without the profiles' hub_commits limit (plain --cores N).
        """
        pin="--output_dir={params.train_dir} --step={wildcards.step} --reason=publish"
        lerobot-pipe pin $pin
        trap "lerobot-pipe unpin $pin" EXIT
        flock {params.lock} lerobot-pipe publish --pretrained_dir={input} --repo_id={params.repo_id} \
            --step={wildcards.step} --intermediate={params.intermediate} \
            --private={params.private} {params.endpoint} \
            --receipt={output} >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        """


# publish.steps: best while training goes on (segments): after each evaluation, the best so far
# (best.json, which that evaluation updated) goes to the main revision, so the repository follows
# each new best; the same best again makes no commit. The publish job of the final best still
# runs at the end. The receipt names the step it published (best_step).
rule publish_best_so_far:
    input:
        rules.evaluate.output[0],
    output:
        f"{RESULTS}/published/best_so_far/{{step}}.json",
    log:
        f"{RESULTS}/logs/publish/best_so_far/{{step}}.log",
    conda:
        "../../envs/lerobot_pipe.yaml"
    resources:
        hub_commits=1,
    params:
        best=BEST,
        converted_dir=f"{RESULTS}/converted",
        repo_id=config["hub_repo_id"],
        private=str(config["publish"]["private"]).lower(),
        endpoint=(
            f"--endpoint={config['hub_endpoint']}" if config["hub_endpoint"] else ""
        ),
        lock=COMMIT_LOCK,
    shell:
        """
        flock {params.lock} lerobot-pipe publish-best --best={params.best} \
            --converted_dir={params.converted_dir} \
            --repo_id={params.repo_id} --private={params.private} {params.endpoint} \
            --receipt={output} >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        """
