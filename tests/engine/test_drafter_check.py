"""The GPU check's drafter section (engine/measure/drafter_check.py), on this machine's backend: the synthetic MTP
files answer as plain decoding does and keep what they are built to; a row that breaks a promise fails the check."""

from __future__ import annotations

import json

from engine.measure import drafter_check, synthetic


def test_every_synthetic_file_answers_as_plain_decoding_and_keeps_its_share(tmp_path):
    out = tmp_path / "drafters.json"
    assert drafter_check.main(["--out", str(out), "--synthetic", str(tmp_path / "files"), "--threads", "1"]) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(synthetic.MTP_FILES)
    assert all(r["ok"] and r["identical"] and r["drafted"] > 0 for r in rows.values()), rows
    assert rows["mtp-agreeing"]["accepted"] == rows["mtp-agreeing"]["drafted"]
    assert 0 < rows["mtp-half-context"]["accepted"] < rows["mtp-half-context"]["drafted"]


def test_a_row_fails_on_the_wrong_share_or_without_the_gpu_it_requires(tmp_path):
    path = str(synthetic.write_all(tmp_path, ["mtp-agreeing"])["mtp-agreeing"])
    args = drafter_check.parse_args(["--out", "-", "--threads", "1", "--max-tokens", "16"])
    assert drafter_check.check("mtp-agreeing", path, "mtp", None, args)["ok"]
    assert not drafter_check.check("mtp-random", path, "mtp", None, args)["ok"]  # kept far more than a random head
    args.require_gpu = True
    row = drafter_check.check("mtp-agreeing", path, "mtp", None, args)
    assert row["ok"] is (row["all_layers_offloaded"] is True)  # False here on a CPU-only build
    missing = drafter_check.check("gone", str(tmp_path / "gone.gguf"), "mtp", None, args)
    assert not missing["ok"] and "gone.gguf" in missing["error"]
