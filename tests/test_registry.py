"""The registries are the only lists: estimators (a function under ``register_estimator`` + one YAML
file) and policy losses (a function and its settings under ``register_policy_loss``)."""

import pytest
import torch

import harness.losses as losses
from harness.estimators import (
    ESTIMATORS, AdvantageResult, EstimatorParams, EstimatorSpec, estimator_names, get_estimator, register,
)
from harness.estimators.registry import ContractError
from harness.losses import POLICY_LOSSES, get_policy_loss, pg_loss, register_policy_loss

# estimators <-> YAML files, every estimator and policy loss through the loop: the contract tests,
# harness/testing/test_registry_contract.py (shipped, so they run on a user's plugins too)


def test_registering_an_estimator_twice_raises():
    before = dict(ESTIMATORS)
    with pytest.raises(ValueError, match="'rloo' is already registered"):
        register(EstimatorSpec("rloo", lambda b, p: None, needs_critic=False))
    assert ESTIMATORS == before and get_estimator("rloo") is before["rloo"]


def _zero(batch, params):
    return AdvantageResult(torch.zeros_like(batch.rewards), None)


def test_a_throwaway_estimator_is_enumerated(monkeypatch):
    spec = EstimatorSpec("throwaway_test", _zero, needs_critic=False)
    assert "throwaway_test" not in estimator_names()
    monkeypatch.setitem(ESTIMATORS, spec.name, spec)  # removed again at teardown
    assert estimator_names()[-1] == "throwaway_test"
    assert get_estimator("throwaway_test") is spec
    with pytest.raises(ValueError, match="already registered"):
        register(spec)


def test_register_adds_to_the_registry(monkeypatch):
    import harness.estimators.registry as registry

    fresh: dict = {}
    monkeypatch.setattr(registry, "ESTIMATORS", fresh)
    spec = register(EstimatorSpec("throwaway_test", _zero, needs_critic=False))
    assert fresh == {"throwaway_test": spec} and registry.estimator_names() == ["throwaway_test"]
    with pytest.raises(ValueError) as e:
        registry.get_estimator("x")
    assert str(e.value) == ("estimator must be one of ['throwaway_test'] (a plugin's estimator: "
                            "plugins=[your.module]), got 'x'")


def _noisy(batch, params):
    return AdvantageResult(torch.rand_like(batch.rewards), None)


def _noisy_loss(x, s):
    loss, metrics = pg_loss(x, s)
    return loss + 0.0 * torch.rand(()), metrics


def test_the_trial_calls_leave_the_global_rng_as_it_was():
    """Validation calls the run's estimator and loss once (EstimatorSpec.trial, PolicyLoss.trial): one
    that draws from the global RNG must not move the draws of the run, which is seeded before it."""
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    EstimatorSpec("throwaway_test", _noisy, needs_critic=False).trial(EstimatorParams())
    losses.PolicyLoss("throwaway_test", _noisy_loss).trial()
    assert torch.equal(torch.rand(3), expected)


def _per_token_metric(x, s):
    loss, metrics = pg_loss(x, s)
    return loss, {**metrics, "ratio": (x.logp - x.old_logp).exp().detach()}


@pytest.mark.parametrize("fn, shown", [
    (lambda x, s: pg_loss(x, s)[0], "returned a tensor of shape (2,), torch.float32 on cpu; expected (loss, metrics)"),
    (lambda x, s: (*pg_loss(x, s), None), "returned a tuple of 3; expected (loss, metrics)"),
    (lambda x, s: (pg_loss(x, s)[0], [1.0]), "returned metrics: an object of type list; expected (loss, metrics)"),
    # PolicyLoss.trial's inputs: 2 members of [T, B] = [3, 4]; a metric is one number per member
    (_per_token_metric, "returned metrics: {'ratio': 'a tensor of shape (2, 3, 4), torch.float32 on cpu'}; "
                        "expected (loss, metrics)"),
])
def test_a_loss_whose_output_is_not_loss_and_metrics_is_named(fn, shown):
    with pytest.raises(ContractError) as e:
        losses.PolicyLoss("throwaway_test", fn).trial()
    assert str(e.value).startswith(f"policy loss 'throwaway_test' (module {__name__}) {shown}"), str(e.value)


# ------------------------------------------------------------------------- policy losses
def test_the_design_policy_losses_are_registered():
    assert {"pg", "clip"} <= set(POLICY_LOSSES)  # the founding design's two losses (docs/design.md, "The registries")
    assert get_policy_loss("pg").fn is pg_loss
    assert get_policy_loss("clip").fn is losses.clipped_surrogate_loss


def test_register_policy_loss_as_decorator_and_as_call(monkeypatch):
    registered = list(POLICY_LOSSES)
    monkeypatch.setattr(losses, "POLICY_LOSSES", dict(POLICY_LOSSES))

    @register_policy_loss("throwaway")
    def throwaway(x, s):
        return pg_loss(x, s)

    assert throwaway.__name__ == "throwaway"  # the decorator returns the function itself
    assert losses.get_policy_loss("throwaway").fn is throwaway
    assert register_policy_loss("throwaway_call", pg_loss) is pg_loss
    assert list(losses.POLICY_LOSSES) == [*registered, "throwaway", "throwaway_call"]
    with pytest.raises(ValueError) as e:
        losses.get_policy_loss("trpo")
    for name in losses.POLICY_LOSSES:
        assert repr(name) in str(e.value)
    assert str(e.value).endswith("(a plugin's policy loss: plugins=[your.module]), got 'trpo'")


