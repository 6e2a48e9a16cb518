"""The claims registry: everything that decides a statistical claim, hashed and frozen before its data.

``harness/conf/claims_registry.json`` (:data:`REGISTRY_FILE`) is generated, never edited: only
``python -m analysis claims --register`` (:func:`register`) writes it, and it is committed with
the change it registers. It holds

* ``protocol``: the error control of ``harness/conf/claims.yaml`` (alpha, power, min_seeds,
  check_level, multiplicity, spending), the interval method of each statistic kind
  (:data:`.kinds.METHODS`), the family (the ids of every statistical claim, sorted) and its size
  ``m``, and their ``hash``;
* ``claims``: per statistical claim, the ``hash`` of its ``parts``: its ``primary`` test and its
  ``checks`` (as written, without ``name`` and ``rationale``, which do not decide anything), each
  of its ``experiments`` (the experiment file's YAML, parsed so comments do not count, and its
  registered looks: population, seeds, budgets, sweep, looks) and the ``defaults`` each experiment
  inherits (:func:`composed_defaults`: what its runs get from ``harness/conf`` beyond their own
  file); with the date and commit of the registration at which that hash last changed;
* the date and commit of the latest registration and the lines saying what it changed.

A confirmatory run (``python -m analysis claims DIR --run``) refuses to start while the checkout
differs from the registry (:func:`check`), naming what changed; the claims report states each
claim's registration and flags a claim changed since. History (why a rule changed, after seeing
what) is git's: the registry and the change that made it are one commit.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import re
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from harness.config import register_configs
from harness.experiments import CLAIMS_FILE, CONF_DIR, REPO, load_experiments, sweep_overrides
from harness.io import atomic_write_text

from . import kinds
from .protocol import Protocol

REGISTRY_FILE = CONF_DIR / "claims_registry.json"
REGISTER_COMMAND = "python -m analysis claims --register"
#: Keys of a part that name or explain it: they decide nothing, so they are not hashed.
_UNHASHED_PART = {"name", "rationale"}
#: Keys of a composed config that say where a run writes, which seed it starts from (each run's
#: own, or shifted by --seed-offset), how it shows progress or how many threads this machine
#: gives it: none decides what a claim's runs compute as a design, so none is hashed.
_NOT_DEFAULTS = (("seed",), ("results_dir",), ("lm", "cache_dir"), ("threads",), ("population_workers",),
                 ("progress",), ("logger",))
_PROTOCOL_KEYS = ("alpha", "power", "min_seeds", "check_level", "multiplicity", "spending")
_DEFAULTS_MEMO: dict[str, str] = {}  # the content an experiment composes (_fingerprints) -> defaults hash


def commit(checkout: Path | None = None) -> str:
    """The harness checkout's commit (short hash), read from its ``.git`` (analysis starts no
    processes); "?" outside a git checkout (an installed package). ``.git`` is a folder in a clone
    and a ``gitdir: <path>`` file in a linked worktree (``git worktree add``), whose own folder
    holds its ``HEAD`` and names the shared one (refs, ``packed-refs``) in ``commondir``.
    ``checkout``: another checkout's root (tests)."""
    git = (checkout or Path(__file__).resolve().parents[2]) / ".git"
    try:
        if git.is_file():
            text = git.read_text().strip()
            if not text.startswith("gitdir: "):
                return "?"
            git = git.parent / text[len("gitdir: "):]  # a relative path is relative to the checkout
        common = git / (git / "commondir").read_text().strip() if (git / "commondir").is_file() else git
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = common / ref
            if path.is_file():
                return path.read_text().strip()[:7]
            for line in (common / "packed-refs").read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0][:7]
            return "?"
        return head[:7]
    except OSError:
        return "?"


def _hash(obj) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def claim_order(cid: str) -> tuple:
    """C3 before C10: by the number after the letters."""
    digits = "".join(ch for ch in cid if ch.isdigit())
    return (cid.rstrip("0123456789"), int(digits) if digits else -1, cid)


