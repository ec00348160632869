"""The embedded corpus: cut from the pinned transformers wheel, the same on every Python (issue 24)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from spade_lib import paths
from spade_lib.zoo.corpus import (SOURCE_PACKAGE, SOURCE_VERSION, CorpusConfig, Document, SourceError, build_corpus,
                                  cleandoc, is_code_file, is_generated, prose_origin, prose_paragraphs, source_files)


@pytest.fixture(scope="module")
def corpus():
    from spade_lib.zoo.build import cached_corpus

    return cached_corpus(CorpusConfig())


def test_pin_is_requirements_pin():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (paths.REPO_ROOT / "requirements.txt").read_text(), re.M))
    assert (SOURCE_PACKAGE, SOURCE_VERSION) == ("transformers", pins["transformers"])
    assert (CorpusConfig().package, CorpusConfig().version) == (SOURCE_PACKAGE, SOURCE_VERSION)
    wheel = importlib.metadata.distribution(SOURCE_PACKAGE).read_text("WHEEL")
    assert "Tag: py3-none-any" in wheel  # pure Python: the same files on every CPython


def test_corpus_files_come_from_the_distribution(corpus):
    dist = importlib.metadata.distribution(SOURCE_PACKAGE)
    listed = sorted(f.as_posix() for f in dist.files if f.suffix == ".py")
    files, source = source_files()
    assert [p for p, _ in files] == listed  # the RECORD's .py files, sorted; no directory walk
    assert (source.package, source.version, source.n_files) == ("transformers", "5.24.0", len(listed))
    assert source.sha256 == corpus.source.sha256
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    listed_set = set(listed)
    for d in corpus.train + corpus.heldout:
        assert prose_origin(d) in listed_set and d.kind in ("code", "prose")
    root = Path(dist.locate_file(listed[0])).resolve()
    assert stdlib not in root.parents  # site-packages, not the interpreter's standard library
    code = [d for d in corpus.train + corpus.heldout if d.kind == "code"]
    assert all(is_code_file(d.name) for d in code)
    assert 600 <= len(code) <= 700 and 9e6 <= sum(len(d.text) for d in code) <= 10e6


def test_split_holds_out_whole_files(corpus):
    train_files = {prose_origin(d) for d in corpus.train}
    held_code = {d.name for d in corpus.heldout if d.kind == "code"}
    held_prose = {prose_origin(d) for d in corpus.heldout if d.kind == "prose"}
    assert len(held_code) >= 6 and len(held_prose) >= 6 and not held_code & held_prose
    assert not train_files & (held_code | held_prose)
    assert corpus.manifest()["source"]["package"] == "transformers"


def test_committed_suite_names_this_corpus(corpus):
    manifest = json.loads((paths.DATA_DIR / "embedded.manifest.json").read_text())
    prov = manifest["provenance"]["embedded"]
    assert prov["corpus_sha256"] == corpus.sha256  # also a golden value: the same on every Python
    assert prov["source_package"] == "transformers==5.24.0" and prov["source_sha256"] == corpus.source.sha256
    assert prov["heldout_documents"] == [d.name for d in corpus.heldout]
    assert "python" not in manifest["software"]


def test_key_recipe_has_no_python_version(corpus, monkeypatch):
    from spade_lib.zoo import build
    from spade_lib.zoo.cache import cache_key
    from spade_lib.zoo.configs import DEFAULT, TINY

    recipes = [build.tokenizer_recipe(c) for c in (TINY, DEFAULT)] + [build.pair_recipe(c) for c in (TINY, DEFAULT)]
    for recipe in recipes:
        blob = json.dumps(recipe, sort_keys=True)
        assert platform.python_version() not in blob and "python" not in blob.lower()
        assert sys.version.split()[0] not in blob and sysconfig.get_paths()["stdlib"] not in blob
        assert recipe["corpus_sha256"] == corpus.sha256
    assert recipes[0]["corpus"]["package"] == "transformers" and recipes[0]["corpus"]["version"] == "5.24.0"
    assert recipes[2]["config"]["corpus"] == recipes[0]["corpus"]
    # another interpreter version and stdlib give the same keys
    keys = [cache_key(r) for r in recipes]
    monkeypatch.setattr(platform, "python_version", lambda: "3.99.0")
    monkeypatch.setattr(sys, "version", "3.99.0 (main) [fake]")
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"stdlib": "/nonexistent/lib/python3.99"})
    build.cached_corpus.cache_clear()
    try:
        again = [build.tokenizer_recipe(c) for c in (TINY, DEFAULT)] + [build.pair_recipe(c) for c in (TINY, DEFAULT)]
    finally:
        build.cached_corpus.cache_clear()
    assert [cache_key(r) for r in again] == keys


def test_wrong_version_or_missing_package_is_refused():
    with pytest.raises(SourceError, match=r"transformers==0\.0\.1 \(the pin.*but transformers==5\.24\.0 is installed"):
        build_corpus(CorpusConfig(version="0.0.1"))
    with pytest.raises(SourceError, match="no-such-spade-package==1.0, which is not installed"):
        source_files("no-such-spade-package", "1.0")


def test_modified_installed_file_is_refused(tmp_path, monkeypatch):
    pkg, info = tmp_path / "spadefake", tmp_path / "spadefake-1.0.dist-info"
    pkg.mkdir()
    info.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: spadefake\nVersion: 1.0\n")
    digest = hashlib.sha256(b"x = 0\n").digest()  # RECORD of another content
    import base64

    b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"spadefake/__init__.py,sha256={b64},6\nspadefake-1.0.dist-info/RECORD,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SourceError, match="spadefake/__init__.py differs from the wheel"):
        source_files("spadefake", "1.0")
    (pkg / "__init__.py").write_text("x = 0\n")
    files, source = source_files("spadefake", "1.0")
    assert files == [("spadefake/__init__.py", b"x = 0\n")] and source.n_files == 1


def test_selection_rules():
    assert is_code_file("transformers/generation/utils.py")
    assert is_code_file("transformers/models/llama/configuration_llama.py")
    assert not is_code_file("transformers/models/llama/modeling_llama.py")
    assert not is_code_file("transformers/models/deformable_detr/kernels/x/configuration_x.py")
    assert is_generated("# coding=utf-8\n# This file was automatically generated from modular_x.py.\n")
    assert is_generated('"""\nTHIS FILE IS AUTOGENERATED, DO NOT EDIT\n"""') and not is_generated("x = 1\n")


def test_prose_paragraphs_keep_prose_only():
    doc = cleandoc('''Turn a batch of token ids into text, one sequence per row, skipping the special tokens
        unless asked to keep them, and joining the pieces with the tokenizer's own decoder.

        Args:
            ids (`list[int]`): the token ids of one sequence, possibly padded at the end of the batch.

        ```python
        >>> decode(ids)

        Long comment line inside the code block that should never be taken for prose at all, really.
        ```

        - a bulleted item that is long enough to pass the word count but is a list, not a paragraph.
        ''')
    pars = prose_paragraphs(doc)
    assert len(pars) == 1 and pars[0].startswith("Turn a batch") and pars[0].endswith("decoder.")


def test_cleandoc_is_fixed_across_pythons():
    import inspect

    doc = "Summary line.\n\n    Body, indented.\n        More.\n    "
    assert cleandoc(doc) == inspect.cleandoc(doc) == "Summary line.\n\nBody, indented.\n    More."
    # inspect.cleandoc of CPython 3.13 strips only spaces; the corpus keeps 3.10-3.12's behaviour
    assert cleandoc("Head.\n\x0c    body\n      more\n") == "Head.\nbody\n more"


def _other_pythons() -> list[str]:
    """Working CPython 3.10-3.13 interpreters of other versions than this one (PATH, /usr/bin,
    /usr/local/bin, ~/.pyenv/versions), one per version."""
    import shutil

    candidates = [shutil.which(f"python3.{minor}") for minor in (10, 11, 12, 13)]
    candidates += sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.1[0-3].*/bin/python3"))
    candidates += sorted(str(p) for d in ("/usr/bin", "/usr/local/bin") for p in Path(d).glob("python3.1[0-3]"))
    found: dict[str, str] = {}
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        version = out.stdout.strip()
        if out.returncode == 0 and re.fullmatch(r"3\.1[0-3]\.\d+", version) and version != platform.python_version():
            found.setdefault(version, exe)  # a pyenv shim without that version fails and is skipped
    return [found[v] for v in sorted(found)]


_PROBE = r"""
import hashlib, importlib.util, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from spade_lib.zoo.corpus import build_corpus
spec = importlib.util.spec_from_file_location("spade_embedded_probe", sys.argv[1] + "/spade_lib/bench/embedded.py")
emb = importlib.util.module_from_spec(spec); sys.modules[spec.name] = emb; spec.loader.exec_module(emb)
c = build_corpus()
rows = json.dumps(emb.embedded_candidates(corpus=c), sort_keys=True).encode()
print(json.dumps({"corpus": c.sha256, "rows": hashlib.sha256(rows).hexdigest()}))
"""


@pytest.mark.slow
def test_corpus_and_candidates_are_the_same_on_other_pythons(corpus):
    """Builds the corpus and the suite's candidate rows under every other CPython 3.10-3.13 found."""
    from spade_lib.bench.embedded import embedded_candidates

    pythons = _other_pythons()
    if not pythons:
        pytest.skip("no other CPython 3.10-3.13 on this machine")
    site = str(Path(importlib.metadata.distribution(SOURCE_PACKAGE).locate_file("")))
    rows = json.dumps(embedded_candidates(corpus=corpus), sort_keys=True).encode()
    expected = {"corpus": corpus.sha256, "rows": hashlib.sha256(rows).hexdigest()}
    for exe in pythons:
        out = subprocess.run([exe, "-W", "error", "-c", _PROBE, str(paths.REPO_ROOT), site], capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, f"{exe}: {out.stderr[-2000:]}"
        assert json.loads(out.stdout.splitlines()[-1]) == expected, exe


def test_documents_are_plain():
    d = Document("transformers/x.py", "code", "x = 1\n")
    assert prose_origin(d) == "transformers/x.py"
    assert prose_origin(Document("docstrings:transformers/x.py", "prose", "Text.\n")) == "transformers/x.py"
