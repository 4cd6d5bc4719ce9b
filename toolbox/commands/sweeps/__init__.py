"""The pieces of ``toolbox tune`` (`toolbox.commands.tune`): the sweep YAML and the job it becomes (`config`), one
trial as one whole experiment (`trial`), the ranked results and best.yaml (`results`), and what an interrupted
sweep keeps to resume (`state`)."""