def test_registering_a_policy_loss_twice_raises():
    with pytest.raises(ValueError, match="'pg' is already registered"):
        register_policy_loss("pg", lambda *a, **k: None)
    with pytest.raises(ValueError, match="'clip' is already registered"):
        register_policy_loss("clip")(pg_loss)
    assert POLICY_LOSSES["pg"].fn is pg_loss and POLICY_LOSSES["clip"].fn is losses.clipped_surrogate_loss


def test_a_loss_with_its_own_knob_is_its_function_and_settings(tmp_path):
    """Registering a loss with a settings dataclass is all it takes: its knob becomes a config key
    (with its default), validation checks it, refuses it for the other losses, and the update step
    calls the loss with the value the command line gave (seen from inside the loss)."""
    from harness import config

    saved = dict(POLICY_LOSSES), dict(config.LOSS_KNOBS)  # the registries, as every module holds them
    try:
        _a_loss_with_a_knob(tmp_path)
    finally:
        for registry, before in zip((POLICY_LOSSES, config.LOSS_KNOBS), saved):
            registry.clear()
            registry.update(before)
        config.register_configs()


def _a_loss_with_a_knob(tmp_path):
    import dataclasses

    from harness import config
    from harness.app import run
    from harness.validation import validate
    from tests.control_helpers import TINY, make_cfg

    seen = []

    @dataclasses.dataclass(frozen=True)
    class ScaledSettings:
        adv_scale_knob: float = 1.0

        def __post_init__(self):
            if not self.adv_scale_knob > 0:
                config.bad_field("adv_scale_knob", "> 0", self.adv_scale_knob)

    @register_policy_loss("scaled_pg_test", settings=ScaledSettings)
    def scaled(x, s):
        seen.append(s.adv_scale_knob)
        return pg_loss(dataclasses.replace(x, advantages=x.advantages * s.adv_scale_knob), losses.NoSettings())

    assert config.LOSS_KNOBS["adv_scale_knob"] == (float, 1.0)
    args = ["task=cartpole", "estimator=a2c", *TINY, f"results_dir={tmp_path}"]
    assert make_cfg(args).adv_scale_knob == 1.0  # in the schema, at its default
    with pytest.raises(ValueError, match=r"adv_scale_knob must be > 0, got -1.0"):
        validate(make_cfg([*args, "update=scaled_pg_test", "adv_scale_knob=-1"]))
    with pytest.raises(ValueError, match=r"adv_scale_knob must be 1.0 with update=clip \(it applies to "
                                         r"update=scaled_pg_test\)"):
        validate(make_cfg([*args, "update=clip", "adv_scale_knob=2.5"]))
    run(make_cfg([*args, "update=scaled_pg_test", "adv_scale_knob=2.5"]))
    assert seen and set(seen) == {2.5}


# docs follow them: their tables and option lists are generated from the registries (tests/test_generated_docs.py)


# ------------------------------------------- config validation enumerates the registries (issue 14)
@pytest.mark.parametrize("override, field, registry", [
    ("estimator=nope", "estimator", "estimators"),
    ("loss_agg=nope", "loss_agg", "agg"),
    ("kl.estimator=nope", "kl.estimator", "kl"),
])
def test_a_bad_name_is_refused_naming_every_registered_value(override, field, registry, monkeypatch, tmp_path):
    from harness.estimators import KL_ESTIMATORS
    from harness.losses import AGG_MODES
    from harness.validation import validate
    from tests.control_helpers import make_cfg

    names = {"estimators": ESTIMATORS, "agg": AGG_MODES, "kl": KL_ESTIMATORS}[registry]
    if registry != "agg":  # a throwaway entry shows the message reads the registry itself
        monkeypatch.setitem(names, "throwaway_test", names[next(iter(names))])
    if field == "estimator":  # a group on the command line (Hydra lists harness/conf/estimator/); in a config, a string
        cfg = make_cfg([f"results_dir={tmp_path}"])
        cfg.estimator = "nope"
    else:
        cfg = make_cfg([override, f"results_dir={tmp_path}"])
    with pytest.raises(ValueError) as e:
        validate(cfg)
    msg = str(e.value)
    assert msg.startswith(f"{field} must be one of") and "\n" not in msg
    for name in names:
        assert repr(name) in msg


@pytest.mark.parametrize("name", ["low_var_kl", "k1+", "k3+", "low_var_kl+"])
def test_the_new_kl_names_pass_validation_from_the_command_line_grammar(name, tmp_path):
    from harness.validation import validate
    from tests.control_helpers import make_cfg

    cfg = make_cfg([f"kl.estimator={name}", "kl.beta=0.1", f"results_dir={tmp_path}"])
    assert cfg.kl.estimator == name
    validate(cfg)
