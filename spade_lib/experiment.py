"""The pair, the suite and the machine of a model-backed notebook, from its parameters, in one place.

Every model-backed notebook (03, 04, 05) declares the same six parameters::

    pair: str = "default"      # embedded pair name, or a label when target_id is set
    target_id: str = ""        # HF hub id / local folder of a target model ("" = the named pair)
    draft_id: str = ""         # HF hub id / local folder of a draft (with target_id)
    device: str = "cpu"        # "cpu", "cuda", "cuda:N" or "auto"
    dtype: str = "float32"     # "float32", "bfloat16" or "float16"
    suite: str = "embedded"    # data/<stem>.jsonl, a .jsonl path, or a named M1 source

and calls ``E = experiment.from_params(P)`` once; its runs are ``E.run_config(method=..., ...)``, a
``RunConfig`` with the run parameters every such notebook shares (:data:`RUN_PARAMETERS` where the
notebook declares them, and the experiment's device, dtype and threads), so no notebook pastes them.
Suite resolution (:func:`resolve_suite`) is
defined here only: a name ending in ``.jsonl`` is a path (relative paths are relative to the
**repository root**, whatever the working directory); otherwise ``data/<name>.jsonl`` when notebook
01 wrote it; otherwise the name of an M1 source (``spade_lib.bench.named_source``: ``"embedded"``,
``"humaneval"`` once registered, ...) built in memory with the pair's tokenizer.

``device="auto"`` is resolved here (and again by :class:`spade_lib.runs.config.RunConfig`), so two
notebooks that ask for ``"auto"`` and ``"cpu"`` on a CPU machine hash to the same runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spade_lib import devices, paths

from spade_lib.runs import timing

CHAT_TEMPLATES = {"auto": "auto", "always": True, "never": False}
PAIR_PARAMETERS = ("pair", "target_id", "draft_id", "device", "dtype", "suite")
# notebook parameters that are RunConfig fields of every run of the notebook (where it declares them)
RUN_PARAMETERS = ("max_new_tokens", "max_prompt_tokens", "n_samples", "chat_template", "seed")
# notebook parameters that name drafts of the pair (one name or a list): the draft models among them are prepared
DRAFT_PARAMETERS = ("main_draft", "compare_drafts", "cross_drafts", "drafts", "draft", "cost_draft", "crossvocab_draft")


@dataclass
class Experiment:
    """What a notebook runs on: the pair (on its device, in its dtype), the suite, the machine."""

    pair: Any
    suite: Any                       # the suite cut to n_per_category (what the notebook runs)
    full_suite: Any
    device: torch.device
    dtype: str
    threads: int
    fingerprint: dict = field(default_factory=dict)
    run_fields: dict = field(default_factory=dict)  # RunConfig fields of every run (see run_config)

    @property
    def categories(self) -> list[str]:
        return list(self.suite.categories)

    def run_config(self, **fields: Any):
        """A :class:`spade_lib.runs.config.RunConfig` of this experiment: the pair's device, dtype and
        threads and the notebook's run parameters (``run_fields``), then ``fields`` (which win)."""
        from spade_lib.runs.config import RunConfig

        return RunConfig(**{"device": str(self.device), "dtype": self.dtype, "threads": self.threads,
                            **self.run_fields, **fields})

    def figure_name(self, base: str, pair_name: str | None = None) -> str:
        """``base`` for the embedded ``default`` pair, ``base-<pair>`` for any other (one file per pair);
        ``pair_name``: a figure of another pair than this experiment's (:meth:`cross_vocab`'s)."""
        return figure_name(base, self.pair.name if pair_name is None else pair_name)

    def cross_vocab(self, pair_name: str = "", draft: str = "") -> tuple[Any, str | None, str | None]:
        """The pair and the cross-vocabulary draft (a draft with its own tokenizer, ``pair.draft_tokenizers``)
        a notebook section runs: ``(pair, draft, None)``, or ``(None, None, why)`` when there is none.

        ``pair_name``: empty or this experiment's pair: ``self.pair``; another named pair (``"smollm2"``) is
        loaded on this experiment's device and dtype only where it is built (``zoo.pairs.pair_built``),
        never built here. ``draft``: one of that pair's cross-vocabulary drafts (else ``ValueError``);
        empty: its first, by name."""
        from spade_lib.zoo.pairs import load_pair, pair_built

        if pair_name and pair_name != self.pair.name:
            if not pair_built(pair_name):
                return None, None, (f"pair {pair_name!r} is not built in this checkout (make run builds it; a "
                                    "notebook does not, it takes long)")
            pair = load_pair(pair_name, device=self.device, dtype=self.dtype)
        else:
            pair = self.pair
        cross = sorted(getattr(pair, "draft_tokenizers", {}) or {})
        if draft and draft not in cross:
            raise ValueError(f"draft: {draft!r} is not a cross-vocabulary draft of pair {pair.name!r} (those: {cross})")
        if not (draft or cross):
            return None, None, f"pair {pair.name!r} has no draft with its own tokenizer"
        return pair, draft or cross[0], None

    def describe(self) -> str:
        fp = self.fingerprint
        from spade_lib.runs.store import suite_key

        return (f"pair {self.pair.name!r}: drafts {sorted(self.pair.drafts)} on {self.device} ({self.dtype}), "
                f"{self.threads} threads\n"
                f"suite {self.suite.name!r}: {len(self.suite)} prompts in {len(self.categories)} categories "
                f"(sha256 {self.suite.sha256[:12]}, run key {suite_key(self.suite)})\n"
                f"machine: {fp.get('cpu_model')} ({fp.get('cpu_count')} CPUs), gpu: {fp.get('gpu')}, "
                f"torch {fp.get('torch')}, transformers {fp.get('transformers')}, "
                f"git {str(fp.get('git_commit'))[:10]}"
                + "".join(f"\n{line}" for line in prepared_lines(getattr(self.pair, "prepared", []))))


