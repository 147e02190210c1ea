"""The strategy-family registry: every strategy name belongs to one family row, the config's checks read the
families' traits, the builders build each family's parts, and no family name is compared outside it."""

import ast
from pathlib import Path

import pytest

from bouquet.config import AppConfig, ConfigError
from bouquet.families import FAMILIES, STRATEGIES, StrategySpec, family_names
from bouquet.params import ParamError

PACKAGE = Path(__file__).resolve().parents[1] / "bouquet"


def test_every_strategy_name_parses_to_the_one_family_that_lists_it():
    assert len(STRATEGIES) == len(set(STRATEGIES)) == sum(len(f.strategies) for f in FAMILIES.values())
    for name in STRATEGIES:
        spec = StrategySpec.parse(name)
        assert name in spec.kind.strategies and spec.kind is FAMILIES[spec.family]
        assert name == (f"{spec.family}-{spec.variant}" if spec.variant else spec.family)
    assert StrategySpec.parse("fixed-k-euclidean") == StrategySpec("fixed-k-euclidean", "fixed-k", "euclidean")
    with pytest.raises(ParamError, match="unknown strategy 'hk'; choose one of fedavg, fedprox, hk-cosine"):
        StrategySpec.parse("hk")


def test_the_run_config_parses_the_strategy_once():
    config = AppConfig.from_run_config({"strategy": "hk-euclidean"})
    assert config.run.spec is config.run.spec and config.spec is config.run.spec
    assert config.family is FAMILIES["hk"] and config.hk.geometry == "euclidean"


def test_family_names_lists_the_families_with_a_trait_as_messages_write_them():
    assert family_names(lambda f: f.coalitions) == "hk-* or fixed-k-*"
    assert family_names(lambda f: f.opinions) == "hk-*"
    assert family_names(lambda f: f.robust, last=", ") == "krum, multikrum, bulyan, fedmedian, fedtrimmedavg"


@pytest.mark.parametrize("name", STRATEGIES)
def test_each_family_builds_its_parts(name):
    """Every strategy's aggregator, model store, sampler and train entries build from its run config."""
    from bouquet.strategies.models import AssignedModels

    config = AppConfig.from_run_config({"strategy": name, "task": "water", "clients-per-round": 10})
    family = config.family
    aggregator = family.aggregator(config)
    assert callable(aggregator.aggregate)
    store = family.models(config, None)
    assert isinstance(store, AssignedModels) == (family.clusters or family.name == "ifca")
    if family.sampler is not None:
        assert callable(family.sampler(config, config.sampling).sample_train)
    assert len(family.train_entries(config)) == (1 if name == "fedprox" else 0)
    clusters = family.initial_models(config, lambda: __import__("torch").nn.Linear(2, 1))
    assert (clusters is not None) == (name == "ifca")
    if clusters is not None:
        assert len(clusters) == config.ifca.k and len({c["weight"].numpy().tobytes() for c in clusters}) == config.ifca.k


def test_the_personal_store_follows_the_coalition_models_key_for_coalition_families_only():
    from bouquet.strategies.models import AssignedModels, SharedModel

    for name, store in (("hk-cosine", AssignedModels), ("fixed-k-cosine", AssignedModels)):
        config = AppConfig.from_run_config({"strategy": name, "coalition-models": "personal"})
        assert isinstance(config.family.models(config, None), store)
    assert isinstance(AppConfig.from_run_config({"strategy": "hk-cosine"}).family.models(
        AppConfig.from_run_config({"strategy": "hk-cosine"}), None), SharedModel)


