"""validation_report: builds the report, writes JSON + Markdown, returns changed=false by design."""
from __future__ import annotations

import json
import os
import sys

from ansible_collections.kvcache.offload.plugins.modules import validation_report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils"))
from validation_helpers import good_inputs  # noqa: E402  pylint: disable=wrong-import-position


def _args(tmp_path, **kw):
    inputs = good_inputs()
    args = dict(inputs)
    args.update(report_dir=str(tmp_path / "reports"), report_name="validation-%s" % inputs["run"]["id"])
    args.update(kw)
    return args


def test_writes_json_and_markdown_and_reports_no_change(run_module, tmp_path):
    result, failed = run_module(validation_report, _args(tmp_path))
    assert not failed, result
    assert result["changed"] is False
    assert result["result"] == "pass" and result["failed_required"] == []
    paths = result["paths"]
    with open(paths["json"], encoding="utf-8") as handle:
        data = json.load(handle)
    assert data == json.loads(json.dumps(result["report"]))
    assert os.path.basename(paths["json"]) == "validation-20261129T233000Z-000001.json"
    with open(paths["latest_markdown"], encoding="utf-8") as handle:
        assert handle.read().startswith("# kvcache.offload validation report")
    assert sorted(os.listdir(str(tmp_path / "reports"))) == sorted([
        "validation-20261129T233000Z-000001.json", "validation-20261129T233000Z-000001.md",
        "validation-latest.json", "validation-latest.md"])
    assert result["summary"][0].startswith("Validation 20261129T233000Z-000001: PASS")


def test_a_failed_stage_does_not_fail_the_module(run_module, tmp_path):
    args = _args(tmp_path)
    args["stages"]["tier_write"]["after"] = args["stages"]["tier_write"]["before"]
    result, failed = run_module(validation_report, args)
    assert not failed
    assert result["result"] == "fail" and result["failed_required"] == ["tier_write"]
    assert any("tier_write" in line and "FAIL" in line for line in result["summary"])


def test_check_mode_writes_nothing(run_module, tmp_path):
    result, failed = run_module(validation_report, _args(tmp_path), check_mode=True)
    assert not failed and result["paths"] == {}
    assert not (tmp_path / "reports").exists()


def test_unwritable_dir_fails_with_the_report(run_module, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result, failed = run_module(validation_report, _args(tmp_path, report_dir=str(blocker / "sub")))
    assert failed and "cannot write the report" in result["msg"]
    assert result["report"]["result"] == "pass"


def test_report_name_must_be_a_name(run_module, tmp_path):
    result, failed = run_module(validation_report, _args(tmp_path, report_name="../x"))
    assert failed
