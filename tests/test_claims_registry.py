"""The claims registry (analysis.claims.registry): harness/conf/claims_registry.json is this
checkout's; on copies of harness/conf, every change to what decides a claim (a margin, n, a
default the runs inherit, the protocol, the family) makes the confirmatory run's gate refuse and
names what changed, what does not decide one (a comment, a part's name) does not; --register
then lets it pass and keeps the dates of the claims it did not change."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis.claims import registry
from analysis.claims.spec import load_claims_file

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "harness" / "conf"


def registered_copy(conf: Path) -> Path:
    """A copy of harness/conf at ``conf``, registered as it is (on 2026-01-01 at commit aaaaaaa)."""
    shutil.copytree(CONF, conf, ignore=shutil.ignore_patterns("__pycache__"))
    (conf / "claims_registry.json").unlink(missing_ok=True)
    registry.register(conf / "claims.yaml", conf, conf / "claims_registry.json", today="2026-01-01", sha="aaaaaaa")
    return conf


@pytest.fixture
def conf(tmp_path) -> Path:
    """A registered copy of harness/conf to change."""
    return registered_copy(tmp_path / "conf")


def gate(conf: Path) -> list[str]:
    """What the confirmatory run's gate (analysis.cli, ``--run``) reports for the copy ``conf``."""
    return registry.check(conf / "claims.yaml", conf, conf / "claims_registry.json")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)
    path.write_text(text.replace(old, new))


def test_the_committed_registry_is_this_checkouts():
    """Fails when a claim, an experiment, a default its runs inherit or the protocol changed without
    ``python -m analysis claims --register`` (and the registry committed with the change)."""
    changed = registry.check()
    assert not changed, "not registered (python -m analysis claims --register):\n" + "\n".join(changed)


def test_the_registry_is_the_same_from_a_copy_of_the_folder(conf):
    """No absolute path, thread count or date enters a hash: a copy elsewhere hashes the same."""
    assert registry.current(conf / "claims.yaml", conf) == registry.current()
    registry._DEFAULTS_MEMO.clear()  # composed again, from the copy
    assert registry.current(conf / "claims.yaml", conf) == registry.current()


def test_each_experiment_is_hashed_with_its_own_defaults():
    """Composed alone, an experiment hashes as it does among all (no memo hands it another's:
    claim_c8 and claim_c8_grid name each other)."""
    every = {n: h for c in registry.current()["claims"].values() for n, h in c["parts"]["defaults"].items()}
    for name in ("claim_c8", "claim_c8_grid", "claim_c10_loss"):
        registry._DEFAULTS_MEMO.clear()
        assert registry.defaults_hashes(CONF, [name]) == {name: every[name]}


