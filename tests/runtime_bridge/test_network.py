"""What AMUX_RUNTIME_EGRESS_ALLOW lets through, and the plan of an isolated launch."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from runtime_bridge.config import RuntimeSettings
from runtime_bridge.network import AllowList, local_address


def test_entries_match_their_host_port_and_wildcards_only_subdomains() -> None:
    allow = AllowList.parse(" GitHub.com:443, *.pypi.org ,[::1]:8080,")
    assert allow.allows("github.com", 443)
    assert not allow.allows("github.com", 80)
    assert not allow.allows("api.github.com", 443)
    assert allow.allows("files.pypi.org", 443) and allow.allows("a.b.pypi.org", 80)
    assert not allow.allows("pypi.org", 443)
    assert not allow.allows("evilpypi.org", 443)
    assert allow.allows("::1", 8080)
    # Only an entry naming the host itself opens a local address.
    assert allow.names_explicitly("::1", 8080)
    assert not allow.names_explicitly("files.pypi.org", 443)
    assert str(allow) == "github.com:443,*.pypi.org,[::1]:8080"
    assert not AllowList.parse("").allows("github.com", 443)


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "::1", "0.0.0.0", "fe80::1"])
def test_loopback_link_local_and_unspecified_addresses_are_local(address: str) -> None:
    assert local_address(address)


def test_a_public_address_is_not_local() -> None:
    assert not local_address("140.82.112.3")
    assert not local_address("2606:50c0:8000::153")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("a*b.com", "a wildcard is written *.example.com"),
        ("*.", "a wildcard is written *.example.com"),
        ("github.com:http", "has no valid port"),
        ("github.com:70000", "has no valid port"),
        ("https://github.com/", "is not host or host:port"),
    ],
)
def test_a_malformed_allow_list_is_refused_at_start_with_the_entry(value: str, said: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(said)):
        RuntimeSettings(egress_allow=value)
