"""``python -m toolbox.run``: the command that runs one experiment, kept at this path because job entry points
(``ray job submit -- python -m toolbox.run ...``, KubeRay manifests) name it; the command is `toolbox.commands.run`."""

from toolbox.commands.run import leave, main

if __name__ == "__main__":
    leave(main(early_ray=True))