def prepared_lines(records: list[dict]) -> list[str]:
    """One line per model of :meth:`spade_lib.zoo.loading.Pair.prepare`'s records: its kernel plan and where it
    came from, and whether its lean forward agrees with the HF one (or why the HF forward runs it)."""
    out = []
    for r in records:
        if not r.get("covered"):
            out.append(f"{r['role']}: {r['model']} on the Hugging Face forward ({r.get('why')})")
            continue
        plan = ", ".join(f"{rows} rows {name}" for rows, name in (r.get("plan") or {}).items())
        if r.get("prefill") == "bf16":  # chosen by timing both (kernels.choose_prefill)
            sec = r["prefill_seconds"]
            plan += f"; prefill in bf16 ({1e3 * sec['bf16']:.0f} ms against {1e3 * sec['fp32']:.0f} ms in fp32)"
        out.append(f"{r['role']}: {r['model']} on the lean forward ({plan}; plan {r['plan_source']}); "
                   + ("agrees with its HF forward" if r["agrees"] else "DISAGREES with its HF forward: the HF forward runs it"))
    return out


def figure_name(base: str, pair_name: str) -> str:
    """Figure file stem per pair: the embedded ``default`` pair keeps ``base`` (the README's figures)."""
    if not base or "/" in base:
        raise ValueError(f"base must be a plain figure stem, got {base!r}")
    if pair_name == "default":
        return base
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in str(pair_name)).strip("-.")
    if not safe:
        raise ValueError(f"pair_name gives no usable file name: {pair_name!r}")
    return f"{base}-{safe}"


def chat_template_value(chat_template: str) -> bool | str:
    """The notebook spelling (``"auto"``, ``"always"``, ``"never"``) -> ``RunConfig.chat_template``."""
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"chat_template must be one of {sorted(CHAT_TEMPLATES)}, got {chat_template!r}")
    return CHAT_TEMPLATES[chat_template]


def suite_path(suite: str) -> Path | None:
    """The file a ``suite`` parameter names, or None when it names a source (not a file)."""
    if not isinstance(suite, str) or not suite:
        raise ValueError(f"suite must be a non-empty string, got {suite!r}")
    if suite.endswith(".jsonl"):
        p = Path(suite)
        return p if p.is_absolute() else paths.REPO_ROOT / p
    return paths.DATA_DIR / f"{suite}.jsonl"