CHANGES = {
    "margin (a rule's by)": ("claims.yaml", "rule: {less: {than: 1, by: 0.1}}\n      rationale: a 10% lower variance "
                             "is what 10% more samples per batch buy; less does not change which estimator to use\n"
                             "    reported:\n      - name: \"CartPole: total-variance",
                             "rule: {less: {than: 1, by: 0.2}}\n      rationale: a 10% lower variance "
                             "is what 10% more samples per batch buy; less does not change which estimator to use\n"
                             "    reported:\n      - name: \"CartPole: total-variance",
                             ["C3: primary changed"]),
    "margin (an equivalence tol)": ("claims.yaml", "      column: rel_bias_sq\n      rule: {equivalent: 0.01}\n      "
                                    "rationale: a relative squared bias of 0.01 is a bias 10% of the gradient's "
                                    "length, the smallest an update would notice\n    checks:\n      - name: the "
                                    "probe detects a deliberately biased (action-dependent) baseline",
                                    "      column: rel_bias_sq\n      rule: {equivalent: 0.02}\n      "
                                    "rationale: a relative squared bias of 0.01 is a bias 10% of the gradient's "
                                    "length, the smallest an update would notice\n    checks:\n      - name: the "
                                    "probe detects a deliberately biased (action-dependent) baseline",
                                    ["C39: primary changed"]),
    "selection (the configs the primary compares)": (
        "claims.yaml", "      den: {estimator: reinforce, probe.negative_control: false}\n",
        "      den: {estimator: reinforce, probe.negative_control: true}\n", ["C3: primary changed"]),
    "an experiment dropped": ("claims.yaml", "    experiments: [claim_c3, claim_c3_control]\n",
                              "    experiments: [claim_c3]\n", ["C3: experiment claim_c3_control removed"]),
    "n (an experiment's population)": ("experiment/claim_c9.yaml", "population: 10\n", "population: 12\n",
                                       ["C9: experiment claim_c9 changed"]),
    "n (an experiment's looks)": ("experiment/claim_c29.yaml", "#   looks: [40, 80]\n", "#   looks: [40, 120]\n",
                                  ["experiment claim_c29 changed"]),
    "an inherited default (a task's)": ("task/cartpole.yaml", "  rollout_steps: 32\n", "  rollout_steps: 64\n",
                                        ["C9: inherited defaults of claim_c9 changed"]),
    "alpha": ("claims.yaml", "protocol:\n  alpha: 0.05\n", "protocol:\n  alpha: 0.01\n",
              ["protocol: alpha 0.05 -> 0.01"]),
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_a_change_to_what_decides_a_claim_makes_the_gate_refuse_and_names_it(conf, what):
    file, old, new, named = CHANGES[what]
    assert gate(conf) == []
    edit(conf / file, old, new)
    changed = gate(conf)
    for line in named:
        assert any(line in c for c in changed), (line, changed)
    assert not any(c.startswith("C58:") for c in changed), changed  # only the claims it concerns


def test_an_inherited_default_flags_the_experiments_that_compose_it_and_no_other(conf):
    edit(conf / "task" / "cartpole.yaml", "  rollout_steps: 32\n", "  rollout_steps: 64\n")
    changed = gate(conf)
    assert "C9: inherited defaults of claim_c9 changed (a harness/conf value its runs compose)" in changed
    assert not any(c.startswith(("C39:", "C4:", "protocol:")) for c in changed), changed  # toy-task claims


def _entry(cid: str, conf: Path) -> str:
    """Claim ``cid``'s entry in the copy's claims.yaml, as text."""
    text = (conf / "claims.yaml").read_text()
    return re.search(rf"^  {cid}:\n(?:(?:    .*)?\n)+?(?=  C\d+:|\Z)", text, re.M).group(0)


def test_adding_or_removing_a_claim_changes_the_family(conf):
    path = conf / "claims.yaml"
    path.write_text(path.read_text().rstrip("\n") + "\n\n" + _entry("C3", conf).replace("  C3:\n", "  C99:\n", 1))
    changed = gate(conf)
    assert "C99: new claim, not registered" in changed
    assert "protocol: family changed: C99 added (m 51 -> 52)" in changed
    path.write_text(path.read_text().replace(_entry("C39", conf), "").replace(_entry("C99", conf), ""))
    changed = gate(conf)
    assert "protocol: family changed: C39 removed (m 51 -> 50)" in changed
    assert any(c.startswith("C39: registered claim no longer") for c in changed), changed


def test_what_decides_nothing_leaves_the_gate_open(conf):
    """Comments, a part's name and its rationale are not hashed."""
    path = conf / "claims.yaml"
    edit(path, "      name: total-variance ratio baseline / REINFORCE (toy, 4000 paired batches)\n",
         "      name: renamed\n")
    edit(path, "rationale: a 10% lower variance is what 10% more samples per batch buy; less does not change which "
               "estimator to use\n    reported:\n      - name: \"CartPole: total-variance",
         "rationale: reworded\n    reported:\n      - name: \"CartPole: total-variance")
    edit(conf / "experiment" / "claim_c9.yaml", "population: 10\n", "population: 10  # a new comment\n")
    assert gate(conf) == []


def test_register_opens_the_gate_and_keeps_unchanged_claims_dates(conf):
    path = conf / "claims_registry.json"
    path.unlink()
    assert gate(conf) == ["claims_registry.json: missing: nothing is registered"]
    first = registry.register(conf / "claims.yaml", conf, path, today="2026-01-01", sha="aaaaaaa")
    assert first[:2] == ["protocol: not registered", "C3: new claim, not registered"] and len(first) == 52
    assert gate(conf) == []
    edit(conf / "claims.yaml", "protocol:\n  alpha: 0.05\n", "protocol:\n  alpha: 0.01\n")
    edit(conf / "experiment" / "claim_c9.yaml", "population: 10\n", "population: 12\n")
    changed = registry.register(conf / "claims.yaml", conf, path, today="2026-02-02", sha="bbbbbbb")
    assert changed == ["protocol: alpha 0.05 -> 0.01",
                       "C9: experiment claim_c9 changed (its YAML: population, seeds, budget, sweep, looks)"]
    assert gate(conf) == []
    reg = json.loads(path.read_text())
    assert reg["registered"] == "2026-02-02" and reg["commit"] == "bbbbbbb" and reg["changed"] == changed
    assert {k: reg["claims"]["C9"][k] for k in ("registered", "commit")} == {"registered": "2026-02-02",
                                                                           "commit": "bbbbbbb"}
    assert {k: reg["claims"]["C3"][k] for k in ("registered", "commit")} == {"registered": "2026-01-01",
                                                                           "commit": "aaaaaaa"}
    assert reg["protocol"]["alpha"] == 0.01 and reg["protocol"]["m"] == 51
    before = path.read_text()
    assert registry.register(conf / "claims.yaml", conf, path, today="2026-03-03", sha="ccccccc") == []
    assert path.read_text() == before  # nothing changed: the registration stays as it was


def test_the_registry_format():
    reg = registry.load()
    p = reg["protocol"]
    assert set(p) == {"alpha", "power", "min_seeds", "check_level", "multiplicity", "spending", "methods", "family",
                      "m", "hash"}
    stat = [c.id for c in load_claims_file().claims if not c.exact]
    assert p["family"] == sorted(stat, key=registry.claim_order) and p["m"] == len(stat) == len(reg["claims"])
    for cid, entry in reg["claims"].items():
        assert set(entry) == {"hash", "parts", "registered", "commit"}, cid
        assert set(entry["parts"]) == {"primary", "checks", "experiments", "defaults"}, cid
        assert set(entry["parts"]["experiments"]) == set(entry["parts"]["defaults"]), cid
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", entry["registered"]), cid
    assert isinstance(reg["changed"], list) and reg["registered"] and reg["commit"]


def test_the_claims_file_refuses_the_old_registration_fields(tmp_path):
    """Registrations live in the registry only: a changelog block or a registered field is refused."""
    raw = yaml.safe_load((CONF / "claims.yaml").read_text())
    f = tmp_path / "claims.yaml"
    f.write_text(yaml.safe_dump({**raw, "changelog": [{"claim": "C3", "version": 2}]}))
    with pytest.raises(ValueError, match=r"unknown top-level key\(s\) \['changelog'\]"):
        load_claims_file(f)
    raw["claims"]["C3"]["registered"] = "2026-12-02"
    f.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"C3: unknown field\(s\) \['registered'\]"):
        load_claims_file(f)


