"""`patches/` applies cleanly to the installed sglang 0.5.23, and the checker
really detects a patch that does not apply."""

import os

from sglang_dflash import patches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_repo_patches_apply_cleanly():
    assert patches.check(os.path.join(REPO, "patches")) == []


def _patch_for(rel_path: str, old: str, new: str, context: str) -> str:
    return (
        f"--- a/{rel_path}\n+++ b/{rel_path}\n@@ -1,2 +1,2 @@\n-{old}\n+{new}\n {context}\n"
    )


def test_checker_accepts_a_good_patch_and_rejects_a_stale_one(tmp_path):
    target = patches.sglang_dir()
    first, second = open(os.path.join(target, "version.py")).read().split("\n")[:2]
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    (good / "0001-good.patch").write_text(_patch_for("version.py", first, first + "  # x", second))
    (bad / "0001-stale.patch").write_text(_patch_for("version.py", "this line is not there", "x", second))
    assert patches.check(str(good), target) == []
    failures = patches.check(str(bad), target)
    assert [name for name, _ in failures] == ["0001-stale.patch"]