def _read_claims(claims_file: Path) -> dict:
    raw = yaml.safe_load(Path(claims_file).read_text())
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), dict):
        raise ValueError(f"{claims_file}: needs a 'claims' mapping")
    return raw


def _experiment_design(conf_dir: Path, name: str, looks: dict[str, tuple[int, ...]]) -> dict:
    """An experiment's own design: its YAML (parsed: comments do not count) and its registered looks."""
    path = Path(conf_dir) / "experiment" / f"{name}.yaml"
    node = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else None
    return {"yaml": node, "looks": list(looks[name]) if name in looks else None}


def _is_group(conf_dir: Path, override: str) -> bool:
    """Whether a sweep override picks a config group (``estimator=rloo``), not a value (``lr=0.1``)."""
    return (Path(conf_dir) / override.partition("=")[0].lstrip("+~")).is_dir()


def _strip_machine(cfg: dict) -> dict:
    for path in _NOT_DEFAULTS:
        node = cfg
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return cfg


def composed_defaults(conf_dir: Path, name: str) -> dict[str, dict | str]:
    """What experiment ``name``'s runs inherit: the config Hydra composes from ``conf_dir`` for
    each distinct choice of config groups its sweep makes (``estimator=reinforce``, ``task=...``),
    with the experiment's file applied and the sweep's plain values left out (those are its own
    YAML, hashed with it), interpolations unresolved, and :data:`_NOT_DEFAULTS` removed. Every
    run of the sweep is one of these configs plus its sweep values, so a changed task, estimator,
    schema or preset default a run gets changes this. One compose per group choice, not per run.
    Call inside Hydra's ``initialize_config_dir(conf_dir)``, as :func:`defaults_hashes` does."""
    path = Path(conf_dir) / "experiment" / f"{name}.yaml"
    if not path.is_file():
        return {"": "no experiment file"}
    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
    params = {str(k): str(v) for k, v in OmegaConf.to_container(params).items()} if params else {}
    choices = sorted({tuple(o for o in combo if _is_group(conf_dir, o)) for combo in sweep_overrides(params)})
    out: dict[str, dict | str] = {}
    for groups in choices:
        try:
            cfg = compose(config_name="config", overrides=[f"experiment={name}", *groups])
            out[" ".join(groups)] = _strip_machine(OmegaConf.to_container(cfg, resolve=False))
        except Exception as exc:  # noqa: BLE001 - a config that does not compose is registered as such
            out[" ".join(groups)] = f"does not compose: {type(exc).__name__}"
    return out


def _fingerprints(conf_dir: Path, names: list[str]) -> dict[str, str]:
    """Per experiment, the content of the files it can compose: every config file of ``conf_dir``
    but the claims and the experiment files, then its own experiment file and any other one its
    text names (an experiment file that includes another)."""
    conf_dir = Path(conf_dir)
    shared = hashlib.sha256()
    for f in sorted(conf_dir.rglob("*.yaml")):
        rel = f.relative_to(conf_dir).as_posix()
        if rel != "claims.yaml" and not rel.startswith("experiment/"):
            shared.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    texts = {f.stem: f.read_bytes() for f in sorted((conf_dir / "experiment").glob("*.yaml"))}
    out = {}
    for name in names:
        h = shared.copy()
        h.update(b"experiment=" + name.encode() + b"\0")
        own = texts.get(name, b"")
        for other, text in texts.items():
            if other == name or re.search(rf"\b{re.escape(other)}\b".encode(), own):
                h.update(other.encode() + b"\0" + text + b"\0")
        out[name] = h.hexdigest()
    return out


def defaults_hashes(conf_dir: Path, names: list[str]) -> dict[str, str]:
    """Experiment -> the hash of :func:`composed_defaults`, composed once per process for the same
    content of the files it can compose (:func:`_fingerprints`: a copy of the folder, or a change to
    another experiment's file, reuses it)."""
    keys = _fingerprints(conf_dir, names)
    todo = [n for n in names if keys[n] not in _DEFAULTS_MEMO]
    if todo:
        register_configs()
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
                for name in todo:
                    _DEFAULTS_MEMO[keys[name]] = _hash(composed_defaults(conf_dir, name))
        finally:
            GlobalHydra.instance().clear()
    return {n: _DEFAULTS_MEMO[keys[n]] for n in names}


