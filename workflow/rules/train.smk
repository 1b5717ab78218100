# torchrun training. `train` is a Snakemake checkpoint: the conversions of checkpoints that no
# rule names in advance are discovered after it, from the complete checkpoints in TRAIN_DIR
# (never a declared output, so a failed or rerun job cannot delete them). Any change of the
# train or launch config reruns it, and a rerun (after a kill, with more steps, on another
# topology) resumes from the newest complete checkpoint; one that already reached its end
# launches nothing and leaves the checkpoints untouched.
#
# With segments (launch.segment_steps, by default every train.save_freq steps) training runs as
# train_segment jobs, one per segment end k, each resuming where the one before stopped and
# stopping at step k (--stop_after_step; the schedule follows train.steps). Each writes a small
# receipt (segments/<k>.json) that the conversion of checkpoint k waits for, so conversion,
# evaluation and publishing of k run while segment k+1 trains; `train` then only records the
# final checkpoint. docs/design.md, "Checkpoints that flow".
if SEGMENTED:

    rule train_segment:
        input:
            # ancient: a validate run again (a longer train.steps, any other change) reruns no
            # finished segment; the train job below takes the new ones in.
            dataset=ancient(dataset_input),
            resolved=ancient(rules.validate.output.resolved),
            flags=ancient(rules.validate.output.flags),
            previous=previous_segment,
        output:
            SEGMENT,
        log:
            f"{RESULTS}/logs/train/{{step}}.log",
        # Training first: a free core goes to the next segment before a conversion.
        priority: 10
        conda:
            "../../envs/lerobot_pipe.yaml"
        threads: config["launch"]["nproc_per_node"]
        resources:
            **train_resources(),
        params:
            # Only what makes this segment itself: the flags come from {input.flags} (those
            # validate checked), --steps from {input.resolved}, so a segment's params never change.
            rdzv_port=f"--rdzv_port={config['launch']['rdzv_port']}",
            stop_after_step=lambda wildcards: f"--stop_after_step={int(wildcards.step)}",
        shell:
            # As the unbroken train job below; launch-train pins the checkpoints it will save
            # (reason pending) until they are evaluated, and writes the receipt {output} last.
            """
            export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 # threads: sets both to 2 per rank
            mapfile -t flags <{input.flags}
            exec lerobot-pipe launch-train --cpus_per_task={resources.cpus_per_task} \
                --log={log} --history=%s --steps_from={input.resolved} \
                --receipt={output} --pin_pending=true {params} "${{flags[@]}}"
            """ % TRAIN_HISTORY

    # It only records the last segment's checkpoint: a moment's work where Snakemake runs (under
    # the SLURM profile no job of its own).
    localrules:
        train,

    checkpoint train:
        input:
            # The last segment, and through it any segment not yet trained: a validate run
            # again reruns this job, and Snakemake then finds the segments it misses (a
            # segment's own ancient inputs would hide them).
            last=SEGMENT.format(step=step_name(TOTAL_STEPS)),
            valid=rules.validate.output.valid,
        output:
            f"{RESULTS}/final_checkpoint.json",
        log:
            f"{RESULTS}/logs/train.log",
        conda:
            "../../envs/lerobot_pipe.yaml"
        params:
            history=TRAIN_HISTORY,
        shell:
            # The last segment's checkpoint record; the log links to the run's whole log.
            """
            lerobot-pipe finish-train --receipt={input.last} --output={output} \
                --log={log} --history={params.history}
            """

else:

    checkpoint train:
        input:
            dataset_input,
            rules.validate.output[0],
        output:
            f"{RESULTS}/final_checkpoint.json",
        log:
            f"{RESULTS}/logs/train.log",
        conda:
            "../../envs/lerobot_pipe.yaml"
        threads: config["launch"]["nproc_per_node"]
        resources:
            **train_resources(),
        params:
            # lerobot-pipe launch-train's arguments, one param per flag (see flag_params).
            **flag_params(
                f"--nproc_per_node={config['launch']['nproc_per_node']}",
                f"--nnodes={config['launch']['nnodes']}",
                f"--rdzv_port={config['launch']['rdzv_port']}",
                *train_flags(),
            ),
        shell:
            # lerobot-pipe launch-train (lerobot_pipe/pipeline/train_job.py) replaces this shell, so
            # that it is snakemake's own child: it stops while another trainer holds the run,
            # launches nothing when the checkpoints already reach `steps`, starts torchrun (srun +
            # torchrun in a SLURM allocation of several processes), shows progress here, keeps the
            # whole log in {log}, and stops training when snakemake is gone.
            """
            export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 # threads: sets both to 2 per rank
            exec lerobot-pipe launch-train --cpus_per_task={resources.cpus_per_task} \
                --log={log} --final_checkpoint={output} {params}
            """
