"""Unit tests for the internal_address filter (kvcache.offload)."""
import pytest

from ansible_collections.kvcache.offload.plugins.filter.internal_address import FilterModule, internal_address, url_host

FACTS = {"default_ipv4": {"address": "10.1.2.3", "interface": "ens1f0"},
         "default_ipv6": {"address": "fd00::3", "interface": "ens1f0"}}


@pytest.mark.parametrize("host", ["10.0.0.11", "172.29.100.11", "fd00::11", "::1", " 10.0.0.11 "])
def test_an_ip_inventory_address_is_used_as_it_is(host):
    assert internal_address(host, FACTS) == host.strip()


@pytest.mark.parametrize("host", ["gpu1", "gpu1.example.com", "", None, "10.0.0.256", "[fd00::11]"])
def test_a_name_falls_back_to_the_default_route_address(host):
    assert internal_address(host, FACTS) == "10.1.2.3"


def test_ipv6_only_host_uses_its_default_ipv6_address():
    assert internal_address("gpu1", {"default_ipv4": {}, "default_ipv6": {"address": "fd00::3"}}) == "fd00::3"


@pytest.mark.parametrize("facts", [None, {}, {"default_ipv4": {}}, {"default_ipv4": {"address": "not-an-ip"}},
                                   {"default_ipv4": "10.1.2.3"}])
def test_nothing_known_gives_empty_never_every_interface(facts):
    got = internal_address("gpu1", facts)
    assert got == ""
    assert got not in ("0.0.0.0", "::")


@pytest.mark.parametrize("bind, host", [("10.0.0.11", "10.0.0.11"), ("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"),
                                        ("", "127.0.0.1"), (None, "127.0.0.1"), ("fd00::11", "[fd00::11]"),
                                        ("[fd00::11]", "[fd00::11]"), (" 10.0.0.11\n", "10.0.0.11")])
def test_url_host_reaches_a_bind_address_from_the_same_host(bind, host):
    assert url_host(bind) == host


def test_the_filters_are_registered():
    assert FilterModule().filters() == {"internal_address": internal_address, "url_host": url_host}
