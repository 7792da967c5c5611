"""createlocktable: creating the lock table, and printing it as code."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from django_dynlock import get_lock_client
from localdynamo.servers import (
    DUMMY_CREDENTIALS,
    DUMMY_REGION,
    LocalServer,
    dummy_client,
    start_dynalite,
    table_name,
)
from tests.support.aliases import alias_settings
from tests.support.commands import UNREACHABLE, fails, run
from tests.support.tools import need_dynalite


@pytest.fixture(scope="module")
def dynalite_creating_slowly() -> Iterator[LocalServer]:
    """A dynalite at its own default: new tables stay CREATING for 500 ms (the suite's
    dynalite makes them ACTIVE at once), so that the progress lines have something to show."""
    need_dynalite()
    with start_dynalite() as server:
        yield server


@pytest.fixture
def fresh(server, settings, request) -> Iterator[SimpleNamespace]:
    """The default alias pointing at a table that does not exist yet."""
    if is_dynalite(server):
        server = request.getfixturevalue("dynalite_creating_slowly")
    name = table_name()
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name)}
    boto = dummy_client(server.endpoint_url)
    yield SimpleNamespace(server=server, table=name, boto=boto)
    for _ in range(20):  # dynalite refuses to delete a table still CREATING
        try:
            boto.delete_table(TableName=name)
            break
        except boto.exceptions.ResourceInUseException:
            time.sleep(0.1)
        except Exception:
            break
    boto.close()


def is_dynalite(server) -> bool:
    return server.kind == "dynalite"


def test_createlocktable_creates_the_table_with_ttl(fresh):
    result = run("createlocktable")
    assert f"Creating table {fresh.table!r}" in result.out
    assert f"at {fresh.server.endpoint_url}, region us-east-1:" in result.out  # which table (issue 14)
    assert "PAY_PER_REQUEST" in result.out and "is ACTIVE after" in result.out
    table = fresh.boto.describe_table(TableName=fresh.table)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert table["TableStatus"] == "ACTIVE"
    if is_dynalite(fresh.server):
        # dynalite keeps tables CREATING for 500 ms (progress) and has no TTL (warn, succeed).
        assert "waiting for ACTIVE: CREATING" in result.out
        assert "has no TTL API" in result.err and "Warning:" in result.err
    else:
        assert "TTL enabled on 'gc_at'" in result.out and result.err == ""
        ttl = fresh.boto.describe_time_to_live(TableName=fresh.table)["TimeToLiveDescription"]
        assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "gc_at"}
    get_lock_client().acquire("works").release()


def test_createlocktable_is_idempotent(dynlock):
    result = run("createlocktable")
    assert f"Table {dynlock.options.table_name!r} already exists" in result.out
    assert "right key schema (ACTIVE, PAY_PER_REQUEST)" in result.out


def table_without_ttl(endpoint: str) -> tuple[str, Any]:
    """A lock-shaped table made by hand, without TTL, and a boto3 client to it."""
    name = table_name()
    boto = dummy_client(endpoint)
    boto.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    )
    return name, boto


def test_createlocktable_enables_ttl_on_an_existing_table(moto_server, settings):
    name, boto = table_without_ttl(moto_server.endpoint_url)
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    result = run("createlocktable")
    assert "already exists" in result.out and "TTL enabled on 'gc_at'" in result.out
    assert boto.describe_time_to_live(TableName=name)["TimeToLiveDescription"]["TimeToLiveStatus"] == "ENABLED"
    assert "TTL already enabled on 'gc_at'" in run("createlocktable").out
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_warns_when_ttl_is_on_another_attribute(moto_server, settings):
    name, boto = table_without_ttl(moto_server.endpoint_url)
    boto.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    result = run("createlocktable")
    assert "has TTL on 'ttl', not on 'gc_at'" in result.err
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_refuses_a_table_with_the_wrong_key_schema(fresh):
    fresh.boto.create_table(
        TableName=fresh.table,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
    )
    error = fails("createlocktable")
    assert error.returncode == 3
    assert "wrong key schema: partition key is 'pk', expected 'key'" in str(error)


def test_createlocktable_provisioned(fresh):
    result = run("createlocktable", "--billing-mode", "PROVISIONED", "--read", "2", "--write", "3")
    assert "PROVISIONED (read 2, write 3)" in result.out
    table = fresh.boto.describe_table(TableName=fresh.table)["Table"]
    throughput = table["ProvisionedThroughput"]
    assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (2, 3)
    # Asking for another billing mode later does not change an existing table: it says so.
    again = run("createlocktable", "--billing-mode", "pay_per_request")
    assert "already exists" in again.out and "--billing-mode PAY_PER_REQUEST was not applied" in again.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--billing-mode", "PROVISIONED"], "needs --read N and --write N"),
        (["--billing-mode", "PROVISIONED", "--read", "1"], "needs --read N and --write N"),
        (["--read", "1", "--write", "1"], "only apply with --billing-mode PROVISIONED"),
        (["--billing-mode", "PROVISIONED", "--read", "0", "--write", "1"], "expected a whole number >= 1"),
        (["--billing-mode", "SOMETIMES"], "invalid choice"),
        (["--timeout", "0"], "expected a number of seconds > 0"),
        (["--print", "yaml"], "invalid choice"),
    ],
)
def test_createlocktable_bad_arguments(settings, args, message):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "never-created")}
    error = fails("createlocktable", *args)
    assert error.returncode == 2 and message in str(error)


def test_createlocktable_no_wait(fresh):
    result = run("createlocktable", "--no-wait")
    if is_dynalite(fresh.server):
        assert "Not waiting (--no-wait)" in result.out and "is CREATING" in result.out
        assert "waiting for ACTIVE" not in result.out
    else:  # moto creates tables ACTIVE at once, so TTL is enabled right away
        assert "TTL enabled on 'gc_at'" in result.out


def test_createlocktable_timeout(settings):
    # A dynalite of its own whose tables stay CREATING for 2 s: no race with a slow machine.
    need_dynalite()
    with start_dynalite(extra_args=["--createTableMs", "2000"]) as slow:
        name = table_name()
        settings.DYNLOCK = {"default": alias_settings(slow.endpoint_url, name)}
        error = fails("createlocktable", "--timeout", "0.2")
        assert error.returncode == 3 and f"table {name!r} is still CREATING after 0.2s" in str(error)
        again = run("createlocktable", "--timeout", "10").out  # a re-run finishes the job
        assert "already exists" in again and "waiting for ACTIVE: CREATING" in again and "is ACTIVE after" in again


def test_createlocktable_verbosity_0_is_quiet(fresh):
    result = run("createlocktable", verbosity=0)
    assert result.out == ""


def printed(*args: str) -> str:
    return run("createlocktable", "--print", *args).out


def test_createlocktable_print_calls_nothing(settings):
    # An endpoint nobody listens on: --print must not need it.
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "locks-as-code", KEY_ATTRIBUTE="pk", TTL_ATTRIBUTE="on")}
    everything = printed()
    assert "# CreateTable request" in everything and "update-time-to-live" in everything
    assert "Type: AWS::DynamoDB::Table" in everything
    assert json.loads(printed("create-table")) == {
        "TableName": "locks-as-code",
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST",
    }
    assert json.loads(printed("ttl")) == {
        "TableName": "locks-as-code",
        "TimeToLiveSpecification": {"Enabled": True, "AttributeName": "on"},
    }
    provisioned = json.loads(printed("create-table", "--billing-mode", "PROVISIONED", "--read", "4", "--write", "5"))
    assert provisioned["ProvisionedThroughput"] == {"ReadCapacityUnits": 4, "WriteCapacityUnits": 5}
    import yaml

    stack = yaml.safe_load(printed("cloudformation"))
    properties = stack["Resources"]["DynLockTable"]["Properties"]
    # "on" is quoted: unquoted YAML would read it as the boolean true.
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "on", "Enabled": True}


def default_timeouts(alias: dict) -> dict:
    """The alias with the default CLIENT_CONFIG (fitted to its 10 s lease): the suite's own
    timeouts draw W001, and these tests run every check at the warning level."""
    return {name: value for name, value in alias.items() if name != "CLIENT_CONFIG"}


def test_createlocktable_print_requests_make_a_working_table(moto_server, settings):
    name = table_name()
    settings.DYNLOCK = {"default": default_timeouts(alias_settings(moto_server.endpoint_url, name))}
    boto = dummy_client(moto_server.endpoint_url)
    boto.create_table(**json.loads(printed("create-table")))
    boto.update_time_to_live(**json.loads(printed("ttl")))
    assert run("check", "--deploy", "--tag", "dynlock_table", "--fail-level", "WARNING").err == ""
    get_lock_client().acquire("k").release()
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_print_cloudformation_makes_a_working_table(moto_server, settings):
    import boto3
    from django.core import checks

    name = table_name()
    settings.DYNLOCK = {"default": default_timeouts(alias_settings(moto_server.endpoint_url, name))}
    template = printed("cloudformation")
    cloudformation = boto3.client(
        "cloudformation",
        endpoint_url=moto_server.endpoint_url,
        region_name=DUMMY_REGION,
        **DUMMY_CREDENTIALS,
    )
    cloudformation.create_stack(StackName=f"stack-{name}", TemplateBody=template)
    ids = [m.id for m in checks.run_checks(tags=["dynlock_table"], include_deployment_checks=True)]
    assert ids in ([], ["dynlock.W101"])  # moto's CloudFormation ignores TimeToLiveSpecification
    get_lock_client().acquire("k").release()
    cloudformation.close()


@pytest.mark.slow
@pytest.mark.parametrize("billing", [[], ["--billing-mode", "PROVISIONED", "--read", "1", "--write", "1"]])
def test_createlocktable_print_cloudformation_passes_cfn_lint(settings, billing):
    # What moto skips, CloudFormation's resource schema checks (cfn-lint comes with moto[server]).
    cfnlint = pytest.importorskip("cfnlint.api")
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "locks-as-code")}
    problems = [m for m in cfnlint.lint_all(printed("cloudformation", *billing)) if m.rule.id[0] in "EW"]
    assert problems == []


RUNTIME = {
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchGetItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:Scan",
}
DEPLOY = {"dynamodb:CreateTable", "dynamodb:UpdateTimeToLive", "dynamodb:DescribeTable", "dynamodb:DescribeTimeToLive"}


@pytest.mark.parametrize("which, actions", [("runtime", RUNTIME), ("deploy", DEPLOY)])
def test_createlocktable_prints_least_privilege_policies(settings, which, actions):
    # issue 31: no policy was documented; the runtime one has no table-level action
    settings.DYNLOCK = {"default": {**alias_settings(UNREACHABLE, "locks"), "REGION_NAME": "eu-west-1"}}
    for account, arn in [
        ([], "arn:aws:dynamodb:eu-west-1:*:table/locks"),
        (["--account-id", "123456789012"], "arn:aws:dynamodb:eu-west-1:123456789012:table/locks"),
    ]:
        document = json.loads(printed(f"iam-{which}", *account))
        assert document["Version"] == "2012-10-17"
        (statement,) = document["Statement"]
        assert statement["Effect"] == "Allow" and statement["Resource"] == arn
        assert set(statement["Action"]) == actions and len(statement["Action"]) == len(actions)


@pytest.fixture(scope="module")
def parliament() -> Any:
    """parliament, which checks a policy against the IAM actions, resources and conditions
    AWS documents (its own copy: no network)."""
    import warnings

    # parliament 1.6.4's own import warns, and the suite makes warnings errors: it reads its
    # data through pkg_resources (deprecated by setuptools), leaves those files for the
    # garbage collector to close, and has regexes with invalid escapes (compiled on first
    # import: DeprecationWarning on Python 3.11, SyntaxWarning from 3.12).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "pkg_resources is deprecated", UserWarning)
        warnings.filterwarnings("ignore", "unclosed file", ResourceWarning)
        warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
        warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
        import parliament

    return parliament


@pytest.mark.parametrize("account", [[], ["--account-id", "123456789012"]])
@pytest.mark.parametrize("region", ["eu-west-1", "cn-north-1", "us-gov-west-1"])
@pytest.mark.parametrize("which", ["runtime", "deploy"])
def test_the_printed_policies_pass_parliament(settings, parliament, which, region, account):
    # issue 35: the runtime policy granted dynamodb:TransactWriteItems, an action IAM does not
    # have ("Unknown action"), and not ConditionCheckItem, which lease.condition_check() needs.
    settings.DYNLOCK = {"default": {**alias_settings(UNREACHABLE, "locks"), "REGION_NAME": region}}
    policy = parliament.analyze_policy_string(printed(f"iam-{which}", *account))
    findings = [(finding.issue, finding.detail, finding.location) for finding in policy.findings]
    assert findings == []


def test_the_policies_in_docs_security_md_are_the_printed_ones(settings):
    from pathlib import Path

    settings.DYNLOCK = {"default": {**alias_settings(UNREACHABLE, "django_dynlock"), "REGION_NAME": "eu-west-1"}}
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for which in ("runtime", "deploy"):
        assert printed(f"iam-{which}", "--account-id", "123456789012").strip() in text, which


@pytest.mark.parametrize(
    "args, message",
    [
        (["--account-id", "123456789012"], "--account-id only applies with --print iam-runtime or --print iam-deploy"),
        (["--print", "iam-runtime", "--account-id", "12345"], "--account-id must be 12 digits, got '12345'"),
    ],
)
def test_createlocktable_account_id_usage(settings, args, message):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "locks")}
    error = fails("createlocktable", *args)
    assert error.returncode == 2 and str(error) == message
