"""What a CPU user would pick instead: llama.cpp's own speculative decoding on the headline pair's two GGUF files.

Not a test and not part of ``make run``: it prints figures measured in one run on one machine. The files are the
ones SPADE assembles from the PyPI chunk wheels (:mod:`spade_lib.zoo.qwen_coder`: Qwen2.5-Coder-1.5B-Instruct
Q4_K_M as the target, 0.5B-Instruct as the draft), read by llama.cpp as they are (quantized: the target streams
~1.1 GB a token where SPADE's fp32 target streams ~6.2 GB). llama.cpp (MIT) is built once from the source that
the ``llama-cpp-python`` sdist on PyPI vendors (``pip download``, then ``cmake``; a few minutes on two cores),
into ``--build`` (default ``<cache>/llamacpp/<version>``); only its two programs are built:

- ``llama-completion``: greedy autoregressive decoding (``--temp 0 --top-k 1``), the baseline;
- ``llama-speculative-simple``: greedy speculative decoding with a draft model (``--spec-type draft-simple``, at
  most ``--gamma`` drafted tokens a step), llama.cpp's own loop;
- ``llama-bench``: the costs SPADE's cost model reads, in llama.cpp: ``c`` (a draft token over a target token,
  16-token generations) and ``r(gamma)`` (a ``gamma + 1``-token batch over a target token), 3 repetitions each.

For each of the HumanEval prompts notebook 03 runs on the pair (``--prompts`` of them, seed 0, raw completions), both
programs generate up to ``--tokens`` tokens at ``--threads`` threads (default: torch's, as the notebooks), in turns,
``--rounds`` times. Each reports its own clocks: the prompt's processing (the target's, and the draft's where it
drafts) and the generation. The speedup is the ratio of tokens per second end to end (prompt + generation as
notebook 03 times SPADE, for the AR run's tokens: :func:`end_to_end`) and of the generation alone; the acceptance is
llama.cpp's ``n_accept / n_drafted``; the prediction of the generation's speedup, ``tau / (gamma c + r(gamma))`` with
``tau = (n_accept + steps) / steps`` and ``steps = n_drafted / gamma`` (a constant gamma), says what the two models
would allow a loop that cost nothing else.

    python benchmarks/bench_llamacpp.py [--prompts 6] [--tokens 48] [--gamma 4] [--rounds 1] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spade_lib import devices, paths  # noqa: E402
from spade_lib.validate import check_options  # noqa: E402

VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendored llama.cpp is built
PROGRAMS = ("llama-completion", "llama-speculative-simple", "llama-bench")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6, help="HumanEval prompts (notebook 03's seeded subset)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens a generation")
    ap.add_argument("--gamma", type=int, default=4, help="most drafted tokens a step")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over the prompts, both programs in turns")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads (0: torch's default, the thread count the notebooks time SPADE at)")
    ap.add_argument("--build", type=Path, default=None,
                    help="where llama.cpp is built (default <cache>/llamacpp/VERSION)")
    args = ap.parse_args(argv)
    check_options(ap, args, {"prompts": 1, "tokens": 1, "gamma": 1, "rounds": 1, "threads": 0})
    return args


def build(folder: Path, version: str = VERSION) -> Path:
    """The folder of the built programs (:data:`PROGRAMS`): built now from the ``llama-cpp-python==version`` sdist's
    vendored llama.cpp unless all are there. Needs pip (PyPI), cmake and a C++ compiler; an error names what failed."""
    bin_dir = folder / "build" / "bin"
    if all((bin_dir / p).is_file() for p in PROGRAMS):
        return bin_dir
    if shutil.which("cmake") is None:
        raise RuntimeError("cmake: not found (llama.cpp builds with cmake; `apt-get install cmake`)")
    folder.mkdir(parents=True, exist_ok=True)
    t0 = devices.clock()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                        "--no-binary", ":all:", "-d", tmp], check=True,
                       stdout=subprocess.DEVNULL)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"
        shutil.rmtree(folder / "src", ignore_errors=True)
        shutil.move(str(src), folder / "src")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
             "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
             "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=ON",
             # the host's instructions but AMX: on a 2-core Xeon VM (family 6 model 207) the native build's AMX
             # matrix path died with SIGILL at its first tile instruction (tilezero)
             f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    subprocess.run(["cmake", "-S", folder / "src", "-B", folder / "build", *flags], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", folder / "build", "--target", *PROGRAMS, "-j", str(os.cpu_count() or 1)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"built llama.cpp (llama-cpp-python {version}'s) in {devices.clock() - t0:.0f} s: {bin_dir}")
    return bin_dir


_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_ENC = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DEC = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPT = re.compile(r"n_accept\s*=\s*(\d+)")


def _found(pattern: re.Pattern, text: str, what: str) -> re.Match:
    m = pattern.search(text)
    if m is None:
        raise RuntimeError(f"{what}: no {pattern.pattern!r} in its output:\n{text[-2000:]}")
    return m


def read_ar(text: str) -> dict:
    """``{"prompt_s", "gen_s", "tokens"}`` from ``llama-completion``'s performance lines (its own clocks)."""
    p, e = _found(_PROMPT, text, "llama-completion"), _found(_EVAL, text, "llama-completion")
    # the first new token comes with the prompt's forward: n_eval runs give n_eval + 1 tokens
    return {"prompt_s": float(p.group(1)) / 1e3, "gen_s": float(e.group(1)) / 1e3, "tokens": int(e.group(2)) + 1}


