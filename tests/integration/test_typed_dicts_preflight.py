"""A typed public dict refuses a bad value in playbooks/preflight.yml, before any stage runs
(#18 item 4): container_runtime_docker_daemon_options is checked key by key by the
container_runtime `checks` entry point, which preflight runs where host preparation installs a
container engine: here the lab's nodes, with host_prep_gpu_containers (the lab's router runs
vllm_router, without an engine). Same harness as test_preflight_refusals.py: the lab inventory as
shipped, every host on the local connection, check mode; the running lab is never contacted."""
# the fixture, shared with test_preflight_refusals.py
from test_preflight_refusals import preflight  # noqa: F401  # pylint: disable=unused-import

from conftest import flat


def test_a_docker_daemon_option_dockerd_cannot_read_is_refused_in_preflight(preflight):  # noqa: F811
    rc, out, recaps = preflight({"host_prep_gpu_containers": True, "container_runtime_docker_daemon_options": {
        "log-driver": "json-file", "live-restore": "maybe"}})
    text = flat(out)
    assert rc != 0, out[-3000:]
    assert recaps and all(r["changed"] == 0 for r in recaps.values()), recaps
    # host_prep.yml's container engine play, run by preflight.yml in checks-only mode
    assert "Container engine on the router and on nodes that run GPU containers" in text
    assert "live-restore" in text and "container_runtime_docker_daemon_options" in text, out[-3000:]
    # every host of the play was refused (the nodes and the router, given an engine here): Ansible
    # ends the run there, before the storage and node checks
    assert "Engine runtime, LMCache and vLLM instances on every node" not in text, out[-3000:]


def test_the_same_inputs_with_valid_options_pass(preflight):  # noqa: F811
    rc, out, _recaps = preflight({"host_prep_gpu_containers": True, "container_runtime_docker_daemon_options": {
        "log-driver": "json-file", "live-restore": True}})
    assert rc == 0, out[-3000:]


def test_a_misspelt_docker_daemon_option_is_refused_in_preflight(preflight):  # noqa: F811
    rc, out, _recaps = preflight({"host_prep_gpu_containers": True,
                                  "container_runtime_docker_daemon_options": {"log-drivr": "json-file"}})
    text = flat(out)
    assert rc != 0, out[-3000:]
    assert "log-drivr" in text and "container_runtime_docker_daemon_options" in text, out[-3000:]


# observability_target_defaults and the scrape settings: checked by the observability role's
# `checks` entry point, which preflight runs on kvcache_monitoring (the lab: localhost). Before,
# no preflight play read them: a bad value stopped the monitoring play, after every stage ran.
def test_a_wrongly_typed_target_default_is_refused_in_preflight(preflight):  # noqa: F811
    rc, out, recaps = preflight({"observability_target_defaults": {
        "kvcache_lmcache_mode": "inprocess", "lmcache_mp_http_host": "127.0.0.1", "lmcache_mp_http_port": "eighty",
        "router_implementation": "vllm_router", "router_port": 8001, "router_metrics_port": 29000}})
    text = flat(out)
    assert rc != 0, out[-3000:]
    assert recaps and all(r["changed"] == 0 for r in recaps.values()), recaps
    assert "Monitoring configuration from the inventory" in text, out[-3000:]
    assert "lmcache_mp_http_port" in text and "observability_target_defaults" in text, out[-3000:]


def test_a_scrape_timeout_longer_than_the_interval_is_refused_in_preflight(preflight):  # noqa: F811
    rc, out, _recaps = preflight({"observability_scrape_interval": "15s", "observability_scrape_timeout": "1m"})
    text = flat(out)
    assert rc != 0, out[-3000:]
    assert "Monitoring configuration from the inventory" in text, out[-3000:]
    assert "observability_scrape_timeout" in text and "Fix:" in text, out[-3000:]
