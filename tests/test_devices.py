"""spade_lib.devices: the one CPU probe (what tells two hosts of one model name apart) and its parser; the one
clock and the one timing loop."""

import re
from pathlib import Path

import pytest

import spade_lib
from spade_lib import devices

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw
"""


def test_the_label_tells_two_hosts_of_one_name_apart():
    zen4 = devices.parse_cpuinfo(ZEN4, "32768K")
    assert zen4 == devices.CpuInfo("AMD EPYC", 25, 17, frozenset("fpu sse2 avx2 fma avx512f avx512bw".split()), 2**25)
    assert zen4.label() == "AMD EPYC (family 25 model 17, AVX-512, 32 MiB L3)"
    zen2 = devices.parse_cpuinfo(ZEN4.replace("25", "23").replace("17", "49").replace(" avx512f avx512bw", ""), "16384K")
    assert zen2.label() == "AMD EPYC (family 23 model 49, AVX2, 16 MiB L3)"
    assert zen2.label() != zen4.label() and zen2.name == zen4.name


def test_what_cannot_be_read_is_left_out_of_the_label():
    bare = devices.parse_cpuinfo("model name\t: Some CPU\n", None)
    assert bare.family is None and bare.flags == frozenset() and bare.l3_bytes is None
    assert bare.label() == "Some CPU"
    assert devices.parse_cpuinfo("", "garbage").l3_bytes is None
    assert devices.parse_cpuinfo("", "1536K").l3_bytes == 1536 * 1024 and devices.parse_cpuinfo("", "2M").l3_bytes == 2**21


def test_this_machine_is_probed_once():
    c = devices.cpu()
    assert c is devices.cpu() and c.name and c.label().startswith(c.name)


CLOCKS = re.compile(r"\btime\.(perf_counter|perf_counter_ns|time|time_ns|monotonic|monotonic_ns)\b"
                    r"|\bfrom time import\b[^\n]*\b(perf_counter|time|monotonic)\b")


def test_devices_clock_is_the_only_wall_clock_in_the_package_and_the_benchmarks():
    """Issue 55: every interval SPADE reports is read from one clock, ``devices.clock`` (which synchronises a
    CUDA device first); a second clock read elsewhere would time a GPU interval at its launch. ``process_time``
    (CPU seconds, a different quantity) is allowed."""
    package = Path(spade_lib.__file__).parent
    files = [*package.rglob("*.py"), *(package.parent / "benchmarks").glob("*.py")]  # the benchmarks too
    found = [f"{p.relative_to(package.parent)}:{i}: {line.strip()}"
             for p in sorted(files) if p != package / "devices.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if CLOCKS.search(line)]
    assert found == []
    assert CLOCKS.search("t0 = time.perf_counter()") and CLOCKS.search("from time import monotonic")
    assert not CLOCKS.search("cpu0 = time.process_time()")
    assert CLOCKS.search((package / "devices.py").read_text())  # the one clock itself


def test_time_in_turns_rotates_warms_up_and_bursts():
    """The one timing loop: warm-up rounds untimed, each round's order rotated, a burst's first call dropped,
    a fake clock's readings returned per name; ``self_timed`` takes the callable's own seconds."""
    order, now = [], [0.0]

    def fake_clock():
        return now[0]

    def forward(name, seconds):
        def call():
            order.append(name)
            now[0] += seconds
        return call

    out = devices.time_in_turns({"a": forward("a", 1.0), "b": forward("b", 2.0), "c": forward("c", 3.0)},
                                reps=3, warmup=1, clock=fake_clock)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {k: v.tolist() for k, v in out.items()} == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}
    order.clear()
    seconds = iter([5.0, 1.0, 3.0])  # a burst of three: the first (cold) call is dropped, the median of the rest
    out = devices.time_in_turns({"x": lambda: now.__setitem__(0, now[0] + next(seconds))}, reps=1, warmup=0,
                                burst=3, clock=fake_clock)
    assert out["x"].tolist() == [2.0]
    own = devices.time_in_turns({"y": lambda: 0.25}, reps=2, warmup=1, clock=fake_clock, self_timed=True)
    assert own["y"].tolist() == [0.25, 0.25]
    for bad in ({"reps": 0}, {"reps": 1, "burst": 0}, {"reps": 1, "warmup": -1}):
        with pytest.raises(ValueError, match=r"^(reps|burst|warmup): must be an integer"):
            devices.time_in_turns({"z": lambda: None}, **bad)


def test_bf16_matmul_is_offered_where_the_cpu_has_bf16_or_avx512_and_never_on_avx2():
    """``devices.bf16_matmul``: True where the CPU has AVX-512-BF16 or AMX-BF16 (native bf16 GEMM), False where it
    has no AVX-512 at all (AVX2 hosts: a bf16 GEMM there would not run on oneDNN's bf16 path); a bool either way."""
    from spade_lib import devices

    flags = devices.cpu().flags
    if not flags:
        pytest.skip("no /proc/cpuinfo flags here")
    got = devices.bf16_matmul()
    assert isinstance(got, bool)
    if flags & {"avx512_bf16", "amx_bf16"}:
        assert got, flags
    if not any(f.startswith("avx512") or f.startswith("amx") for f in flags):
        assert not got, flags