def resolve_suite(suite: str, tokenizer: Any = "default", n_per_category: int | None = None):
    """The suite a ``suite`` parameter names (see the module docstring), cut to ``n_per_category``."""
    from spade_lib.bench import build_suite, default_suite, load_suite, named_source
    from spade_lib.bench.build import SuiteSpec

    path = suite_path(suite)
    if path.is_file():
        full = load_suite(path)
    elif suite.endswith(".jsonl"):
        raise FileNotFoundError(f"suite: no file {path}")
    elif suite == "embedded":  # notebook 01 not run yet: the same suite, built in memory
        full = default_suite(tokenizer=tokenizer)
    else:
        try:
            source = named_source(suite)
        except ValueError as e:
            raise ValueError(f"suite: no file {path} and no M1 source named {suite!r} ({e})") from None
        # the same spec as notebook 01's default suite, built in memory (40 per category at most)
        full = build_suite(SuiteSpec(name=suite, sources=[source], n_per_category=40, seed=0,
                                     tokenizer=tokenizer, allow_fewer=True))
    return full, (full.filter(n_per_category=n_per_category) if n_per_category else full)


def load_experiment(pair: str = "default", target_id: str = "", draft_id: str = "", device: str = "cpu",
                    dtype: str = "float32", suite: str = "embedded", *, n_per_category: int | None = None,
                    threads: int = 0, heads: tuple[str, ...] | list[str] = (), head_profile: str = "make",
                    prepare_drafts: list[str] | None = None) -> Experiment:
    """Load the pair on ``device``/``dtype``, fix torch's threads (0: every CPU this process may use)
    and resolve the suite. ``target_id`` (with ``draft_id``) loads a real pair labelled ``pair``;
    ``heads`` (a named pair's feature-head kinds, e.g. ``["eagle3", "medusa"]``) are built if not cached
    by the ``head_profile`` recipe (``"make"`` or the opt-in ``"long"``, :mod:`spade_lib.zoo.heads`) and
    attached, for the drafters ``"eagle"`` / ``"medusa"``. ``prepare_drafts``: the names the notebook drafts
    with; the target and the draft models among them are prepared (:meth:`spade_lib.zoo.loading.Pair.prepare`;
    a head or a registered drafter is not a model and is skipped); ``None``: ``load_pair``'s default."""
    from spade_lib.zoo.pairs import load_pair

    for name, v in (("pair", pair), ("target_id", target_id), ("draft_id", draft_id), ("device", device),
                    ("dtype", dtype), ("suite", suite)):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be a string, got {type(v).__name__}")
    if draft_id and not target_id:
        raise ValueError("draft_id: only meaningful with target_id")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an integer >= 0, got {threads!r}")
    if isinstance(heads, str) or not all(isinstance(h, str) and h for h in heads):
        raise ValueError(f"heads must be a list of head kinds such as ['eagle3', 'medusa'], got {heads!r}")
    if heads and target_id:
        raise ValueError("heads: only for a named pair; a real pair takes a head folder as draft_id")
    if prepare_drafts is not None and (isinstance(prepare_drafts, str) or not all(
            isinstance(d, str) and d for d in prepare_drafts)):
        raise ValueError(f"prepare_drafts: None or a list of draft names, got {prepare_drafts!r}")
    from spade_lib.zoo.heads import PROFILES

    if head_profile not in PROFILES:
        raise ValueError(f"head_profile: must be one of {sorted(PROFILES)}, got {head_profile!r}")
    dev = devices.resolve_device(device)
    torch_dtype = devices.resolve_dtype(dtype)
    n_threads = timing.fix_threads(threads or None)
    prepare = prepare_drafts is None  # else prepared below, once the pair's draft models are known
    if target_id:
        the_pair = load_pair(pair or None, target=target_id, draft=draft_id or None, device=dev, dtype=torch_dtype,
                             prepare=prepare)
    else:
        the_pair = load_pair(pair, device=dev, dtype=torch_dtype, heads=tuple(heads), head_profile=head_profile,
                             prepare=prepare)
    if not prepare:
        models = {n for n, m in the_pair.drafts.items() if isinstance(m, torch.nn.Module)}
        the_pair.prepare(drafts=[d for d in dict.fromkeys(prepare_drafts) if d in models])
    full, cut = resolve_suite(suite, tokenizer=the_pair.tokenizer, n_per_category=n_per_category)
    return Experiment(pair=the_pair, suite=cut, full_suite=full, device=dev, dtype=dtype, threads=n_threads,
                      fingerprint=timing.environment_fingerprint(dev))


