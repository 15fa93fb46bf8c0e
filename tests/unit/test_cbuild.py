"""controllers.cbuild: a C program is rebuilt when a source or header changes, reused when
not, and a compile error is one BuildError line carrying the compiler's message."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from controllers import cbuild
from lab.machine import state


def sources(tmp_path: Path, value: int) -> Path:
    (tmp_path / "answer.h").write_text(f"#define ANSWER {value}\n")
    src = tmp_path / "main.c"
    src.write_text('#include "answer.h"\nint main(void) { return ANSWER; }\n')
    return src


def test_built_once_and_again_when_a_header_changes(tmp_path: Path) -> None:
    out = tmp_path / "build"
    first = cbuild.build("answer", [sources(tmp_path, 7)], build_dir=out)
    assert subprocess.run([first]).returncode == 7
    mtime = first.stat().st_mtime_ns
    assert cbuild.build("answer", [sources(tmp_path, 7)], build_dir=out) == first
    assert first.stat().st_mtime_ns == mtime                   # reused, not rebuilt
    second = cbuild.build("answer", [sources(tmp_path, 9)], build_dir=out)
    assert second != first and subprocess.run([second]).returncode == 9


def test_a_compile_error_names_the_program_and_says_why(tmp_path: Path) -> None:
    src = tmp_path / "bad.c"
    src.write_text("int main(void) { return undefined_name; }\n")
    with pytest.raises(cbuild.BuildError, match=r"^bad: .*undefined_name") as caught:
        cbuild.build("bad", [src], build_dir=tmp_path / "build")
    assert len(str(caught.value).splitlines()) == 1
    assert list((tmp_path / "build").iterdir()) == []          # no half-built file left


def test_an_object_for_another_target_takes_only_its_own_flags(tmp_path: Path) -> None:
    src = tmp_path / "obj.c"
    src.write_text("int unused_but_fine(int x) { int y; return x; }\n")  # -Wall would fail
    obj = cbuild.compile_object("obj", src, flags=["-O2"], build_dir=tmp_path / "build")
    assert obj.suffix == ".o" and obj.read_bytes()[:4] == b"\x7fELF"
    assert cbuild.compile_object("obj", src, flags=["-O2"], build_dir=tmp_path / "build") == obj


def test_the_default_build_dir_is_not_under_the_state_dir_on_run() -> None:
    """Programs are built where they can be run: /run is mounted noexec on systemd
    machines (the lab's state lives there), /var/cache is not."""
    assert not cbuild.BUILD_DIR.is_relative_to(state.STATE_DIR)
    assert Path("/var/cache/fabriclab/build") == cbuild.BUILD_DIR or \
        "FABRICLAB_BUILD_CACHE" in os.environ
