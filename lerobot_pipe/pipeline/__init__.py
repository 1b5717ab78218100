"""What the Snakemake pipeline runs besides the console scripts: its config in the words of its
keys (:mod:`.config`), the train job (:mod:`.train_job`) and the evaluate job
(:mod:`.evaluate_job`)."""
