"""What determines a run: its :class:`RunConfig`, the seed of each generation, and its prompts' token ids.

A run is one method (``RunConfig.method``, see :mod:`spade_lib.runs.methods`) on one pair over one suite;
every field of its config is hashed into the run's folder name (:func:`spade_lib.runs.store.run_dir_for`),
so two configs that differ in any field are two runs. Each generation is seeded from
``(config.seed, question_id, sample)`` alone (:func:`generation_seed`), so its output does not depend on
the order, process or rank that computed it; its prompt is tokenised as M1 counts it (:func:`prompt_ids`).
:func:`check_pair_placement` refuses a pair whose device or dtype does not fit a config, and
:func:`spade_lib.decoding.drafts.drafters.check_draft` (with :meth:`RunConfig.draft_kwargs`) one whose drafts do not, before
anything runs. A config checks at construction what it can without a pair: a ``tree`` against the shapes its
``draft`` proposes (a registered drafter's declared :class:`~spade_lib.decoding.drafts.drafters.DrafterKind`; any other
name is a draft model or head of the pair, which grows the model shapes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from spade_lib import devices

METHODS = ("spade", "ar", "hf", "hf_assisted")

# RunConfig fields that fill the policy's option of the same name unless policy_options gives it
_POLICY_FIELDS = ("gamma", "threshold", "max_gamma")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's outputs (hashed into its folder name)."""

    method: str = "spade"        # "spade" | "ar" | "hf" | "hf_assisted" (see the module docstring)
    draft: str = "distilled"     # a draft of the pair ("distilled", "data_only", ...) or "ngram"
    gamma: int = 4               # draft length (fixed policy; num_assistant_tokens for hf_assisted)
    policy: str = "fixed"        # a registered policy: "fixed" | "confidence" (stop when max q < threshold) | "entropy" (H(q) > threshold) | "adaptive" (cost model, policy_options)
    threshold: float = 0.4       # the adaptive policy's threshold (probability, or nats for entropy)
    max_gamma: int = 8           # longest block an adaptive policy may draft
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 0               # 0 = off
    top_p: float = 1.0           # 1 = off
    mode: str = "auto"           # acceptance rule (spade_lib.rules); "auto": greedy at T=0, one_hot_q for ngram, else exact
    max_new_tokens: int = 64     # tokens generated per prompt (fewer if a stop token comes first)
    n_samples: int = 1           # generations per prompt, seeds derived from (seed, question_id, sample)
    seed: int = 0                # run seed
    record_topk: int = 0         # store the top-k of p and q per drafted position (0 = off)
    ngram_max: int = 3           # prompt lookup: longest n-gram matched
    max_prompt_tokens: int = 0   # keep only the last this many prompt tokens (0 = all)
    chat_template: bool | str = "auto"  # chat template: "auto" (if the tokenizer has one), True, False
    device: str = "auto"         # "cpu" | "cuda" | "cuda:N" | "auto" (resolved on creation); the pair must be there
    dtype: str = "float32"       # the pair's dtype (checked, recorded)
    warmup: int = 1              # untimed generations before the first timed one
    repeats: int = 1             # timed generations per (prompt, sample); wall_time is their median
    threads: int = 0             # torch intra-op threads (0 = leave as set; recorded either way)
    mode_options: dict = field(default_factory=dict)    # the rule's options, e.g. {"lenience": 0.7}
    policy_options: dict = field(default_factory=dict)  # the policy's options beyond gamma/threshold/max_gamma
    draft_options: dict = field(default_factory=dict)   # the drafter's own options (make_drafter), e.g. {"rule": "tli"} for a cross-vocabulary draft
    tree: str = ""               # a draft tree (spade_lib.decoding.drafts.tree_drafting.TreeConfig.parse spec, e.g. "eagle2:nodes=16,depth=4,topk=4"); "" = the chain

    def __post_init__(self) -> None:
        from spade_lib import rules
        from spade_lib import validate as v
        from spade_lib.decoding.drafts import drafters, policies

        v.check_choice("method", self.method, METHODS)
        v.check_str("draft", self.draft)
        v.check_choice("policy", self.policy, tuple(policies.policy_names()))
        v.check_choice("mode", self.mode, ("auto", *rules.rule_names()))
        for name in ("mode_options", "policy_options", "draft_options"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ValueError(f"{name}: must be a dict with string keys, got {value!r}")
            try:
                json.dumps(value, sort_keys=True, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{name}: must hold JSON values (it is hashed), got {value!r}") from e
            object.__setattr__(self, name, dict(value))  # a private copy: the caller's dict may change
        if self.mode == "auto":
            if self.mode_options:
                raise ValueError(f"mode_options: mode 'auto' takes none (name the mode), got {self.mode_options!r}")
        else:
            rules.get_rule(self.mode).check_options(self.mode_options)
        for name in ("gamma", "max_gamma"):
            v.check_gamma(name, getattr(self, name))
        for name in ("max_new_tokens", "n_samples", "repeats", "ngram_max"):
            v.check_int(name, getattr(self, name), min=1)
        for name in ("record_topk", "max_prompt_tokens", "warmup", "threads", "seed"):
            v.check_int(name, getattr(self, name), min=0)
        v.check_float("threshold", self.threshold)
        if self.draft_options and self.method != "spade":
            raise ValueError(f"draft_options: only method 'spade' builds a drafter, got method {self.method!r}")
        if self.method == "hf_assisted":
            from spade_lib.decoding.baselines import check_assistant_name

            check_assistant_name(self.draft)  # a draft model, not a registered drafter or a feature head
        v.check_str("tree", self.tree, nonempty=False)
        if self.tree:
            from spade_lib.decoding.drafts.tree_drafting import TreeConfig

            if self.method != "spade":
                raise ValueError(f"tree: only method 'spade' drafts trees, got method {self.method!r}")
            object.__setattr__(self, "tree", TreeConfig.parse(self.tree).spec())  # one canonical spec, one hash
            # a registered drafter declares the shapes it drafts; any other name is a draft of the pair, a model or a
            # head, which grow the model shapes (a cross-vocabulary draft, chains only, is known with its pair:
            # run_suite refuses it, through drafters.check_draft, before it writes anything)
            kind = drafters.drafter_kind(self.draft)
            what = f"draft {self.draft!r}" if kind else f"draft {self.draft!r} (a draft model or head of the pair)"
            (kind or drafters.ModelDrafter.kind).check_tree(self.tree, what)
        v.check_choice("chat_template", self.chat_template, (True, False, "auto"))
        v.check_str("device", self.device)
        self.sampling()  # validates temperature / top_k / top_p
        self.make_policy()  # validates the policy's options against their ranges
        devices.resolve_dtype(self.dtype)
        if self.device == "auto":  # resolved before hashing: "auto" and what it means are one run
            object.__setattr__(self, "device", str(devices.resolve_device("auto")))

    def sampling(self):
        """The :class:`spade_lib.sampling.SamplingConfig` of this run."""
        from spade_lib.sampling import SamplingConfig

        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def make_policy(self):
        """The draft-length policy ``get_policy(policy, **options)`` (``spade_lib.decoding.drafts.policies``): the fields
        ``gamma``, ``threshold``, ``max_gamma`` fill the policy's options of the same name, then
        ``policy_options`` (which wins)."""
        from spade_lib.decoding.drafts import policies

        takes = policies.policy_options(self.policy)
        options = {name: getattr(self, name) for name in _POLICY_FIELDS if name in takes}
        return policies.get_policy(self.policy, **{**options, **self.policy_options})

    def draft_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``make_drafter(config.draft, pair, **kwargs)`` and of ``check_draft(pair,
        config.draft, **kwargs)`` (:mod:`spade_lib.decoding.drafts.drafters`): ``ngram_max`` fills a registered drafter's
        ``max_ngram``, then ``draft_options`` (which wins), and ``tree`` when one is named."""
        from spade_lib.decoding.drafts import drafters

        options = {"max_ngram": self.ngram_max} if "max_ngram" in drafters.drafter_options(self.draft) else {}
        options.update(self.draft_options)
        if self.tree:
            options["tree"] = self.tree
        return options

    def make_drafter(self, pair):
        """A fresh drafter ``config.draft`` for ``pair`` (:func:`spade_lib.decoding.drafts.drafters.make_drafter` with
        :meth:`draft_kwargs`; a cross-vocabulary draft's drafters register from ``decoding.drafts.crossvocab``)."""
        from spade_lib.decoding.drafts import crossvocab, drafters  # noqa: F401 (crossvocab: registers its drafters)

        return drafters.make_drafter(self.draft, pair, **self.draft_kwargs())

    def __hash__(self) -> int:  # the option dicts are unhashable; equal configs have equal canonical JSON
        return hash(self.hash)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("tree", "draft_options"):  # empty: the field did not exist before, so older hashes stay
            if not d[name]:
                del d[name]
        return d

    @property
    def hash(self) -> str:
        """sha256 (first 12 hex digits) of the canonical JSON of every field."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def label(self) -> str:
        """A short human-readable name: method, draft, policy, sampling."""
        if self.method in ("ar", "hf"):
            what = self.method
        else:
            g = f"g{self.gamma}" if self.policy == "fixed" else f"{self.policy}{self.threshold:g}m{self.max_gamma}"
            what = f"{self.method}-{self.draft}-{g}" + (f"-{self.tree}" if self.tree else "")
            what += "".join(f"-{k}={v}" for k, v in sorted(self.draft_options.items()))
        return f"{what}-T{self.temperature:g}"



def generation_seed(seed: int, question_id: Any, sample: int) -> int:
    """A 63-bit seed from (run seed, question_id, sample): stable across processes and platforms."""
    digest = hashlib.sha256(f"{seed}:{question_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1




def prompt_ids(tokenizer, text: str, config: RunConfig) -> list[int]:
    """Token ids of a prompt as M1 counts them (``spade_lib.bench.render_prompt``: the chat template
    per ``config.chat_template``), then cut to its last ``max_prompt_tokens`` (0 = keep all)."""
    from spade_lib.bench import render_prompt

    rendered = render_prompt(text, tokenizer, config.chat_template)
    # a chat template already carries its special tokens; do not add a second BOS
    ids = [int(i) for i in tokenizer.encode(rendered, add_special_tokens=rendered is text)]
    if config.max_prompt_tokens and len(ids) > config.max_prompt_tokens:
        ids = ids[-config.max_prompt_tokens:]
    if not ids:
        raise ValueError(f"prompt {text[:40]!r}: tokenizes to nothing")
    return ids


def check_pair_placement(pair, config: RunConfig):
    """The device of ``pair``'s target, once it is the one ``config`` asks for, in its dtype (else a
    ``ValueError`` naming ``device`` or ``dtype`` and how to load the pair)."""
    want_dev = devices.resolve_device(config.device)
    want_dtype = devices.resolve_dtype(config.dtype)
    p = next(pair.target.parameters())
    if p.device.type != want_dev.type or (want_dev.index is not None and p.device != want_dev):
        raise ValueError(f"device: config asks for {want_dev} but the pair's target is on {p.device}; "
                         f"load the pair with load_pair(..., device={str(want_dev)!r})")
    if p.dtype != want_dtype:
        raise ValueError(f"dtype: config asks for {want_dtype} but the pair's target is {p.dtype}; "
                         f"load the pair with load_pair(..., dtype=torch.{str(want_dtype).removeprefix('torch.')})")
    return p.device
