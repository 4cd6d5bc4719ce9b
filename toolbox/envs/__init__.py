"""Gymnasium environments for classic RL: the `env` config section, space checks, vector envs, the env runner.

Plain Python + torch, no Ray (`toolbox.actors.env_runner` is the actor shell). The
policy network the runner steps with is `toolbox.models.mlp.ActorCritic`; the LLM
algorithms' shared pieces (batches, advantages, weight buckets) are in `toolbox.rl`.
"""
