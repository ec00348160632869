"""Ready-made Hugging Face dataset specs: the Spec-Bench subtasks and a HumanEval-style code task.

Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference") draws 80
prompts from each of six subtasks; these specs read the same public datasets through
:class:`~spade_lib.bench.sources.HFSource` with Spec-Bench's prompt templates, so a suite of any size
can be drawn from the full test splits. They need the network (or a local copy: override ``path`` /
``data_files`` / ``from_disk``); this project only tests them on local fixtures.

Differences from Spec-Bench's file, for the record: ``qa`` questions are lower-case in NQ-open
(Spec-Bench capitalised them); ``rag`` needs the DPR retrieval results for NQ as a local JSON file
(there is no canonical hub copy), and passages are joined without their titles.
"""

from __future__ import annotations

import dataclasses

from spade_lib.bench.sources import HFSource

HF_SPECS: dict[str, HFSource] = {
    "mt_bench": HFSource(
        path="HuggingFaceH4/mt_bench_prompts", split="train", name="hf:mt_bench", category="mt_bench",
        subtask="mt_bench", turns_field="prompt", category_field="category", id_field="prompt_id",
        license="Apache-2.0 (MT-bench, Zheng et al. 2023)"),
    "translation": HFSource(
        path="wmt/wmt14", config="de-en", split="test", name="hf:wmt14", category="translation",
        subtask="translation", template="Translate German to English: {de}",
        fields={"de": "translation.de"}, reference_field="translation.en",
        license="WMT14 news test sets: research use, see statmt.org/wmt14"),
    "summarization": HFSource(
        path="abisee/cnn_dailymail", config="3.0.0", split="test", name="hf:cnn_dailymail",
        category="summarization", subtask="summarization", template="Summarize: {article}",
        fields={"article": "article"}, id_field="id", reference_field="highlights",
        license="Apache-2.0 (CNN/DailyMail, Hermann et al. 2015; See et al. 2017)"),
    "qa": HFSource(
        path="google-research-datasets/nq_open", split="validation", name="hf:nq_open", category="qa",
        subtask="qa", template="{question}?", fields={"question": "question"}, reference_field="answer",
        license="CC-BY-SA-3.0 (Natural Questions, Kwiatkowski et al. 2019)"),
    "math_reasoning": HFSource(
        path="openai/gsm8k", config="main", split="test", name="hf:gsm8k", category="math_reasoning",
        subtask="math_reasoning", template="{question}", fields={"question": "question"},
        reference_field="answer", license="MIT (GSM8K, Cobbe et al. 2021)"),
    "rag": HFSource(
        path="json", data_files=None, split="train", name="hf:nq_dpr", category="rag", subtask="rag",
        template="{passages}\n{question}?", fields={"passages": "ctxs.*.text", "question": "question"},
        list_limit=5, list_join="\n", reference_field="answers",
        license="NQ questions CC-BY-SA-3.0; Wikipedia passages CC-BY-SA-3.0; DPR retrieval files: see "
                "facebookresearch/DPR"),
    "humaneval": HFSource(
        path="openai/openai_humaneval", split="test", name="hf:humaneval", category="humaneval",
        subtask="code", template="{prompt}", fields={"prompt": "prompt"}, id_field="task_id",
        reference_field="canonical_solution", license="MIT (HumanEval, Chen et al. 2021)"),
}


def hf_spec(name: str, **overrides) -> HFSource:
    """A named spec, optionally with fields replaced (``hf_spec("rag", data_files="nq-test.json")``)."""
    if name not in HF_SPECS:
        raise ValueError(f"unknown HF spec {name!r}; known: {sorted(HF_SPECS)}")
    try:
        return dataclasses.replace(HF_SPECS[name], **overrides)
    except TypeError as e:
        raise ValueError(f"hf_spec({name!r}): bad override ({e})") from None
