"""Turn botocore's exceptions into django-dynlock's typed errors.

One place decides what each failure means for a lock: whether retrying may help,
and whether the request may have been applied although we saw no reply (then a
retry must recognise its own earlier success, which our conditions allow).
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import urllib3.exceptions
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    InvalidRegionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)

from ..exceptions import (
    BackendError,
    ConfigurationError,
    CredentialsError,
    DynLockError,
    InvalidArgument,
    TableNotFound,
    TableSchemaError,
)
from . import iam

RETRYABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "TransactionConflictException",
        "TransactionInProgressException",
        # A global table with multi-Region strong consistency: another Region is writing
        # the item. AWS documents it as rejected (not applied) and retryable.
        "ReplicatedWriteConflictException",
    }
)
# DynamoDB is short of capacity (a partition's, the table's, or the account's): back off.
THROTTLING_CODES = frozenset({"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"})
CREDENTIAL_CODES = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "MissingAuthenticationToken",
        "InvalidClientTokenId",
        "IncompleteSignature",
    }
)


# What SESSION_OPTIONS needs against a local server (README's "Against a local DynamoDB").
LOCAL_KEYS = "SESSION_OPTIONS = {'aws_access_key_id': 'local', 'aws_secret_access_key': 'local'}"


def is_aws(endpoint: str | None) -> bool:
    """Whether an ENDPOINT_URL is AWS's (none: boto3 picks AWS's for the region)."""
    if not endpoint:
        return True
    host = (urlsplit(endpoint).hostname or "").lower()
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn", ".api.aws"))


def error_code(exc: BaseException) -> str | None:
    if isinstance(exc, ClientError):
        code: str | None = exc.response.get("Error", {}).get("Code")
        return code
    return None


def server_side(exc: BaseException) -> bool:
    """An HTTP 5xx reply: DynamoDB's own (InternalServerError, ...) or a proxy's in front
    of it (502, 504), which may have passed the request on before it failed."""
    if not isinstance(exc, ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and status >= 500


def safe_endpoint(url: str | None) -> str:
    """The endpoint for messages, without any user:password part."""
    if not url:
        return "AWS DynamoDB"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def describe_endpoint(endpoint: str | None, region: str | None) -> str:
    """Where a table is, for messages: the endpoint (without user:password) and the
    region. Each region has tables of its own: two hosts that resolve different regions
    lock in different tables and never exclude each other."""
    where = safe_endpoint(endpoint)
    return f"{where}, region {region}" if region else where


# What a failure of the network is, inside botocore's HTTP client: the socket's (OSError:
# resets, timeouts, ssl.SSLError), http.client's and urllib3's, and botocore's own.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError, BotoCoreError)


def raised_into(exc: BaseException) -> BaseException | None:
    """The exception the caller's own code raised into a request, if botocore wrapped it.

    botocore turns any Exception raised while its HTTP client sends or reads into
    ``HTTPClientError``, whatever raised it: a signal handler of the caller's
    (Celery's SoftTimeLimitExceeded at a task's soft time limit) as well as the
    network. Only a transport error is the network's: retried, the request would
    swallow the caller's exception and hand out what the caller had stopped waiting for
    (issue 36, N1). (A BaseException such as KeyboardInterrupt passes botocore unwrapped.)
    """
    if isinstance(exc, HTTPClientError):
        cause = exc.kwargs.get("error")
        if isinstance(cause, BaseException) and not isinstance(cause, TRANSPORT_ERRORS):
            return cause
    return None


def may_have_applied(exc: BaseException) -> bool:
    """True when the request may have reached DynamoDB although we got no answer."""
    if isinstance(exc, (ConnectTimeoutError, EndpointConnectionError)) and not isinstance(exc, ReadTimeoutError):
        return False
    if isinstance(exc, (ReadTimeoutError, ConnectionClosedError)):
        return True
    code = error_code(exc)
    if code in ("InternalServerError", "InternalFailure", "ServiceUnavailable") or server_side(exc):
        return True
    # Any other transport-level failure: assume the worst.
    return isinstance(exc, BotoCoreError) and not isinstance(exc, (NoCredentialsError, ParamValidationError))


# What DynamoDB (and the local servers) answer when a request's key is not the table's.
KEY_MISMATCH_MESSAGES = (
    "key element does not match the schema",
    "one of the required keys was not given a value",
    "missing the key",
    "type mismatch for key",
)


def _key_mismatch(message: str) -> bool:
    return any(text in message.lower() for text in KEY_MISMATCH_MESSAGES)


def translate(
    exc: BaseException,
    *,
    table: str,
    endpoint: str | None,
    action: str,
    region: str | None = None,
    key_attribute: str = "key",
    access_key_id: Callable[[], str | None] = lambda: None,
) -> DynLockError:
    """A typed error whose message says what to fix. Never includes credentials: of the
    keys, only ``access_key_id()``, the public half, in a missing table's message."""
    where = describe_endpoint(endpoint, region)
    if isinstance(exc, DynLockError):
        return exc
    if isinstance(exc, ClientError):
        code = error_code(exc) or "Unknown"
        message = exc.response.get("Error", {}).get("Message") or ""
        if code == "ResourceNotFoundException":
            # Tables belong to an account and a region on AWS, to an access key id and a
            # region on DynamoDB Local (unless -sharedDb): name both that were used.
            key_id = access_key_id()
            keys = f"access key id {key_id!r}" if key_id else "no access key id"
            if is_aws(endpoint):
                elsewhere = f"if it is in another account, use that account's keys (this client used {keys})"
            else:
                elsewhere = (
                    f"if it was created with other keys, use those: DynamoDB Local keeps one database per "
                    f"access key id and region unless started with -sharedDb (this client used {keys})"
                )
            missing = TableNotFound(
                f"the lock table {table!r} does not exist at {where}: create it with "
                f"`python manage.py createlocktable` (or LockClient.create_table()), or, if it exists in "
                f"another region, set REGION_NAME to that one, or, {elsewhere}",
                code=code,
            )
            missing.access_key_id = key_id
            return missing
        if code in CREDENTIAL_CODES:
            return CredentialsError(
                f"DynamoDB at {where} rejected the credentials ({code}) while trying to {action}: "
                f"check SESSION_OPTIONS or the AWS environment variables / profile",
                code=code,
            )
        if code == "AccessDeniedException":
            # AWS's own text names the principal and the refused action: keep it.
            operation = getattr(exc, "operation_name", None)
            refused = iam.refused_action(operation, message)
            policies = "; ".join(
                f"the {which} policy has {'it' if refused else 'them'} ({', '.join(iam.POLICIES[which])}): "
                f"`python manage.py createlocktable --print iam-{which}`"
                for which in iam.policies_with(refused)
            )
            # IAM has no action named after a transaction: name the entries' actions.
            grant = (
                refused
                or "each entry's action (dynamodb:UpdateItem for an Update, dynamodb:ConditionCheckItem for a ConditionCheck)"
            )
            return BackendError(
                f"access denied to table {table!r} at {where} while trying to {action}: AWS says "
                f"{message or code!r}. Grant the IAM principal {grant} on the table; "
                f"{policies} (docs/security.md)",
                code=code,
            )
        if code == "ValidationException" and _key_mismatch(message):
            return TableSchemaError(
                f"the lock table {table!r} at {where} has no string partition key named "
                f"{key_attribute!r} (KEY_ATTRIBUTE): DynamoDB says {message!r}. Set KEY_ATTRIBUTE to "
                f"the table's partition key, or point TABLE_NAME at a table made by "
                f"`python manage.py createlocktable`; `manage.py check --deploy` says what the table "
                f"has (dynlock.E103)",
                code=code,
            )
        if code in RETRYABLE_CODES or server_side(exc):
            return BackendError(
                f"DynamoDB at {where} is busy or failing ({code}) while trying to {action}", code=code, retryable=True
            )
        return BackendError(f"DynamoDB at {where} refused to {action}: {code}: {message}", code=code)
    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        if not is_aws(endpoint):
            return CredentialsError(
                f"no AWS credentials found: a local server at {where} still needs some keys (any will do; "
                f"DynamoDB Local keeps one database per access key id and region): set {LOCAL_KEYS} "
                "in the DYNLOCK alias, or the AWS_* environment variables"
            )
        return CredentialsError(
            "no AWS credentials found: set DYNLOCK SESSION_OPTIONS (profile_name or keys), "
            "the AWS_* environment variables, or an instance role"
        )
    if isinstance(exc, NoRegionError):
        return ConfigurationError("no AWS region: set REGION_NAME in the DYNLOCK alias or AWS_DEFAULT_REGION")
    # Settings, not weather: no retry will fix them.
    if isinstance(exc, InvalidRegionError):
        return ConfigurationError(
            f"REGION_NAME {exc.kwargs.get('region_name')!r} is not an AWS region name: use one such as 'eu-west-1'"
        )
    if isinstance(exc, ProfileNotFound):
        return ConfigurationError(
            f"the AWS profile {exc.kwargs.get('profile')!r} is not in the AWS config or "
            "credentials files: fix profile_name in SESSION_OPTIONS, or AWS_PROFILE"
        )
    if isinstance(exc, ParamValidationError):
        return InvalidArgument(f"invalid request while trying to {action}: {exc}")
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return BackendError(
            f"could not connect to DynamoDB at {where} while trying to {action}: check ENDPOINT_URL and the network",
            retryable=True,
        )
    if isinstance(exc, (ReadTimeoutError, ConnectionClosedError)):
        return BackendError(
            f"no reply from DynamoDB at {where} while trying to {action} (timeout or connection closed)", retryable=True
        )
    if isinstance(exc, BotoCoreError):
        return BackendError(f"DynamoDB client error while trying to {action}: {type(exc).__name__}", retryable=True)
    raise exc


def is_throttling(error: BaseException | None) -> bool:
    """Whether a (translated) error says DynamoDB throttled the request."""
    return getattr(error, "code", None) in THROTTLING_CODES
