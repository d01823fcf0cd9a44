"""The ``s3://`` scheme of :mod:`datamill.core.storage`: pyarrow's S3 filesystem and its error
hints.

Everything datamill knows about S3 is here: how the filesystem is built (arguments or the usual
``AWS_*`` variables), which of its failures mean what, and how to fix each.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow.fs as pafs

__all__ = ["HINTS", "recognises", "s3_filesystem"]


def s3_filesystem(
    *,
    endpoint: str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str | None = None,
    allow_bucket_creation: bool = False,
) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem from arguments or the usual ``AWS_*`` environment variables.

    Args:
        endpoint: ``http(s)://host:port`` of an S3-compatible server. Defaults to ``None``
            (``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then AWS itself).
        access_key: defaults to ``None`` (``AWS_ACCESS_KEY_ID``).
        secret_key: defaults to ``None`` (``AWS_SECRET_ACCESS_KEY``).
        region: defaults to ``None`` (``AWS_REGION``, ``AWS_DEFAULT_REGION``, then ``us-east-1``).
        allow_bucket_creation: let ``create_dir("bucket")`` create buckets. Defaults to ``False``.

    Examples:
        >>> fs = s3_filesystem(endpoint="http://127.0.0.1:9", access_key="k", secret_key="s")
        >>> type(fs).__name__
        'S3FileSystem'
    """
    env = os.environ
    endpoint = endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    kwargs: dict[str, Any] = {
        "region": region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        "allow_bucket_creation": allow_bucket_creation,
    }
    if endpoint:
        scheme, _, host = (
            endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        )
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    access_key = access_key or env.get("AWS_ACCESS_KEY_ID")
    secret_key = secret_key or env.get("AWS_SECRET_ACCESS_KEY")
    if access_key and secret_key:
        kwargs.update(access_key=access_key, secret_key=secret_key)
    return pafs.S3FileSystem(**kwargs)


HINTS = (
    (
        ("NO_SUCH_BUCKET", "NoSuchBucket"),
        "no such bucket",
        "check the bucket name (create it first)",
    ),
    (
        ("NO_SUCH_KEY", "NoSuchKey", "Path does not exist", "NOT_FOUND"),
        "no such object",
        "check the key (a prefix is listed, an object is read)",
    ),
    (
        ("ACCESS_DENIED", "InvalidAccessKeyId", "SignatureDoesNotMatch", "FORBIDDEN", "403"),
        "access denied (bad or missing credentials?)",
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or pass the keys) for this endpoint",
    ),
    (
        ("NETWORK_CONNECTION", "Could not connect", "curlCode", "Timeout", "timed out"),
        "the object store is unreachable",
        "check AWS_ENDPOINT_URL (http://host:port) and that the server is up",
    ),
)
"""``(substrings of pyarrow's message, what it means, how to fix it)``, tried in order."""


def recognises(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of pyarrow's S3 client (its messages start with ``AWS
    Error``)."""
    return isinstance(exc, OSError) and "AWS Error" in str(exc)
