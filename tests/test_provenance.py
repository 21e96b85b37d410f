"""A result's provenance names the code that ran (omni_tts.tools.provenance), in a real git repository made
here: the package's source digest equals its commit's, follows an edit, and names another commit's archive
unpacked in a subfolder, whose git HEAD is the enclosing repository's and is reported as differing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from omni_tts.tools.provenance import PACKAGE, provenance, rev_digest, tree_digest


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose package `omni_tts` has two commits -> (repo, first, second)."""
    repo = tmp_path / "repo"
    pkg = repo / "omni_tts"
    (pkg / "presets").mkdir(parents=True)
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "presets" / "p.yaml").write_text("k: 1\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    first = git(repo, "rev-parse", "HEAD")
    (pkg / "a.py").write_text("A = 2\n")
    git(repo, "commit", "-qam", "two")
    return repo, first, git(repo, "rev-parse", "HEAD")


def test_the_digest_names_the_commit_that_ran_wherever_it_ran(tmp_path: Path) -> None:
    repo, first, second = make_repo(tmp_path)
    pkg = repo / "omni_tts"
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"bytecode")  # left out
    assert tree_digest(pkg) == rev_digest(second, repo) != rev_digest(first, repo)
    clean = provenance(pkg)
    assert clean["commit"] == second and clean["commit_dirty"] is False
    assert clean["source_digest"] == rev_digest(second, repo)

    (pkg / "presets" / "p.yaml").write_text("k: 2\n")  # a preset is part of the code that runs
    edited = provenance(pkg)
    assert edited["commit"] == second and edited["commit_dirty"] is True
    assert edited["source_digest"] not in (rev_digest(first, repo), rev_digest(second, repo))

    before = repo / "devrun" / "before"  # the first commit's package unpacked inside the work tree
    before.mkdir(parents=True)
    tar = subprocess.run(["git", "archive", first, "omni_tts"], cwd=repo, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=tar, check=True)
    old = provenance(before / "omni_tts")
    assert old["commit"] == second and old["commit_dirty"] is True  # git's HEAD is not what ran here
    assert old["source_digest"] == rev_digest(first, repo)


def test_outside_a_repository_there_is_no_commit_but_still_a_digest(tmp_path: Path) -> None:
    pkg = tmp_path / "omni_tts"
    pkg.mkdir()
    (pkg / "a.py").write_text("A = 1\n")
    res = provenance(pkg)
    assert res["commit"] is None and res["commit_dirty"] is None
    assert res["device"] == (res["gpu"] or "cpu")
    assert res["source_digest"] == tree_digest(pkg) and res["command"] and res["utc"].endswith("Z")


def test_this_package_is_a_folder_of_sources() -> None:
    assert (PACKAGE / "tools" / "provenance.py").is_file() and len(tree_digest()) == 16


def test_the_command_prints_a_commits_digest_and_names_a_bad_one(capsys) -> None:
    from omni_tts.tools.cli import main

    assert main(["source-digest", "HEAD"]) == 0
    assert capsys.readouterr().out.split() == [rev_digest("HEAD"), "HEAD"]
    assert main(["source-digest", "no-such-commit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot read commit 'no-such-commit'")