def read_spec(text: str) -> dict:
    """``{"prompt_s", "gen_s", "tokens", "drafted", "accepted"}`` from ``llama-speculative-simple``'s summary."""
    enc, dec = _found(_ENC, text, "llama-speculative-simple"), _found(_DEC, text, "llama-speculative-simple")
    return {"prompt_s": float(enc.group(2)), "gen_s": float(dec.group(2)), "tokens": int(dec.group(1)),
            "drafted": int(_found(_DRAFTED, text, "llama-speculative-simple").group(1)),
            "accepted": int(_found(_ACCEPT, text, "llama-speculative-simple").group(1))}


def costs(bin_dir: Path, ggufs: dict[str, Path], gamma: int, threads: str) -> dict:
    """``{"t_target", "t_draft", "t_verify", "c", "r"}`` from ``llama-bench`` (seconds a token or a batch, its means
    of 3 repetitions): ``c = t_draft / t_target`` (16-token generations), ``r = t_verify / t_target`` (a prompt of
    ``gamma + 1`` tokens, one batch)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(ggufs["target"]), "-m", str(ggufs["draft"]), "-p", str(gamma + 1),
           "-n", "16", "-t", threads, "-r", "3", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench exited {out.returncode}:\n{out.stderr[-2000:]}")
    rows = json.loads(out.stdout)

    def seconds(role: str, n_prompt: int, n_gen: int) -> float:
        row = next(r for r in rows if Path(r["model_filename"]).name == ggufs[role].name
                   and r["n_prompt"] == n_prompt and r["n_gen"] == n_gen)
        return 1 / row["avg_ts"] if n_gen else n_prompt / row["avg_ts"]  # a token's seconds, or the batch's

    t1, d1, tk = seconds("target", 0, 16), seconds("draft", 0, 16), seconds("target", gamma + 1, 0)
    return {"t_target": t1, "t_draft": d1, "t_verify": tk, "c": d1 / t1, "r": tk / t1}


def end_to_end(total: dict, tokens: int) -> dict:
    """Tokens per second of a program's ``total`` (``prompt_s``, ``gen_s``, ``tokens`` summed over its runs) for the
    generation alone and end to end, the latter for ``tokens`` new tokens (the AR run's count): the speculative
    loop overshoots ``-n`` by up to gamma a generation, and its extra tokens must not spread its prompt's cost."""
    per_token = total["gen_s"] / total["tokens"]
    return {"end_to_end": tokens / (total["prompt_s"] + tokens * per_token), "generation": 1 / per_token}


def prompts(n: int) -> list[str]:
    """The first turns of notebook 03's HumanEval prompts on the pair (``n_per_category = n``, seed 0), raw."""
    from transformers import AutoTokenizer

    from spade_lib.experiment import resolve_suite
    from spade_lib.zoo import qwen_coder

    tokenizer = AutoTokenizer.from_pretrained(qwen_coder.model_entry(qwen_coder.DRAFT, create=False) / "model")
    _, cut = resolve_suite("humaneval", tokenizer=tokenizer, n_per_category=n)
    return [r["turns"][0] for r in cut.rows]


def main(argv=None) -> dict:
    args = parse(argv)
    from spade_lib.zoo import qwen_coder

    import torch

    threads = str(args.threads or torch.get_num_threads())  # as notebook 03 times SPADE (physical cores, not SMT)
    ggufs = {}
    for role, spec in (("target", qwen_coder.TARGET), ("draft", qwen_coder.DRAFT)):
        ggufs[role] = qwen_coder.gguf_entry(spec, create=False) / spec.filename
        if not ggufs[role].is_file():
            raise FileNotFoundError(f"{role}: {ggufs[role]} is missing: build the pair first "
                                    "(`python -m spade_lib.zoo qwen2.5-coder`)")
    bin_dir = build(args.build or paths.CACHE_DIR / "llamacpp" / VERSION)
    common = ["-m", str(ggufs["target"]), "-n", str(args.tokens), "-t", threads, "-tb", threads, "--temp", "0",
              "--top-k", "1", "-c", "2048", "--seed", "0"]
    ar_cmd = [str(bin_dir / "llama-completion"), *common, "-no-cnv", "--no-display-prompt"]
    spec_cmd = [str(bin_dir / "llama-speculative-simple"), *common, "-md", str(ggufs["draft"]), "-td", threads,
                "-tbd", threads, "--spec-type", "draft-simple", "--spec-draft-n-max", str(args.gamma),
                "--spec-draft-p-min", "0"]  # a constant gamma, as notebook 03's chain
    texts = prompts(args.prompts)
    print(f"llama.cpp (llama-cpp-python {VERSION}'s), {threads} threads, {len(texts)} HumanEval prompts x "
          f"{args.tokens} tokens, gamma {args.gamma}, {args.rounds} round(s) in turns")
    runs: dict[str, list[dict]] = {"ar": [], "spec": []}
    for _ in range(args.rounds):
        for text in texts:
            for kind, cmd in (("ar", ar_cmd), ("spec", spec_cmd)):
                out = subprocess.run([*cmd, "-p", text], capture_output=True, text=True)
                log = out.stdout + out.stderr
                if out.returncode != 0:
                    raise RuntimeError(f"{Path(cmd[0]).name} exited {out.returncode}:\n{log[-2000:]}")
                runs[kind].append(read_ar(log) if kind == "ar" else read_spec(log))
    tot = {k: {f: sum(r[f] for r in rs) for f in ("prompt_s", "gen_s", "tokens")} for k, rs in runs.items()}
    rate = {k: end_to_end(t, tot["ar"]["tokens"]) for k, t in tot.items()}
    drafted, accepted = (sum(r[f] for r in runs["spec"]) for f in ("drafted", "accepted"))
    cost = costs(bin_dir, ggufs, args.gamma, threads)
    steps = drafted / args.gamma
    tau = (accepted + steps) / steps if steps else float("nan")
    out = {"ar_tok_s": rate["ar"], "spec_tok_s": rate["spec"],
           "speedup": {w: rate["spec"][w] / rate["ar"][w] for w in ("end_to_end", "generation")},
           "acceptance": accepted / drafted if drafted else float("nan"), "tokens": tot, "costs": cost,
           "tau": tau, "predicted_generation": tau / (args.gamma * cost["c"] + cost["r"])}
    for w in ("end_to_end", "generation"):
        print(f"  {w:10s}  AR {rate['ar'][w]:6.2f} tok/s   speculative {rate['spec'][w]:6.2f} tok/s   "
              f"speedup {out['speedup'][w]:.3f}x")
    print(f"  acceptance {out['acceptance']:.3f} ({accepted} of {drafted} drafted tokens); "
          f"tokens AR {tot['ar']['tokens']}, "
          f"speculative {tot['spec']['tokens']}")
    print(f"  llama-bench: target {cost['t_target'] * 1e3:.1f} ms a token, draft {cost['t_draft'] * 1e3:.1f} ms "
          f"(c {cost['c']:.3f}), {args.gamma + 1} tokens in one batch {cost['t_verify'] * 1e3:.1f} ms "
          f"(r({args.gamma}) {cost['r']:.3f}); tau {tau:.2f}: the generation's speedup the two models allow "
          f"{out['predicted_generation']:.3f}x, measured {out['speedup']['generation']:.3f}x")
    print(f"llamacpp_speedup_end_to_end={out['speedup']['end_to_end']:.3f} "
          f"llamacpp_speedup_generation={out['speedup']['generation']:.3f} acceptance={out['acceptance']:.3f}")
    return out


if __name__ == "__main__":
    main()
