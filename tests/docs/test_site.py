"""The documentation site builds strictly: a broken link, a missing page or an unparsable
docstring in the API reference fails the build, and so this test."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import widelimit as wl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("mkdocs") is None and not (Path(sys.executable).parent / "mkdocs").exists(),
                    reason="mkdocs not installed (the test extra installs it)")
def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    # the generated reference holds every public name with its docstring's first words
    for name in wl.__all__:
        if name == "datasets":
            continue
        assert f"widelimit.{name}" in api, name
    assert (tmp_path / "site" / "gallery" / "index.html").exists()


def test_every_public_name_is_in_the_api_page():
    text = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in wl.__all__ if n != "datasets" and f"::: widelimit.{n}\n" not in text]
    assert missing == []
