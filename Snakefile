# lerobot_pipe: validate the config -> train with torchrun -> convert each checkpoint ->
# evaluate each in simulation and choose the best -> publish to the Hugging Face Hub.
# config/README.md describes every config key.
import copy

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from lerobot_pipe.pipeline.config import config_problems, policy_fields

min_version("9.0")

# What the command line gave (--configfile, --config), before the default merges under it.
GIVEN_CONFIG = copy.deepcopy(config)


configfile: "config/config.yaml"


# A config file of another policy type keeps only its own policy fields (config/smolvla.yaml).
DEFAULT_CONFIG = yaml.safe_load(open(f"{workflow.basedir}/config/config.yaml"))
if "policy" in config.get("train", {}):
    config["train"]["policy"] = policy_fields(config, GIVEN_CONFIG, DEFAULT_CONFIG)

SCHEMA = "workflow/schemas/config.schema.yaml"
# One line per problem, naming the key (validate() would print the whole schema and config).
problems = config_problems(config, yaml.safe_load(open(f"{workflow.basedir}/{SCHEMA}")))
if problems:
    raise WorkflowError("\n".join(problems))
validate(config, SCHEMA)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/dataset.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/convert.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/publish.smk"
include: "workflow/rules/report.smk"


# Targets and small jobs (the synthetic dataset, the report's figures and table) run
# where Snakemake runs, also under the SLURM profile.
localrules:
    all,
    convert_all,
    evaluate_all,
    publish_all,
    dataset,
    best,
    plot_training,
    plot_eval,
    checkpoint_table,
    plot_training_now,
    plot_eval_now,
    checkpoint_table_now,
    report_now,


rule all:
    default_target: True
    input:
        # Named before training ends (segments' checkpoints): they run while it goes on.
        flow_converted,
        flow_evaluated if EVALUATING else [],
        flow_published if PUBLISHING else [],
        converted_steps,
        [evaluated_steps, BEST, rules.plot_eval.output] if EVALUATING else [],
        published_steps if PUBLISHING else [],
        rules.plot_training.output,
        rules.checkpoint_table.output,


rule convert_all:
    input:
        flow_converted,
        converted_steps,


rule evaluate_all:
    input:
        flow_evaluated,
        evaluated_steps,
        BEST,


rule publish_all:
    input:
        flow_published,
        published_steps,


onsuccess:
    print_results()