def _protocol(raw: dict | None, family: list[str]) -> dict:
    """The protocol's numbers as the report uses them, the kinds' methods and the family."""
    raw = dict(raw or {})
    p = Protocol.from_dict(raw)
    out = {"alpha": p.alpha, "power": p.power, "min_seeds": p.min_seeds, "check_level": p.check_level,
           "multiplicity": raw.get("multiplicity", "holm"), "spending": raw.get("spending", "obrien_fleming"),
           "methods": {k: str(v) for k, v in sorted(getattr(kinds, "METHODS", {}).items())},
           "family": family, "m": len(family)}
    return {**out, "hash": _hash(out)}


def current(claims_file: Path = CLAIMS_FILE, conf_dir: Path = CONF_DIR) -> dict:
    """The registry of this checkout, without dates: ``{"protocol": ..., "claims": {id: {"hash",
    "parts"}}}`` (the module docstring). ``claims_file``, ``conf_dir``: copies, for tests."""
    raw = _read_claims(claims_file)
    stat = {str(cid): c for cid, c in raw["claims"].items() if isinstance(c, dict) and not c.get("exact")}
    looks = {name: e.looks for name, e in load_experiments(Path(conf_dir)).items()}
    names = sorted({str(x) for c in stat.values() for x in c.get("experiments") or ()})
    defaults = defaults_hashes(Path(conf_dir), names)
    strip = lambda p: {k: v for k, v in (p or {}).items() if k not in _UNHASHED_PART}  # noqa: E731
    claims = {}
    for cid in sorted(stat, key=claim_order):
        c = stat[cid]
        exps = [str(x) for x in c.get("experiments") or ()]
        parts = {"primary": _hash(strip(c.get("primary"))),
                 "checks": _hash([strip(p) for p in c.get("checks") or ()]),
                 "experiments": {n: _hash(_experiment_design(conf_dir, n, looks)) for n in exps},
                 "defaults": {n: defaults[n] for n in exps}}
        claims[cid] = {"hash": _hash(parts), "parts": parts}
    return {"protocol": _protocol(raw.get("protocol"), sorted(stat, key=claim_order)), "claims": claims}