def _python(repo: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(repo)
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_confirmatory_run_refuses_an_unregistered_change_before_making_its_folder(tmp_path):
    """``python -m analysis claims DIR --run`` in a copy of the packages whose C3 margin changed:
    exit 2, one line naming the change and the command that registers it, DIR not created;
    ``--register`` writes the registry and prints the change, after which the gate is open."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "analysis", repo / "analysis", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "harness", repo / "harness", ignore=shutil.ignore_patterns("__pycache__", "conf"))
    conf = registered_copy(repo / "harness" / "conf")
    file, old, new, _ = CHANGES["margin (a rule's by)"]
    edit(conf / file, old, new)
    out = tmp_path / "results" / "claims"
    res = _python(repo, "-m", "analysis", "claims", str(out), "--run", "--only", "C3")
    assert res.returncode == 2, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "C3: primary changed" in lines[0], res.stderr
    assert "python -m analysis claims --register" in lines[0], res.stderr
    assert not out.exists() and not out.parent.exists()
    res = _python(repo, "-m", "analysis", "claims", "--register")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "  C3: primary changed (rule, margin, effect or selection)" in res.stdout.splitlines()
    assert gate(conf) == []
    assert json.loads((conf / "claims_registry.json").read_text())["changed"] == [
        "C3: primary changed (rule, margin, effect or selection)"]


def test_the_report_states_each_registration_and_flags_a_claim_changed_since(tmp_path, monkeypatch):
    from analysis import claims as C
    from analysis.claims import report
    from analysis.claims.evidence import NotRun

    def not_composed(name, *args, **kwargs):
        raise NotRun(f"{name}: not composed in this test")

    reg = {"registered": "2026-01-01", "commit": "aaaaaaa", "changed": ["C9: primary changed (rule, margin, "
                                                                        "effect or selection)"],
           "protocol": {"hash": "0123456789ab"},
           "claims": {"C3": {"registered": "2026-01-01", "commit": "aaaaaaa", "hash": "h3"},
                      "C9": {"registered": "2025-12-31", "commit": "bbbbbbb", "hash": "h9"}}}
    since = ["protocol: alpha 0.05 -> 0.01", "C3: primary changed (rule, margin, effect or selection)"]
    monkeypatch.setattr(C, "compose_points", not_composed)
    monkeypatch.setattr(report, "_STATE", [(reg, since)])
    C.build_claims_report(tmp_path, quick=False, only={"C3", "C9"}, progress=lambda s: None)
    text = (tmp_path / "claims_only.md").read_text()
    section = text.split("## Registration")[1].split("\n## ")[0]
    assert "registered 2026-01-01 at commit aaaaaaa" in section and "- C9: primary changed" in section
    assert "- protocol: alpha 0.05 -> 0.01" in section and "- C3: primary changed" in section
    assert ("*Primary test* (registered 2026-01-01 at commit aaaaaaa — **changed since: primary changed (rule, "
            "margin, effect or selection)**)") in text
    assert "*Primary test* (registered 2025-12-31 at commit bbbbbbb): " in text
    rec = {v["claim"]: v for v in json.loads((tmp_path / "claims_only.json").read_text())["verdicts"]}
    assert rec["C3"]["registration"] == {"registered": "2026-01-01", "commit": "aaaaaaa", "hash": "h3",
                                         "changed_since": ["primary changed (rule, margin, effect or selection)"]}
    assert rec["C9"]["registration"]["changed_since"] == []
