"""``learner.optim.name``: the registered optimizers, weight decay kept off biases and norms, their errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.learner.config import OptimConfig
from toolbox.learner.optim import build_optimizer, optimizer_step
from toolbox.learner.optimizers import OPTIMIZERS, check_strategy, param_groups


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))


def _train(name: str, steps: int = 20, **options: object) -> tuple[float, float]:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    y = x[:, :4] * 2
    model = _model()
    optimizer, scheduler = build_optimizer(model, OptimConfig(name=name, lr=3e-2, scheduler="constant", **options), steps)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        optimizer_step(model, optimizer, scheduler, max_grad_norm=10.0)
    return losses[0], losses[-1]


@pytest.mark.parametrize(("name", "cls"), [("adamw", "AdamW"), ("sgd", "SGD"), ("adafactor", "Adafactor")])
def test_each_optimizer_is_built_and_trains(name: str, cls: str) -> None:
    first, last = _train(name)
    assert last < 0.5 * first
    optimizer, _ = build_optimizer(_model(), OptimConfig(name=name), 10)
    assert type(optimizer).__name__ == cls


def test_sgd_takes_its_momentum() -> None:
    optimizer, _ = build_optimizer(_model(), OptimConfig(name="sgd", momentum=0.8, nesterov=True), 10)
    assert optimizer.param_groups[0]["momentum"] == 0.8 and optimizer.param_groups[0]["nesterov"] is True


def test_biases_and_norms_get_no_weight_decay_by_default() -> None:
    model = _model()
    decayed, plain = param_groups(model, OptimConfig(weight_decay=0.1))
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert {tuple(p.shape) for p in decayed["params"]} == {(16, 8), (4, 16)}
    assert len(plain["params"]) == 4  # two biases, the norm's weight and bias
    assert len(param_groups(model, OptimConfig(weight_decay=0.1, decay_norms_and_biases=True))) == 1
    assert len(param_groups(model, OptimConfig())) == 1  # no decay: one group, as before


def test_decay_shrinks_only_matrices() -> None:
    model = _model()
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.5), 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam's update is 0: what moves is decay alone
    optimizer.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert moved == {"0.weight", "2.weight"}


def test_8bit_adamw_without_bitsandbytes_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed, whether it is here or not
    assert importlib.util.find_spec("bitsandbytes") is None
    with pytest.raises(ConfigError, match=r"learner.optim.name: Value error, 'adamw_8bit' needs the bitsandbytes package, "
                                          r"which is not installed \(pip install bitsandbytes"):
        load_config(["learner.optim.name=adamw_8bit"])


def test_an_unknown_optimizer_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"learner.optim.name: Value error, 'lion' is not a registered optimizer; "
                                          r"allowed: \['adafactor', 'adamw', 'adamw_8bit', 'sgd'"):
        load_config(["learner.optim.name=lion"])
    assert {"adamw", "sgd", "adafactor", "adamw_8bit"} <= set(OPTIMIZERS.names())


def test_the_critic_takes_its_own_optimizer() -> None:
    cfg = load_config(["experiment=ppo_tiny", "learner.critic_optim={name: sgd, lr: 0.01}"])
    assert cfg.learner.critic_optim is not None and cfg.learner.critic_optim.name == "sgd"
    with pytest.raises(ConfigError, match=r"learner.critic_optim: algorithm 'grpo' trains no critic"):
        load_config(["learner.critic_optim={name: sgd}"])


def test_the_ppo_critic_trains_with_its_own_optimizer_and_the_policy_with_learner_optim(tiny_model_dir: Path) -> None:
    from toolbox.algorithms.ppo.config import PPOConfig
    from toolbox.algorithms.ppo.learner import PPOLearner
    from toolbox.learner.config import LearnerConfig

    def optimizers(**learner: object) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        cfg = LearnerConfig(num_workers=1, strategy="single", optim=OptimConfig(lr=2e-5, weight_decay=0.1), **learner)
        ppo = PPOLearner(str(tiny_model_dir), "float32", cfg, PPOConfig(critic_lr=3e-4), total_steps=2)
        return ppo.policy.trained.optimizer, ppo.critic.optimizer

    policy, critic = optimizers(critic_optim=OptimConfig(name="sgd", lr=0.01, momentum=0.5))
    assert type(policy).__name__ == "AdamW" and policy.defaults["lr"] == 2e-5
    assert type(critic).__name__ == "SGD" and critic.defaults["lr"] == 0.01 and critic.defaults["momentum"] == 0.5
    assert [g["weight_decay"] for g in critic.param_groups] == [0.0]  # its own section: no decay
    policy, critic = optimizers()  # unset: learner.optim at algorithm.critic_lr, biases and norms undecayed too
    assert type(critic).__name__ == "AdamW" and critic.defaults["lr"] == 3e-4
    assert sorted(g["weight_decay"] for g in critic.param_groups) == [0.0, 0.1]


def test_a_plugins_optimizer_is_selected_by_name() -> None:
    @OPTIMIZERS.register("rmsprop_test")
    def rmsprop(groups: list[dict[str, object]], o: OptimConfig) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(groups, lr=o.lr, eps=o.eps, momentum=o.momentum)

    try:
        cfg = load_config(["learner.optim={name: rmsprop_test, lr: 0.002, weight_decay: 0.1}"])
        optimizer, _ = build_optimizer(_model(), cfg.learner.optim, 10)
        assert type(optimizer).__name__ == "RMSprop" and optimizer.defaults["lr"] == 0.002
        assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.1]
    finally:
        OPTIMIZERS.unregister("rmsprop_test")


def test_optimizers_that_cannot_step_fsdp2_shards_are_refused_at_load() -> None:
    """Adafactor's step fails on FSDP2's DTensor parameters (checked on 2 gloo ranks), bitsandbytes' 8-bit AdamW's
    too (upstream reports), so the config says so first."""
    with pytest.raises(ConfigError, match=r"learner.optim.name: 'adafactor' cannot run with learner.strategy fsdp2: "
                                          r".*use learner.strategy ddp \(or single\)"):
        load_config(["experiment=grpo_tiny_fsdp2", "learner.optim.name=adafactor"])
    with pytest.raises(ConfigError, match=r"learner.critic_optim.name: 'adafactor' cannot run with learner.strategy"):
        load_config(["experiment=ppo_tiny", "learner.strategy=fsdp2", "learner.critic_optim={name: adafactor}"])
    assert load_config(["learner.strategy=ddp", "learner.optim.name=adafactor"]).learner.optim.name == "adafactor"
    with pytest.raises(ConfigError, match=r"^learner.optim.name: 'adamw_8bit' cannot run with learner.strategy fsdp2: "
                                          r"bitsandbytes' kernels take plain tensors"):
        check_strategy("adamw_8bit", "fsdp2", "learner.optim.name")  # (bitsandbytes is not installed here)
    check_strategy("adamw_8bit", "ddp", "learner.optim.name")


@pytest.mark.parametrize("kind", ["constant", "constant_with_warmup", "linear", "cosine"])
def test_each_schedule_is_transformers_own_and_resumes_from_its_checkpoint(kind: str) -> None:
    """The learning rate of every step of a 20-step schedule with 5 warm-up steps is what transformers'
    ``get_scheduler`` gives, and a scheduler state saved by either loads into the other."""
    from transformers import get_scheduler

    def schedules() -> tuple[torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.LRScheduler]:
        ours = build_optimizer(nn.Linear(2, 2), OptimConfig(lr=1e-3, warmup_steps=5, scheduler=kind), 20)[1]
        optimizer = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=1e-3)
        return ours, get_scheduler(kind, optimizer, num_warmup_steps=5, num_training_steps=20)

    ours, theirs = schedules()
    for _ in range(22):
        assert ours.get_last_lr() == theirs.get_last_lr()
        ours.optimizer.step(), theirs.optimizer.step()
        ours.step(), theirs.step()
    resumed_ours, resumed_theirs = schedules()
    resumed_ours.load_state_dict(theirs.state_dict())
    resumed_theirs.load_state_dict(ours.state_dict())
    assert resumed_ours.get_last_lr() == resumed_theirs.get_last_lr() == theirs.get_last_lr()


def test_the_optimizers_step_as_torchs_without_importing_its_compiler() -> None:
    """AdamW (fused and not) and SGD as `toolbox.learner.optimizers.eager` builds them take torch's steps bit for
    bit, their state dicts load into torch's own, and (in a fresh process) none of it imports ``torch._dynamo``."""
    script = textwrap.dedent("""
        import sys, torch
        from torch import nn
        from toolbox.learner.optimizers import eager

        def make():
            torch.manual_seed(0)
            return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))

        def run(cls, **kw):
            model = make()
            opt = cls(model.parameters(), lr=1e-2, **kw)
            for i in range(3):
                model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).square().sum().backward()
                opt.step()
                opt.zero_grad()
            state = opt.state_dict()
            opt.load_state_dict(state)
            return [p.detach().clone() for p in model.parameters()], state

        cases = [(torch.optim.AdamW, {"fused": True}), (torch.optim.AdamW, {"foreach": False}),
                 (torch.optim.SGD, {"momentum": 0.9, "nesterov": True})]
        ours = [run(eager(cls), **kw) for cls, kw in cases]
        clean = "torch._dynamo" not in sys.modules
        theirs = [run(cls, **kw) for cls, kw in cases]
        same = all(all(torch.equal(a, b) for a, b in zip(o[0], t[0])) for o, t in zip(ours, theirs))
        loads = all(torch.optim.AdamW(make().parameters()).load_state_dict(o[1]) is None for o in ours[:2])
        print(clean, same, loads, isinstance(eager(torch.optim.AdamW)([nn.Parameter(torch.ones(1))]), torch.optim.AdamW))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-4:] == ["True"] * 4, out.stdout
