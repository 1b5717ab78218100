# One job per published step (publish.steps: the final one, or all): the converted
# pretrained_model/ goes to the Hub repository hub_repo_id, the final step to the main
# revision, earlier ones as intermediate checkpoints. The receipt records the commit.


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
        intermediate=lambda wildcards: str(not is_final_step(wildcards.step)).lower(),
        private=str(config["publish"]["private"]).lower(),
        endpoint=(
            f"--endpoint={config['hub_endpoint']}" if config["hub_endpoint"] else ""
        ),
    shell:
        # lerobot-pipe publish writes the receipt atomically, after the commit. A failure's
        # cause goes to the terminal too (its error lines, else the end of the log).
        """
        lerobot-pipe publish --pretrained_dir={input} --repo_id={params.repo_id} \
            --step={wildcards.step} --intermediate={params.intermediate} \
            --private={params.private} {params.endpoint} \
            --receipt={output} >{log} 2>&1 || failed=1
        if [ -n "${{failed:-}}" ]; then
            grep -h ERROR {log} >&2 || tail -n 15 {log} >&2
            exit 1
        fi
        """
