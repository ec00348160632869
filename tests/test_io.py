"""Atomic writes never leave a half-written file under the final name."""

import pytest

from spade_lib.io import atomic_path, atomic_write, write_json, write_text


def test_write_text_and_json(tmp_path):
    write_text(tmp_path / "a.txt", "hello")
    assert (tmp_path / "a.txt").read_text() == "hello"
    write_json(tmp_path / "b.json", {"b": 1, "a": 2})
    assert (tmp_path / "b.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_failed_write_keeps_old_content_and_no_temp_files(tmp_path):
    target = tmp_path / "x.txt"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_write(target, "w") as f:
            f.write("partial")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]


def test_atomic_path_renames_on_success_only(tmp_path):
    target = tmp_path / "t.bin"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"ok")
        assert not target.exists()
    assert target.read_bytes() == b"ok"
    with pytest.raises(ValueError):
        with atomic_path(tmp_path / "u.bin") as tmp:
            tmp.write_bytes(b"half")
            raise ValueError
    assert not (tmp_path / "u.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin"]


def test_written_files_get_normal_permissions(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        write_text(tmp_path / "p.txt", "x")
        with atomic_path(tmp_path / "q.bin") as tmp:
            tmp.write_bytes(b"x")
    finally:
        os.umask(mask)
    assert (tmp_path / "p.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "q.bin").stat().st_mode & 0o777 == 0o644