def from_params(params: Any) -> Experiment:
    """:func:`load_experiment` from a notebook's resolved parameters (``setup_notebook``'s result or
    a dict): the six pair parameters, plus ``n_per_category``, ``threads``, ``heads`` and ``head_profile``
    when declared; the declared :data:`RUN_PARAMETERS` become the experiment's ``run_fields``
    (``chat_template`` in its ``RunConfig`` spelling, :func:`chat_template_value`)."""
    values = params.as_dict() if hasattr(params, "as_dict") else dict(params)
    missing = [k for k in PAIR_PARAMETERS if k not in values]
    if missing:
        raise ValueError(f"params: a model-backed notebook must declare {list(PAIR_PARAMETERS)}; missing {missing}")
    run_fields = {k: values[k] for k in RUN_PARAMETERS if k in values}
    if "chat_template" in run_fields:
        run_fields["chat_template"] = chat_template_value(run_fields["chat_template"])
    e = load_experiment(*(values[k] for k in PAIR_PARAMETERS), n_per_category=values.get("n_per_category"),
                        threads=values.get("threads", 0), heads=values.get("heads", ()),
                        head_profile=values.get("head_profile", "make"), prepare_drafts=drafts_named(values))
    e.run_fields = run_fields
    return e


def drafts_named(values: dict) -> list[str]:
    """The draft names a notebook's parameters ``values`` give (:data:`DRAFT_PARAMETERS`, in that order, once
    each; ``"draft"`` is a bring-your-own pair's draft when ``draft_id`` is given)."""
    names: list[str] = ["draft"] if values.get("draft_id") else []
    for key in DRAFT_PARAMETERS:
        v = values.get(key)
        names += [v] if isinstance(v, str) else list(v or [])
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n]


def cached_costs(pair: str, draft: str, *, threads: int = 0, progress: bool = False) -> tuple[dict, str]:
    """The cost table of ``pair``'s ``draft`` on this machine (CPU, float32, ``threads``; 0: every CPU), and
    how it was had: notebook 03's table cached under ``runs/costs/<pair>/`` when there is one
    (:func:`spade_lib.runs.costs.select_costs`, ``"read from the cached table"``), else the pair is loaded and
    the table measured, ``r(g)`` up to :data:`spade_lib.runs.costs.MIN_GAMMA` as notebook 03 keys it, and cached
    for notebook 03 (``"measured now (and cached)"``). The notebooks that price theory with a pair (02) read
    the same table the runs' predictions do."""
    from spade_lib.runs.costs import MIN_GAMMA, cost_folder, pair_costs, select_costs

    if not isinstance(pair, str) or not pair:
        raise ValueError(f"pair: a pair name, got {pair!r}")
    if not isinstance(draft, str) or not draft:
        raise ValueError(f"draft: a draft name of the pair, got {draft!r}")
    n_threads = timing.fix_threads(threads or None)
    table = select_costs(cost_folder(pair), device="cpu", dtype="float32", threads=n_threads).get(draft)
    if table is not None:
        return table, "read from the cached table"
    loaded = load_experiment(pair, threads=threads, prepare_drafts=[draft]).pair
    return pair_costs(loaded, [draft], MIN_GAMMA, progress=progress)[draft], "measured now (and cached)"


def describe_costs(table: dict, label: str, how: str, max_gamma: int | None = None) -> str:
    """One line naming a cost table (:func:`cached_costs`): where it came from, its device and threads,
    ``c``, the loop overhead ``o`` and ``r(g)`` at every measured ``g``; with ``max_gamma`` beyond the
    measured range, that ``r`` is extended linearly there (:func:`spade_lib.decoding.studies.costs.verify_cost_fn`)."""
    from spade_lib.decoding.studies.costs import verify_cost_fn

    top = max(table["r"])
    line = (f"cost table of {label} ({how}, {table['key']['device']}, {table['key']['threads']} threads): "
            f"c = {float(table['c']):.3f}, loop overhead o = {float(table.get('overhead', 0.0)):.3f}, r(g) for "
            f"g = 1..{top}: " + " ".join(f"{table['r'][g]:.2f}" for g in sorted(table["r"])))
    if max_gamma is not None and max_gamma > top:
        line += f"; r(g) beyond g = {top} extended linearly (r({max_gamma}) = {verify_cost_fn(table)(max_gamma):.2f})"
    return line


