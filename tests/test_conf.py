"""The DYNLOCK setting: defaults, lazy reading, and one test per system check id."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
from botocore.config import Config
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_dynlock import ConfigurationError, get_lock_client
from django_dynlock.conf import DEFAULTS, get_options, problems
from django_dynlock.engine.options import call_budget
from localdynamo.servers import DUMMY_REGION

GOOD = {"REGION_NAME": DUMMY_REGION}


def ids(setting) -> list[str]:
    return [m.id for m in checks.run_checks(tags=["dynlock"])]


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("not a dict", "dynlock.E001"),
        ({"reports": {}}, "dynlock.E002"),
        ({"default": []}, "dynlock.E003"),
        ({"default": {"LEASE_DURATIN": 10}}, "dynlock.E004"),
        ({"default": {"TABLE_NAME": 5}}, "dynlock.E005"),
        ({"default": {"LEASE_DURATION": "30"}}, "dynlock.E005"),
        ({"default": {"WAIT_TIMEOUT": True}}, "dynlock.E005"),
        ({"default": {"SESSION_OPTIONS": "profile"}}, "dynlock.E005"),
        ({"default": {"LEASE_DURATION": 0}}, "dynlock.E006"),
        ({"default": {"LEASE_DURATION": math.nan}}, "dynlock.E006"),
        ({"default": {"WAIT_TIMEOUT": -1}}, "dynlock.E006"),
        ({"default": {"RETENTION": math.inf}}, "dynlock.E006"),
        ({"default": {"SAFETY_MARGIN": 0.5}}, "dynlock.E006"),
        ({"default": {"LEASE_DURATION": 10, "HEARTBEAT_PERIOD": 5}}, "dynlock.E007"),
        ({"default": {"TABLE_NAME": "x"}}, "dynlock.E008"),
        ({"default": {"TABLE_NAME": "bad name!"}}, "dynlock.E008"),
        ({"default": {"CLIENT_CONFIG": {"read_timeut": 1}}}, "dynlock.E009"),
        ({"default": {"SESSION_OPTIONS": {"profile": "x"}}}, "dynlock.E010"),
        ({"default": {"SESSION_OPTIONS": {"aws_access_key_id": "AKID"}}}, "dynlock.E010"),
        ({"default": {"ENDPOINT_URL": "localhost:8000"}}, "dynlock.E011"),
        ({"default": {"KEY_PREFIX": "p" * 2048}}, "dynlock.E012"),
        ({"default": {"MIN_RETRY_DELAY": 1.0, "MAX_RETRY_DELAY": 0.5}}, "dynlock.E013"),
        ({"default": {"TTL_ATTRIBUTE": "owner"}}, "dynlock.E014"),
        ({"default": {"KEY_ATTRIBUTE": "k", "TTL_ATTRIBUTE": "k"}}, "dynlock.E014"),
        ({"default": {"CLIENT_CONFIG": {"read_timeout": 60, "connect_timeout": 60}}}, "dynlock.W001"),
        ({"default": {"MAX_CLOCK_SKEW": 1.0}}, "dynlock.W002"),
        ({"default": {"LEASE_DURATION": 5}}, "dynlock.W001"),  # shorter than our timeouts go
        ({"default": {"REGION_NAME": "eu-wset-1"}}, "dynlock.W004"),
    ],
)
def test_each_check_id_fires_on_its_bad_setting(settings, setting, expected):
    settings.DYNLOCK = setting
    messages = checks.run_checks(tags=["dynlock"])
    assert expected in [m.id for m in messages], messages
    message = next(m for m in messages if m.id == expected)
    assert (message.level >= checks.ERROR) == (".E" in expected)
    assert message.hint or expected == "dynlock.E014"


def test_unknown_key_suggests_the_right_name(settings):
    settings.DYNLOCK = {"default": {**GOOD, "LEASE_DURATIN": 10}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert "LEASE_DURATIN" in message.msg and "LEASE_DURATION" in message.hint


def test_endpoint_with_credentials_is_not_echoed(settings):
    settings.DYNLOCK = {"default": {"ENDPOINT_URL": "ftp://user:s3cret@host"}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.E011" and "s3cret" not in message.msg


@pytest.mark.parametrize(
    "name, value, secret, type_name",
    [
        # issue 14: a mapping that is not a dict, holding keys; a bytes URL with a password
        ("SESSION_OPTIONS", MappingProxyType({"aws_secret_access_key": "TOPSECRET"}), "TOPSECRET", "mappingproxy"),
        ("ENDPOINT_URL", b"http://user:s3cret@127.0.0.1:8000", "s3cret", "bytes"),
        ("CLIENT_CONFIG", [("proxies", {"https": "http://user:s3cret@proxy:3128"})], "s3cret", "list"),
    ],
)
def test_a_setting_of_the_wrong_type_that_may_hold_secrets_is_named_by_its_type_only(
    settings, name, value, secret, type_name
):
    settings.DYNLOCK = {"default": {**GOOD, name: value}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.E005" and message.msg.endswith(f"got {type_name}.")
    assert secret not in message.msg + (message.hint or "")
    with pytest.raises(ConfigurationError) as raised:
        get_lock_client()
    assert secret not in str(raised.value)


def test_a_setting_of_the_wrong_type_with_no_secret_shows_its_value(settings):
    settings.DYNLOCK = {"default": {**GOOD, "LEASE_DURATION": "30"}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.E005" and message.msg.endswith("got '30'.")


@pytest.mark.parametrize(
    "alias, warned",
    [
        ({}, True),  # against AWS, the region of each host's environment: issue 14
        ({"REGION_NAME": "eu-west-1"}, False),
        ({"ENDPOINT_URL": "http://127.0.0.1:8001"}, False),  # a local server: one table whatever the region
    ],
)
def test_an_implicit_region_against_aws_is_a_warning(settings, alias, warned):
    settings.DYNLOCK = {"default": alias}
    found = checks.run_checks(tags=["dynlock"])
    assert [m.id for m in found] == (["dynlock.W003"] if warned else [])
    if warned:
        assert "never exclude each other" in found[0].msg and "REGION_NAME" in found[0].hint


@pytest.mark.parametrize("region", ["us east 1", "eu-west-1/", "-eu-west-1", "é"])
def test_a_malformed_region_name_is_a_check_error(settings, region):
    # issue 14: it surfaced only at the first request, as a retryable backend error
    settings.DYNLOCK = {"default": {"REGION_NAME": region}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.E015" and repr(region) in message.msg


def test_a_flat_setting_gets_the_nested_form_as_its_hint(settings):
    # issue 31: the hint read DYNLOCK = {"TABLE_NAME": {"TABLE_NAME": "django_dynlock"}}
    settings.DYNLOCK = {"TABLE_NAME": "x", "REGION_NAME": "eu-west-1"}
    found = checks.run_checks(tags=["dynlock"])
    assert sorted(m.id for m in found) == ["dynlock.E002", "dynlock.E003", "dynlock.E003"]
    nested = 'DYNLOCK = {"default": {"TABLE_NAME": ..., "REGION_NAME": ...}}'
    assert all(nested in m.hint for m in found), [m.hint for m in found]
    assert not any('{"TABLE_NAME": {' in m.hint for m in found)


def test_the_table_tag_alone_fails_on_a_broken_setting(settings):
    # issue 31: README's verification command said "no issues" (exit 0) on a flat setting
    settings.DYNLOCK = {"TABLE_NAME": "x", "REGION_NAME": "eu-west-1"}
    with pytest.raises(SystemCheckError, match="dynlock.E002"):
        call_command("check", "--deploy", "--tag", "dynlock_table")


@pytest.mark.parametrize("region, close", [("eu-wset-1", "eu-west-1"), ("Ireland", None)])
def test_a_region_botocore_does_not_know_for_dynamodb_is_a_warning(settings, region, close):
    settings.DYNLOCK = {"default": {"REGION_NAME": region}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.W004" and repr(region) in message.msg
    assert (f"Did you mean {close!r}?" in message.hint) if close else "eu-west-1" in message.hint


@pytest.mark.parametrize("region", ["eu-west-1", "cn-north-1", "us-gov-west-1"])
def test_regions_of_every_partition_are_known(settings, region):
    settings.DYNLOCK = {"default": {"REGION_NAME": region}}
    assert checks.run_checks(tags=["dynlock"]) == []


def test_an_unknown_region_against_a_local_endpoint_is_not_warned_about(settings):
    settings.DYNLOCK = {"default": {"REGION_NAME": "local", "ENDPOINT_URL": "http://127.0.0.1:8001"}}
    assert checks.run_checks(tags=["dynlock"]) == []


@pytest.mark.parametrize("lease", [10, 12.5, 20])
def test_a_short_lease_with_default_client_settings_passes(settings, lease):
    # issue 31: LEASE_DURATION 10 fired W001 about a CLIENT_CONFIG never set (and E007)
    settings.DYNLOCK = {"default": {**GOOD, "LEASE_DURATION": lease}}
    call_command("check")
    assert checks.run_checks(tags=["dynlock"]) == []
    options = get_options()
    # The defaults are fitted to the lease: one call within half of it, the heartbeat a third.
    assert call_budget(options.client_config) <= lease / 2
    assert options.heartbeat_period == min(10.0, lease / 3)
    client = get_lock_client()
    assert client.options.client_config.read_timeout == options.client_config.read_timeout


def test_a_client_config_set_by_the_user_is_not_fitted(settings):
    settings.DYNLOCK = {"default": {**GOOD, "LEASE_DURATION": 10, "CLIENT_CONFIG": {}}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.W001" and "CLIENT_CONFIG" in message.msg
    assert get_options().client_config.read_timeout == 2.0


def test_a_lease_too_short_for_the_default_timeouts_names_the_lease(settings):
    settings.DYNLOCK = {"default": {**GOOD, "LEASE_DURATION": 5}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.W001" and "LEASE_DURATION" in message.msg and "CLIENT_CONFIG" in message.hint


def test_defaults_warn_only_that_the_region_is_implicit(settings):
    del settings.DYNLOCK
    assert [p.id for p in problems()] == ["dynlock.W003"]
    options = get_options()
    assert options.table_name == DEFAULTS["TABLE_NAME"] and options.lease_duration == 30.0


def test_good_settings_with_a_botocore_config_are_clean(settings):
    settings.DYNLOCK = {
        "default": {**GOOD, "CLIENT_CONFIG": Config(read_timeout=1)},
        "reports": {**GOOD, "TABLE_NAME": "reports"},
    }
    assert checks.run_checks(tags=["dynlock"]) == []
    assert get_options().client_config.read_timeout == 1
    assert get_options().client_config.connect_timeout == 1.0  # our default kept under the user's


def test_settings_are_reread_when_overridden(settings):
    settings.DYNLOCK = {"default": {**GOOD, "TABLE_NAME": "first"}}
    assert get_lock_client().options.table_name == "first"
    settings.DYNLOCK = {"default": {**GOOD, "TABLE_NAME": "second"}}
    assert get_lock_client().options.table_name == "second"


def test_bad_alias_refuses_to_build_a_client(settings):
    settings.DYNLOCK = {"default": {"LEASE_DURATION": -1}}
    with pytest.raises(ConfigurationError, match=r"LEASE_DURATION.*dynlock.E006"):
        get_lock_client()
    with pytest.raises(ConfigurationError, match="no alias 'nope'"):
        get_lock_client("nope")


def test_secrets_never_in_repr(settings):
    settings.DYNLOCK = {
        "default": {
            **GOOD,
            "SESSION_OPTIONS": {"aws_secret_access_key": "TOPSECRET", "aws_access_key_id": "AKIDX"},
            "ENDPOINT_URL": "http://user:s3cret@127.0.0.1:8000",
        }
    }
    client = get_lock_client()
    assert "TOPSECRET" not in repr(client) and "TOPSECRET" not in repr(client.options)
    assert "AKIDX" not in repr(client.options)
    # issue 14: the endpoint of a proxy with a password, shown without it
    assert "s3cret" not in repr(client.options) and "s3cret" not in repr(client)
    assert "endpoint_url='http://127.0.0.1:8000'" in repr(client.options)


def test_manage_py_check_fails_on_errors(settings):
    settings.DYNLOCK = {"default": {"TABLE_NAME": "x"}}
    with pytest.raises(SystemCheckError, match="dynlock.E008"):
        call_command("check")


def test_importing_the_app_reads_no_settings():
    import subprocess
    import sys

    # With settings not configured at all, importing must not touch them.
    code = "import django_dynlock, django_dynlock.checks, django_dynlock.conf; print('ok')"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "."},
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("wire", ["botocore", "Boto3", ""])
def test_an_unknown_wire_is_a_check_error(settings, wire):
    settings.DYNLOCK = {"default": {"REGION_NAME": "eu-west-1", "WIRE": wire}}
    (message,) = checks.run_checks(tags=["dynlock"])
    assert message.id == "dynlock.E016" and repr(wire) in message.msg and "'dynlock', 'boto3'" in message.msg


def test_wire_boto3_is_a_valid_setting(settings):
    settings.DYNLOCK = {"default": {"REGION_NAME": "eu-west-1", "WIRE": "boto3"}}
    assert checks.run_checks(tags=["dynlock"]) == []
    assert get_options().wire == "boto3"