def test_the_checks_read_the_families_traits():
    with pytest.raises(ConfigError, match=r"forms no coalitions \(use hk-\* or fixed-k-\*\)"):
        AppConfig.from_run_config({"strategy": "fedavg", "coalition-memory": True})
    with pytest.raises(ConfigError, match="Per-FedAvg is not implemented for the vision task"):
        AppConfig.from_run_config({"strategy": "perfedavg-fo", "task": "vision"})
    with pytest.raises(ConfigError, match="IFCA draws its clients itself"):
        AppConfig.from_run_config({"strategy": "ifca", "selection": "sckm-select", "clients-per-round": 10})
    with pytest.raises(ConfigError, match="'ifca-k': 5 clusters is more than the 4 clients per round"):
        AppConfig.from_run_config({"strategy": "ifca", "ifca-k": 5, "clients-per-round": 4})
    with pytest.raises(ConfigError, match="'robust-num-malicious-nodes': bulyan with num-malicious-nodes=2 needs "
                                          "at least 11 clients per round"):
        AppConfig.from_run_config({"strategy": "bulyan", "robust-num-malicious-nodes": 2, "clients-per-round": 10})
    with pytest.raises(ConfigError, match="which strategy 'cfl' does not serve"):
        AppConfig.from_run_config({"strategy": "cfl", "server-optimizer": "adam"})


def _family_comparisons(path: Path) -> list[str]:
    """Comparisons in ``path`` with a family name on one side (``x == "ifca"``, ``x in ("cfl", "local")``)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            if any(isinstance(c, ast.Constant) and c.value in FAMILIES for c in items):
                hits.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
                break
    return hits


def test_no_family_name_is_compared_outside_the_registry():
    """The config, the ServerApp and the ClientApp ask the family's traits and builders; only the registry
    names families.  Exempt: the robust-rule part, whose ``rule`` parameter is Flower's rule name (the part
    is usable without the app) -- it dispatches on its own parameter, not on the strategy; and the studies
    and their analysis, which compare their arms' names (an arm ``fedavg`` is a folder of runs, not a
    strategy)."""
    exempt = {PACKAGE / "families.py", PACKAGE / "strategies" / "robust.py"}
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in exempt and not {"analysis", "studies"} & set(path.parts)
            for hit in _family_comparisons(path)]
    assert hits == []
    assert _family_comparisons(PACKAGE / "families.py"), "the scan finds the registry's own comparisons"


def test_the_strategies_package_names_each_lazy_export_for_readers():
    """``bouquet.strategies`` loads its names on first use (reading a config loads no flwr), and lists each
    under TYPE_CHECKING, from the module it loads it from, so that editors and readers find the definition."""
    import bouquet.strategies as package

    tree = ast.parse((PACKAGE / "strategies" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    typed = {alias.name: node.module.rsplit(".", 1)[1] for node in block.body for alias in node.names}
    assert typed == package._EXPORTS and sorted(package.__all__) == sorted(package._EXPORTS)


def test_the_app_and_the_drop_ins_build_the_same_parts():
    """One composition path: the app's families and the drop-ins call the same builders, so the same settings
    give the same aggregator and model store, and IFCA's budget check answers both."""
    from bouquet.algorithms.clustered import IFCAParams
    from bouquet.strategies import FixedKFedAvg, HKFedAvg, SamplingParams, ifca_strategy

    app = AppConfig.from_run_config({"strategy": "hk-cosine", "hk-tau": 0.5, "hk-opinion-space": "updates",
                                     "coalition-models": "personal", "coalition-min-fraction": 0.2,
                                     "clients-per-round": 10})
    dropin = HKFedAvg(tau=0.5, opinion_space="updates", coalition_models="personal", min_coalition_fraction=0.2)
    built = app.family.aggregator(app)
    assert built.describe() == dropin.aggregator.describe() and built.params == dropin.aggregator.params
    assert type(app.family.models(app, None)) is type(dropin.models)
    app = AppConfig.from_run_config({"strategy": "fixed-k-cosine", "fixed-k": 3, "hk-opinion-space": "updates",
                                     "coalition-update-norm-bound": 2.0, "clients-per-round": 10})
    dropin = FixedKFedAvg(k=3, geometry="cosine", update_norm_bound=2.0)
    built = app.family.aggregator(app)
    assert built.describe() == dropin.aggregator.describe() and built.params == dropin.aggregator.params
    assert built.params.opinion_space == "weights"  # fixed-K partitions the models, whatever the app's key says
    with pytest.raises(ValueError, match="IFCA: 5 clusters is more than the 4 clients per round"):
        ifca_strategy(IFCAParams(k=5), SamplingParams(clients_per_round=4))