def load(path: Path = REGISTRY_FILE) -> dict | None:
    """The registry written by :func:`register`, or None when there is none."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not a registry ({exc}); rewrite it with {REGISTER_COMMAND}") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), dict):
        raise ValueError(f"{path}: not a registry (no 'claims' mapping); rewrite it with {REGISTER_COMMAND}")
    return data


def _protocol_diff(old: dict, new: dict) -> list[str]:
    if not old:
        return ["protocol: not registered"]
    lines = [f"protocol: {k} {old.get(k)} -> {new.get(k)}" for k in _PROTOCOL_KEYS if old.get(k) != new.get(k)]
    om, nm = old.get("methods") or {}, new.get("methods") or {}
    lines += [f"protocol: interval method of {k} {om.get(k)} -> {nm.get(k)}" for k in sorted(set(om) | set(nm))
              if om.get(k) != nm.get(k)]
    of, nf = old.get("family") or [], new.get("family") or []
    if of != nf:
        what = [f"{c} added" for c in nf if c not in of] + [f"{c} removed" for c in of if c not in nf]
        lines.append(f"protocol: family changed: {', '.join(what) or 'reordered'} (m {len(of)} -> {len(nf)})")
    return lines


def _claim_diff(cid: str, old: dict, new: dict) -> list[str]:
    if old.get("hash") == new.get("hash"):
        return []
    op, np_ = old.get("parts") or {}, new.get("parts") or {}
    lines = []
    if op.get("primary") != np_.get("primary"):
        lines.append(f"{cid}: primary changed (rule, margin, effect or selection)")
    if op.get("checks") != np_.get("checks"):
        lines.append(f"{cid}: checks changed (a premise or power check: rule, margin or selection)")
    oe, ne = op.get("experiments") or {}, np_.get("experiments") or {}
    od, nd = op.get("defaults") or {}, np_.get("defaults") or {}
    for name in [n for n in ne if n not in oe]:
        lines.append(f"{cid}: experiment {name} added")
    for name in [n for n in oe if n not in ne]:
        lines.append(f"{cid}: experiment {name} removed")
    for name in [n for n in ne if n in oe]:
        if oe[name] != ne[name]:
            lines.append(f"{cid}: experiment {name} changed (its YAML: population, seeds, budget, sweep, looks)")
        elif od.get(name) != nd.get(name):
            lines.append(f"{cid}: inherited defaults of {name} changed (a harness/conf value its runs compose)")
    return lines or [f"{cid}: changed"]


def diff(registered: dict | None, now: dict) -> list[str]:
    """One line per difference between a registry and :func:`current`'s: the protocol first,
    then each claim (new, removed, or which of its parts changed). Empty when they agree."""
    registered = registered or {}
    lines = _protocol_diff(registered.get("protocol") or {}, now["protocol"])
    old, new = registered.get("claims") or {}, now["claims"]
    for cid in sorted(set(old) | set(new), key=claim_order):
        if cid not in old:
            lines.append(f"{cid}: new claim, not registered")
        elif cid not in new:
            lines.append(f"{cid}: registered claim no longer in harness/conf/claims.yaml (or now exact)")
        else:
            lines += _claim_diff(cid, old[cid], new[cid])
    return lines


def check(claims_file: Path = CLAIMS_FILE, conf_dir: Path = CONF_DIR, path: Path = REGISTRY_FILE) -> list[str]:
    """What changed since the registration (empty: the checkout is registered). The gate of a
    confirmatory run (``python -m analysis claims DIR --run``) and of ``analysis.claims.register``."""
    registered = load(path)
    if registered is None:
        return [f"{Path(path).name}: missing: nothing is registered"]
    return diff(registered, current(claims_file, conf_dir))


def register(claims_file: Path = CLAIMS_FILE, conf_dir: Path = CONF_DIR, path: Path = REGISTRY_FILE,
             today: str | None = None, sha: str | None = None) -> list[str]:
    """Write the registry of this checkout to ``path``: a claim whose hash is unchanged keeps the
    date and commit it was registered at, a new or changed one gets ``today`` and ``sha`` (this
    checkout's commit). Returns the lines of what changed (also stored as ``changed``); when
    nothing did, the file is left as it is."""
    previous = load(path)
    now = current(claims_file, conf_dir)
    changed = diff(previous, now)
    if previous is not None and not changed:
        return []
    if sha is None:

        sha = commit()
    today = today or datetime.date.today().isoformat()
    old = (previous or {}).get("claims") or {}
    for cid, entry in now["claims"].items():
        keep = old.get(cid) if old.get(cid, {}).get("hash") == entry["hash"] else None
        entry["registered"] = keep.get("registered", today) if keep else today
        entry["commit"] = keep.get("commit", sha) if keep else sha
    out = {"protocol": now["protocol"], "claims": now["claims"], "registered": today, "commit": sha,
           "changed": changed}
    atomic_write_text(Path(path), json.dumps(out, indent=1) + "\n")
    return changed


def registration(cid: str, registered: dict | None) -> str:
    """A claim's registration in words: ``registered YYYY-MM-DD at commit <sha>`` (or "not registered")."""
    entry = ((registered or {}).get("claims") or {}).get(cid)
    if not entry:
        return "not registered"
    return f"registered {entry.get('registered', '?')} at commit {entry.get('commit', '?')}"


__all__ = ["REGISTER_COMMAND", "REGISTRY_FILE", "check", "claim_order", "composed_defaults", "current",
           "defaults_hashes", "diff", "load", "register", "registration"]
