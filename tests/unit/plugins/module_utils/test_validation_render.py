"""The validation report as text: summary lines and Markdown (module_utils/validation_render)."""
from __future__ import annotations

from ansible_collections.kvcache.offload.plugins.module_utils.validation_render import render_markdown, summary_lines

from validation_helpers import B, build, fixture, good_inputs, metrics, node, stage


def test_summary_and_markdown():
    report = build(good_inputs())
    lines = summary_lines(report)
    assert lines[0].startswith("Validation 20261129T233000Z-000001: PASS")
    assert any(" 5 router " in line and "SKIPPED" in line for line in lines)
    md = render_markdown(report)
    assert md.startswith("# kvcache.offload validation report")
    assert "| 4 | The same prefix on another instance is a hit from the shared tier | PASS |" in md
    assert "| lab-node2/cpu0 | the fleet's seed | /opt/kvcache/models/tiny-qwen2 | 1 | auto | ExampleConnector | none |" in md
    assert "123" not in md  # the seed's value is a fleet secret


def test_telemetry_missing_is_a_finding_and_explains_stage_1():
    inputs = good_inputs()
    bad = fixture("lab-node2-cpu0.env").replace("VLLM_NO_USAGE_STATS=1\n", "")
    inputs["nodes"][1] = node("lab-node2", bad)
    report = build(inputs)
    assert report["result"] == "pass"
    assert [c["id"] for c in report["causes"]] == ["telemetry_vars_missing"]
    md = render_markdown(report)
    assert "Other findings" in md and "VLLM_NO_USAGE_STATS" in md


def test_no_external_tokens_fails_stage_4_without_config_cause():
    inputs = good_inputs()
    by_source = {"local_compute": 2300.0, "external_kv_transfer": 0.0}
    inputs["stages"]["cross_instance"]["metrics"] = metrics({B["url"]: {"prompt_tokens_by_source": by_source}})
    report = build(inputs)
    s4 = stage(report, "cross_instance")
    assert s4["status"] == "fail" and "loaded 0 tokens" in s4["reason"]
    md = render_markdown(report)
    assert "No known cause detected" in md
