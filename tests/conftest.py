"""Shared test configuration.

Tests use one torch thread: the models under test are tiny, and on a 2-core machine a second thread
only adds synchronisation (measured ~100x slower for tiny forwards under load). Tests that need a
specific thread count set it themselves.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _spec_bench_questions():
    """Spec-Bench's question.jsonl, which SPADE does not ship: ``$SPADE_SPEC_BENCH_QUESTIONS``, else the
    developers' copy beside the repository (``../shared/data/spec_bench/question.jsonl``)."""
    import os
    from pathlib import Path

    env = os.environ.get("SPADE_SPEC_BENCH_QUESTIONS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "data" / "spec_bench" / "question.jsonl"


@pytest.fixture(scope="session")
def spec_bench_questions():
    """Path of Spec-Bench's question.jsonl; the test is skipped where it is not present."""
    path = _spec_bench_questions()
    if not path.is_file():
        pytest.skip(f"Spec-Bench question.jsonl not present ({path}; set SPADE_SPEC_BENCH_QUESTIONS)")
    return path


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark(name)``: the module of ``benchmarks/<name>.py`` (benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks"
                                                      / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
