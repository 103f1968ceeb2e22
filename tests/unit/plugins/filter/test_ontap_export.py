"""Unit tests for kvcache.offload.ontap_export_clients: the ONTAP export rule names each node by its
own address (a host match), and a subnet only when the operator names it (issue #33)."""
import pytest

from ansible_collections.kvcache.offload.plugins.filter import ontap_export as o
from ansible_collections.kvcache.offload.plugins.filter.ontap_export import FilterModule


def clients(*args, **kwargs):
    result = o.ontap_export_clients(*args, **kwargs)
    assert result["problems"] == [], result["problems"]
    return result["clients"]


def problems(*args, **kwargs):
    return o.ontap_export_clients(*args, **kwargs)["problems"]


def test_registered():
    assert FilterModule().filters()["ontap_export_clients"] is o.ontap_export_clients


def test_each_node_is_a_host_match_in_inventory_order():
    nodes = {"gpu-a": "10.30.0.21", "gpu-b": ["10.30.0.22", "fd00:30::22"], "gpu-c": "10.30.0.23/32"}
    assert clients(nodes) == ["10.30.0.21/32", "10.30.0.22/32", "fd00:30::22/128", "10.30.0.23/32"]


def test_ipv6_is_written_compressed_and_duplicates_are_dropped():
    assert clients({"a": "fd00:0030:0000::0022", "b": "fd00:30::22/128"}) == ["fd00:30::22/128"]
    assert clients({"a": "10.30.0.21", "b": "10.30.0.21"}) == ["10.30.0.21/32"]


def test_the_inventory_list_replaces_the_host_vars():
    assert clients({"gpu-a": "10.30.0.21"}, ["10.30.0.9"]) == ["10.30.0.9/32"]


def test_a_subnet_is_added_only_from_cidrs_after_the_nodes():
    assert clients({"gpu-a": "10.30.0.21"}, [], ["10.30.0.0/24", "fd00:30::/64"]) == [
        "10.30.0.21/32", "10.30.0.0/24", "fd00:30::/64"]


@pytest.mark.parametrize("nodes, listed, says", [
    ({"gpu-a": "10.30.0.0/24"}, [], "gpu-a's ontap_nfs_client_address '10.30.0.0/24' is a subnet"),
    ({"gpu-a": ["10.30.0.21", "0.0.0.0/0"]}, [], "gpu-a's ontap_nfs_client_address '0.0.0.0/0' is a subnet"),
    ({}, ["10.30.0.0/24"], "ontap_nfs_clients item '10.30.0.0/24' is a subnet"),
    ({}, ["gpu-a.storage.example.com"], "'gpu-a.storage.example.com' is not an IPv4 or IPv6 address"),
    ({}, ["@gpunodes"], "'@gpunodes' is not an IPv4 or IPv6 address"),
    ({}, [".example.com"], "'.example.com' is not an IPv4 or IPv6 address"),
    ({"gpu-a": "10.30.0.300"}, [], "'10.30.0.300' is not an IPv4 or IPv6 address"),
])
def test_a_node_address_must_be_one_address(nodes, listed, says):
    found = problems(nodes, listed)
    assert len(found) == 1 and says in found[0], found
    assert "ontap_nfs_client_cidrs" in found[0] or "not an IPv4" in found[0]


@pytest.mark.parametrize("cidr, says", [
    ("0.0.0.0/0", "lets in every IPv4 host"),
    ("::/0", "lets in every IPv6 host"),
    ("10.0.0.0/8", "is wider than /16 (ontap_nfs_client_cidr_min_prefix_v4): it would let in 16777216 addresses"),
    ("fd00::/32", "is wider than /48 (ontap_nfs_client_cidr_min_prefix_v6)"),
    ("10.30.0.5/24", "has host bits set: write the network, 10.30.0.0/24"),
    ("10.30.0.0", "has no prefix length"),
    ("10.30.0.0/33", "is not a subnet"),
    ("storage-net", "has no prefix length"),
])
def test_a_subnet_must_be_a_network_no_wider_than_the_floor(cidr, says):
    found = problems({"gpu-a": "10.30.0.21"}, [], [cidr])
    assert len(found) == 1 and found[0].startswith("ontap_nfs_client_cidrs '%s'" % cidr) and says in found[0], found


def test_the_floors_can_be_moved():
    assert clients({}, [], ["10.0.0.0/8"], 8) == ["10.0.0.0/8"]
    assert problems({}, [], ["10.30.0.0/24"], 25)
    assert clients({}, [], ["fd00::/32"], 16, 32) == ["fd00::/32"]


def test_nothing_given_is_no_client_and_no_problem():
    assert o.ontap_export_clients({}) == {"clients": [], "problems": []}
    assert o.ontap_export_clients(None, None, None) == {"clients": [], "problems": []}