@dataclass(frozen=True)
class SessionPlan:
    """Notebook 03's runs per temperature: one interleaved session each (:func:`spade_lib.runs.protocol.run_interleaved`,
    the autoregressive baseline a member), built from its parameters of the same names (:meth:`from_params`)."""

    main_draft: str = "distilled"                  # draft of the gamma sweep
    gammas: tuple[int, ...] = (1, 2, 4, 6)         # draft lengths of the sweep
    gamma_ref: int = 4                             # gamma of every other run
    compare_drafts: tuple[str, ...] = ("data_only",)  # other drafts of the pair, at gamma_ref
    prompt_lookup: bool = True                     # the n-gram drafter ("ngram") at gamma_ref
    null_control: bool = True                      # the null-draft control at gamma_ref (at most 1x)
    hf_baselines: bool = True                      # HF generate (and, with hf_assisted, HF assisted generation)
    hf_temperatures: tuple[float, ...] = ()        # temperatures of the HF baselines; empty: every one
    hf_assisted: bool = True                       # HF assisted generation with main_draft at gamma_ref
    cross_drafts: tuple[str, ...] = ()             # cross-vocabulary drafts (spade_lib.runs.cross_drafts)
    cross_rules: tuple[str, ...] = ("text", "tli")  # the rules SPADE drafts them by
    cross_temperatures: tuple[float, ...] = ()     # temperatures of the cross-vocabulary runs; empty: every one

    @classmethod
    def from_params(cls, params: Any) -> "SessionPlan":
        """The plan from a notebook's resolved parameters: every field it declares (lists as tuples)."""
        values = params.as_dict() if hasattr(params, "as_dict") else dict(params)
        names = [f for f in cls.__dataclass_fields__ if f in values]
        return cls(**{f: tuple(values[f]) if isinstance(values[f], list) else values[f] for f in names})

    def configs(self, E: Experiment, T: float):
        """The session's runs at temperature ``T`` but the baseline and the cross-vocabulary drafts: the sweep,
        the other drafts, prompt lookup, the null draft, HF generate and HF assisted generation."""
        cs = [E.run_config(method="spade", draft=self.main_draft, gamma=g, temperature=T) for g in self.gammas]
        cs += [E.run_config(method="spade", draft=d, gamma=self.gamma_ref, temperature=T) for d in self.compare_drafts]
        if self.prompt_lookup:
            cs.append(E.run_config(method="spade", draft="ngram", gamma=self.gamma_ref, temperature=T))
        if self.null_control:  # the physical control: gamma_ref + 1 tokens verified per step, one kept
            cs.append(E.run_config(method="spade", draft="null", gamma=self.gamma_ref, temperature=T))
        if self.hf_baselines and (not self.hf_temperatures or T in self.hf_temperatures):
            cs.append(E.run_config(method="hf", temperature=T))
            if self.hf_assisted:
                cs.append(E.run_config(method="hf_assisted", draft=self.main_draft, gamma=self.gamma_ref,
                                       temperature=T))
        return cs

    def cross_configs(self, E: Experiment, T: float):
        """The cross-vocabulary drafts' runs at ``T`` (:func:`spade_lib.runs.cross_drafts.cross_configs`), after
        checking that each is one of the pair's; none at a temperature outside ``cross_temperatures`` (when set)."""
        from spade_lib.runs.cross_drafts import check_cross_drafts, cross_configs

        check_cross_drafts(E.pair, self.cross_drafts, self.cross_rules)
        if self.cross_temperatures and T not in self.cross_temperatures:
            return []
        return cross_configs(E.run_config, self.cross_drafts, self.cross_rules, self.gamma_ref, T)
