"""Object storage: tables whose Parquet files live in S3 or an S3-compatible server.

This module owns every access to an object store, for the catalog (listing a
location, reading footers at register) and the executor (reading row groups):

* ``parse`` / ``is_remote``: a location ``s3://bucket/key``, a prefix
  (``s3://bucket/tpch/lineitem/``) or a glob (``s3://bucket/t/part-*.parquet``);
* ``StorageOptions`` and ``configure``: where the store is and how patient to be.
  The endpoint, region and credentials come from what S3 tools read (the
  ``AWS_ENDPOINT_URL[_S3]``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN`` variables, ``AWS_PROFILE`` and
  the profile files); the scheduler's and executor's ``--s3-*`` options override
  the endpoint, region and addressing style. Credentials are never options: they
  stay with the AWS SDK, so no mangonel log, page, API answer, plan or state
  store can hold one (a table's stored location is its URI only);
* ``list_objects``: the objects behind a location, as local paths work in
  ``catalog.resolve_files``;
* ``open_object``: a random-access file over one object for ``pyarrow.parquet``,
  which reads the footer and then only the column chunks asked for, each a
  ranged GET (never the whole object). It checks that the object is the one
  registered (size and ETag), retries what may pass with backoff, and counts
  the bytes it fetched;
* ``classify``: a store failure as a typed ``errors.ObjectStoreError`` that names
  the object.

The I/O path is pyarrow's ``S3FileSystem`` (in the pyarrow wheel mangonel pins).
DuckDB's own S3 reader is the ``httpfs`` extension, which is not in the pip
wheel; mangonel never installs or loads extensions (every DuckDB connection it
makes turns that off). ``BENCHMARKS.md`` ("Object storage") has the measurement
that chose pyarrow over DuckDB reading through a registered fsspec filesystem.

Options are per process (``configure``, called by the scheduler's and the
executor's entry points), as the AWS SDK's own configuration is.

Why it is over 600 lines: it is the one owner of object-store access, and its
parts (locations, options, retries and the classification of errors, listing,
reading an object's ranges) share one configuration and one filesystem; none
is over 120 lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from mangonel import defaults
from mangonel.errors import (
    CatalogError,
    ObjectAccessError,
    ObjectChangedError,
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

log = logging.getLogger(__name__)

SCHEME = "s3://"

_GLOB = re.compile(r"[*?\[]")
_PARQUET_SUFFIXES = (".parquet", ".parq")

T = TypeVar("T")

Addressing = Literal["path", "virtual"]

# The environment variables the store's configuration depends on (credentials
# included: a filesystem made before they changed must not be reused).
_ENV_KEYS = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
)

# ------------------------------------------------------------------ locations


def is_remote(location: str) -> bool:
    """Whether a location names object storage (``s3://...``) rather than a local path."""
    return location.startswith(SCHEME)


@dataclass(frozen=True)
class ObjectUri:
    """``s3://bucket/key``: a bucket and a key (or a key prefix, or a glob)."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    @property
    def fs_path(self) -> str:
        """The path pyarrow's ``S3FileSystem`` takes: ``bucket/key``."""
        return f"{self.bucket}/{self.key}".rstrip("/")


def parse(location: str) -> ObjectUri:
    """Split ``s3://bucket/key`` into its bucket and key.

    >>> parse("s3://data/tpch/lineitem/")
    ObjectUri(bucket='data', key='tpch/lineitem/')

    Raises:
        CatalogError: not an ``s3://`` location, or no bucket.
    """
    if not is_remote(location):
        raise CatalogError(f"{location!r} is not an object storage location (s3://bucket/key)")
    bucket, _, key = location[len(SCHEME) :].partition("/")
    if not bucket:
        raise CatalogError(f"{location!r} names no bucket; write s3://bucket/key")
    return ObjectUri(bucket, key)


# -------------------------------------------------------------------- options


@dataclass(frozen=True)
class StorageOptions:
    """How a process reaches object storage; ``None`` means the environment decides.

    Attributes:
        endpoint_url: Where the store is, e.g. ``http://minio:9000``; else
            ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, else AWS itself.
        region: The store's region; else ``AWS_REGION``, ``AWS_DEFAULT_REGION``,
            the profile's, else the SDK's default.
        addressing: ``path`` (``http://host/bucket/key``: MinIO and most
            S3-compatible servers) or ``virtual`` (``http://bucket.host/key``).
        connect_timeout_s: Seconds to wait for a connection.
        request_timeout_s: Seconds a request may go without data.
        attempts: Tries of a request that failed for a reason that may pass.
        backoff_s: The first wait between tries; it doubles, up to
            ``defaults.S3_RETRY_BACKOFF_MAX_S``.
    """

    endpoint_url: str | None = None
    region: str | None = None
    addressing: Addressing = "path"
    connect_timeout_s: float = defaults.S3_CONNECT_TIMEOUT_S
    request_timeout_s: float = defaults.S3_REQUEST_TIMEOUT_S
    attempts: int = defaults.S3_ATTEMPTS
    backoff_s: float = defaults.S3_RETRY_BACKOFF_S

    def __post_init__(self) -> None:
        if self.addressing not in ("path", "virtual"):
            raise ValueError(f"addressing must be 'path' or 'virtual', got {self.addressing!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.connect_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("the object store's timeouts must be positive")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be at least 0, got {self.backoff_s}")

    def to_args(self) -> list[str]:
        """The ``mangonel scheduler`` / ``mangonel executor`` options that give these."""
        base = StorageOptions()
        args: list[str] = []
        if self.endpoint_url:
            args += ["--s3-endpoint-url", self.endpoint_url]
        if self.region:
            args += ["--s3-region", self.region]
        if self.addressing != base.addressing:
            args += ["--s3-addressing", self.addressing]
        if self.connect_timeout_s != base.connect_timeout_s:
            args += ["--s3-connect-timeout", repr(self.connect_timeout_s)]
        if self.request_timeout_s != base.request_timeout_s:
            args += ["--s3-request-timeout", repr(self.request_timeout_s)]
        if self.attempts != base.attempts:
            args += ["--s3-attempts", str(self.attempts)]
        if self.backoff_s != base.backoff_s:
            args += ["--s3-backoff", repr(self.backoff_s)]
        return args

    def endpoint(self, env: Mapping[str, str] | None = None) -> str | None:
        """The endpoint in force: the option, else the environment's."""
        env = os.environ if env is None else env
        return (
            self.endpoint_url
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL")
            or None
        )

    def resolved_region(self, env: Mapping[str, str] | None = None) -> str | None:
        env = os.environ if env is None else env
        return self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None

    def describe(self) -> str:
        """Where the store is, for messages and logs (never a credential)."""
        endpoint = self.endpoint() or "AWS"
        region = self.resolved_region() or "default region"
        return f"{endpoint} ({region}, {self.addressing}-style)"


_options = StorageOptions()
_options_lock = threading.Lock()


def configure(options: StorageOptions) -> None:
    """Set this process's object storage options (the entry points call it once)."""
    global _options
    with _options_lock:
        _options = options
    log.info("object storage: %s", options.describe())


def current_options() -> StorageOptions:
    """This process's object storage options."""
    with _options_lock:
        return _options


def filesystem(options: StorageOptions | None = None) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem for the options and the environment as they are now."""
    options = current_options() if options is None else options
    env = tuple(os.environ.get(k) for k in _ENV_KEYS)
    return _filesystem(options, env)


@functools.lru_cache(maxsize=8)
def _filesystem(options: StorageOptions, env: tuple[str | None, ...]) -> pafs.S3FileSystem:
    import pyarrow.fs as pafs

    kwargs: dict[str, object] = {
        "connect_timeout": options.connect_timeout_s,
        "request_timeout": options.request_timeout_s,
        # The SDK's own retries are off: ``_retrying`` retries (with backoff and
        # a log line), so the attempts and the time spent are ours to bound.
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        "force_virtual_addressing": options.addressing == "virtual",
        # Reading only: never create or delete a bucket as a side effect.
        "allow_bucket_creation": False,
        "allow_bucket_deletion": False,
    }
    endpoint = options.endpoint()
    if endpoint:
        kwargs["endpoint_override"] = endpoint
        if endpoint.startswith("http://"):
            kwargs["scheme"] = "http"
    region = options.resolved_region()
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


# ------------------------------------------------------------------- failures

_TRANSIENT = (
    "NETWORK_CONNECTION",
    "curlCode",
    "Timeout",
    "timed out",
    "SLOW_DOWN",
    "SERVICE_UNAVAILABLE",
    "INTERNAL_FAILURE",
    "THROTTLING",
    "REQUEST_TIMEOUT",
    "Connection reset",
    "Connection refused",
    "HTTP status 5",
)
_ACCESS = (
    "ACCESS_DENIED",
    "INVALID_ACCESS_KEY_ID",
    "SIGNATURE_DOES_NOT_MATCH",
    "MISSING_AUTHENTICATION_TOKEN",
    "UNRECOGNIZED_CLIENT",
    "EXPIRED_TOKEN",
    "INVALID_CLIENT_TOKEN_ID",
    "HTTP status 401",  # answers without a body (to a HEAD) give only the status
    "HTTP status 403",
)
_NOT_FOUND = ("NO_SUCH_BUCKET", "NO_SUCH_KEY", "RESOURCE_NOT_FOUND", "Path does not exist")


def is_transient(exc: BaseException) -> bool:
    """Whether a store failure may pass if tried again (refused, reset, timed out, 5xx)."""
    if isinstance(exc, ObjectStoreUnavailableError):
        return True
    if isinstance(exc, ObjectStoreError | FileNotFoundError):
        return False
    message = str(exc)
    if any(mark in message for mark in _ACCESS + _NOT_FOUND):
        return False
    return isinstance(exc, OSError) and any(mark in message for mark in _TRANSIENT)


def classify(exc: BaseException, what: str, options: StorageOptions | None = None) -> CatalogError:
    """A store failure as the typed error a user sees, naming ``what`` (an object).

    Returns ``exc`` itself when it already is one.
    """
    if isinstance(exc, CatalogError):
        return exc
    options = current_options() if options is None else options
    message = str(exc).strip() or type(exc).__name__
    where = options.describe()
    if isinstance(exc, FileNotFoundError) or any(mark in message for mark in _NOT_FOUND):
        return ObjectNotFoundError(f"{what} does not exist at {where}: {message}")
    if any(mark in message for mark in _ACCESS):
        return ObjectAccessError(
            f"access to {what} was refused by {where}: {message}; {_credentials_hint()}"
        )
    if is_transient(exc):
        return ObjectStoreUnavailableError(
            f"object storage at {where} did not answer for {what} after "
            f"{options.attempts} tries: {message}; check that the store is up and reachable "
            "(--s3-endpoint-url, AWS_ENDPOINT_URL)"
        )
    return ObjectStoreError(f"reading {what} from {where} failed: {message}")


def _credentials_hint() -> str:
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"):
        return (
            "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
            "AWS_SESSION_TOKEN or AWS_PROFILE) and that they may read this bucket"
        )
    return (
        "no credentials were given to this process: set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or AWS_PROFILE in the environment "
        "of the scheduler and the executors"
    )


def retrying(what: str, call: Callable[[], T], options: StorageOptions | None = None) -> T:
    """``call()``, tried again with doubling waits while it fails in a way that may pass.

    Raises:
        ObjectStoreError: a typed error naming ``what`` (a subclass says why).
    """
    options = current_options() if options is None else options
    wait = options.backoff_s
    for attempt in range(1, options.attempts + 1):
        try:
            return call()
        except (OSError, ObjectStoreError) as exc:
            if attempt == options.attempts or not is_transient(exc):
                raise classify(exc, what, options) from exc
            log.warning(
                "object storage: %s failed (%s); try %d of %d in %.2g s",
                what,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                attempt + 1,
                options.attempts,
                wait,
            )
            time.sleep(wait)
            wait = min(wait * 2, defaults.S3_RETRY_BACKOFF_MAX_S)
    raise AssertionError("unreachable: the last attempt returns or raises")


# -------------------------------------------------------------------- listing


@dataclass(frozen=True)
class ObjectVersion:
    """What identifies one state of an object: its size and ETag (or mtime)."""

    size: int
    version: str


def list_objects(
    location: str,
    options: StorageOptions | None = None,
    wanted: Callable[[str], bool] | None = None,
    kind: str = ".parquet",
) -> tuple[str, ...]:
    """The objects behind an ``s3://`` location, sorted, as ``s3://bucket/key`` URIs.

    Like local paths (``catalog.resolve_files``): a glob (``*``, ``?``, ``[``;
    ``**`` crosses ``/``) gives every object it matches; a key that is an object
    gives it; a prefix (a "directory") gives every ``.parquet`` / ``.parq``
    object under it (or every one whose key ``wanted`` accepts; ``kind`` names
    them in the error of a prefix that holds none).

    Raises:
        ObjectNotFoundError: no bucket, nothing matches, or an empty prefix.
        ObjectStoreError: another failure of the store (a subclass says why).
    """
    import pyarrow.fs as pafs

    options = current_options() if options is None else options
    uri = parse(location)
    fs = filesystem(options)
    glob = _GLOB.search(uri.key)
    if glob is not None:
        base = uri.key[: glob.start()].rpartition("/")[0]
        pattern = _glob_regex(uri.key)
        found = [
            f
            for f in _list(fs, uri.bucket, base, location, options)
            if pattern.fullmatch(f.path.partition("/")[2])
        ]
        if not found:
            _check_bucket(fs, uri, options)
            raise ObjectNotFoundError(f"no object matches {location!r}; check the glob pattern")
        return tuple(sorted(f"{SCHEME}{f.path}" for f in found))
    info = retrying(location, lambda: fs.get_file_info(uri.fs_path), options)
    if info.type == pafs.FileType.File and not uri.key.endswith("/"):
        return (f"{SCHEME}{info.path}",)
    if info.type == pafs.FileType.NotFound:
        _check_bucket(fs, uri, options)
        raise ObjectNotFoundError(
            f"{location!r} does not exist: no such object or prefix in bucket {uri.bucket!r}; "
            "give an s3:// object, a prefix of them, or a glob"
        )
    found = [
        f
        for f in _list(fs, uri.bucket, uri.key.rstrip("/"), location, options)
        if (wanted(f.path) if wanted is not None else f.path.endswith(_PARQUET_SUFFIXES))
    ]
    if not found:
        raise ObjectNotFoundError(f"prefix {location!r} holds no {kind} object")
    return tuple(sorted(f"{SCHEME}{f.path}" for f in found))


def is_object(location: str, options: StorageOptions | None = None) -> bool:
    """Whether an ``s3://`` location names one object (not a prefix, nor nothing).

    Raises:
        ObjectStoreError: the store failed to answer (a subclass says why).
    """
    import pyarrow.fs as pafs

    options = current_options() if options is None else options
    uri = parse(location)
    fs = filesystem(options)
    info = retrying(location, lambda: fs.get_file_info(uri.fs_path), options)
    return info.type == pafs.FileType.File and not uri.key.endswith("/")


def _list(
    fs: pafs.S3FileSystem, bucket: str, prefix: str, location: str, options: StorageOptions
) -> list[pafs.FileInfo]:
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(f"{bucket}/{prefix}".rstrip("/"), recursive=True)
    selector.allow_not_found = True
    infos = retrying(location, lambda: fs.get_file_info(selector), options)
    return [f for f in infos if f.type == pafs.FileType.File]


def _check_bucket(fs: pafs.S3FileSystem, uri: ObjectUri, options: StorageOptions) -> None:
    import pyarrow.fs as pafs

    info = retrying(str(uri), lambda: fs.get_file_info(uri.bucket), options)
    if info.type == pafs.FileType.NotFound:
        raise ObjectNotFoundError(
            f"bucket {uri.bucket!r} of {str(uri)!r} does not exist at {options.describe()}"
        )


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as a regular expression over keys: ``*`` and ``?`` stay within one
    ``/``-separated part, ``**`` crosses them (``glob.glob(recursive=True)``)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out))


# -------------------------------------------------------------------- reading


class ObjectFile:
    """One object, opened for random access by ``pyarrow.parquet`` (through ``pa.PythonFile``).

    Each ``read`` is one ranged GET of the bytes asked for: the Parquet reader
    asks for the footer, then for the column chunks of the row groups it reads.
    A read that fails in a way that may pass is retried with backoff on a fresh
    handle, and the object's size and ETag are checked again when it is
    reopened. ``bytes_read`` and ``requests`` count what was fetched.
    """

    def __init__(
        self, uri: str, expected: ObjectVersion | None, options: StorageOptions | None = None
    ) -> None:
        self.uri = uri
        self._options = current_options() if options is None else options
        self._expected = expected
        self._position = 0
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.requests = 0
        self._handle: pa.NativeFile | None = None
        self._size = 0
        self.version = self._open()

    def _open(self) -> ObjectVersion:
        """Open the object (one HEAD request, retried) and check it is the one registered."""
        try:
            return retrying(self.uri, self._open_once, self._options)
        except ObjectNotFoundError as exc:
            if self._expected is not None:
                raise ObjectChangedError(
                    f"{self.uri} was deleted after its table was registered; "
                    "register the table again"
                ) from exc
            raise

    def _open_once(self) -> ObjectVersion:
        handle = filesystem(self._options).open_input_file(parse(self.uri).fs_path)
        self.requests += 1
        found = ObjectVersion(handle.size(), _version_of(handle.metadata()))
        expected = self._expected
        if expected is not None and (
            found.size != expected.size or (expected.version and found.version != expected.version)
        ):
            handle.close()
            raise ObjectChangedError(
                f"{self.uri} was overwritten after its table was registered (size "
                f"{expected.size} -> {found.size}, version {expected.version or '?'} -> "
                f"{found.version or '?'}); register the table again"
            )
        self._handle = handle
        self._size = found.size
        return found

    # The file protocol pa.PythonFile needs.

    def read(self, nbytes: int = -1) -> bytes:
        with self._lock:
            start = self._position
            if nbytes < 0:
                nbytes = self._size - start
            nbytes = max(0, min(nbytes, self._size - start))
            if nbytes == 0:
                return b""
            try:
                data = retrying(self.uri, lambda: self._read_at(start, nbytes), self._options)
            except ObjectNotFoundError as exc:
                raise ObjectChangedError(
                    f"{self.uri} was deleted while it was read; register the table again"
                ) from exc
            self._position = start + len(data)
            self.bytes_read += len(data)
            self.requests += 1
            return data

    def _read_at(self, start: int, nbytes: int) -> bytes:
        try:
            if self._handle is None:  # the last try failed: a fresh handle, checked again
                self._open_once()
            assert self._handle is not None
            return bytes(self._handle.read_at(nbytes, start))
        except OSError:
            handle, self._handle = self._handle, None  # a fresh one on the next try
            if handle is not None:
                handle.close()
            raise

    def seek(self, offset: int, whence: int = 0) -> int:
        with self._lock:
            if whence == 0:
                self._position = offset
            elif whence == 1:
                self._position += offset
            else:
                self._position = self._size + offset
            return self._position

    def tell(self) -> int:
        return self._position

    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _version_of(metadata: Mapping[str | bytes, str | bytes] | None) -> str:
    """The ETag (else Last-Modified) of an object, from its HEAD answer."""
    for key in ("ETag", "Last-Modified"):
        value = (metadata or {}).get(key) or (metadata or {}).get(key.encode())
        if value:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return text.strip('"')
    return ""


def open_object(
    uri: str, expected: ObjectVersion | None = None, options: StorageOptions | None = None
) -> ObjectFile:
    """Open one object for ``pyarrow.parquet.ParquetFile`` (wrap it in ``pa.PythonFile``).

    Args:
        uri: ``s3://bucket/key``.
        expected: The size and version recorded at register: a different object
            there now raises ``ObjectChangedError``.

    Raises:
        ObjectStoreError: the object is gone, changed, refused, or the store is away.
    """
    return ObjectFile(uri, expected, options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--s3-*`` options of ``mangonel scheduler``, ``executor`` and ``standalone``."""
    base = StorageOptions()
    group = parser.add_argument_group(
        "object storage",
        "tables at s3:// locations; credentials come from AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE, never from options",
    )
    group.add_argument(
        "--s3-endpoint-url",
        metavar="URL",
        help="S3-compatible server, e.g. http://minio:9000 (default: $AWS_ENDPOINT_URL_S3, "
        "$AWS_ENDPOINT_URL, else AWS)",
    )
    group.add_argument(
        "--s3-region", help="region (default: $AWS_REGION, $AWS_DEFAULT_REGION, the profile's)"
    )
    group.add_argument(
        "--s3-addressing",
        choices=["path", "virtual"],
        help=f"path-style (host/bucket/key) or virtual-hosted (bucket.host/key) requests "
        f"(default {base.addressing})",
    )
    group.add_argument(
        "--s3-connect-timeout",
        type=float,
        metavar="S",
        help=f"seconds to wait for a connection (default {base.connect_timeout_s:g})",
    )
    group.add_argument(
        "--s3-request-timeout",
        type=float,
        metavar="S",
        help=f"seconds a request may go without data (default {base.request_timeout_s:g})",
    )
    group.add_argument(
        "--s3-attempts",
        type=int,
        metavar="N",
        help=f"tries of a request that failed in a way that may pass (default {base.attempts})",
    )
    group.add_argument(
        "--s3-backoff",
        type=float,
        metavar="S",
        help=f"first wait between tries, doubled each time (default {base.backoff_s:g})",
    )


def options_from_args(args: argparse.Namespace) -> StorageOptions:
    """``StorageOptions`` from the options ``add_arguments`` defined; defaults where not given."""
    given = {
        "endpoint_url": getattr(args, "s3_endpoint_url", None),
        "region": getattr(args, "s3_region", None),
        "addressing": getattr(args, "s3_addressing", None),
        "connect_timeout_s": getattr(args, "s3_connect_timeout", None),
        "request_timeout_s": getattr(args, "s3_request_timeout", None),
        "attempts": getattr(args, "s3_attempts", None),
        "backoff_s": getattr(args, "s3_backoff", None),
    }
    return dataclasses.replace(
        StorageOptions(), **{k: v for k, v in given.items() if v is not None}
    )
