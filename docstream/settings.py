"""The one typed settings object of a docstream process.

Read once at process start (the CLI does it) from the environment: variables prefixed
`DOCSTREAM_`, plus the conventional `KAFKA_*` connection variables so that docstream can be
pointed at an existing cluster. Library code never reads the environment: it takes explicit
arguments built from this object.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

CLUSTER_FILE = "cluster.json"  # under <home>/broker: the local cluster of more than one node (infra.cluster)


class RetryPolicy(BaseModel):
    """How a group retries transient failures before it dead-letters an event.

    The delay before attempt n (n >= 2) is min(initial * multiplier**(n-2), max), +/- jitter.
    See docs/tuning.md for how to pick these from measured handling times.
    """

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=4, ge=1)
    initial_backoff_ms: int = Field(default=500, ge=0)
    max_backoff_ms: int = Field(default=30_000, ge=0)
    multiplier: float = Field(default=2.0, ge=1.0)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)


class RuntimeSettings(BaseModel):
    """The consumer runtime's knobs (docs/tuning.md derives them from p50/p99 handling times)."""

    model_config = ConfigDict(frozen=True)

    concurrency: int = Field(default=8, ge=1, description="handler threads per worker process")
    max_in_flight: int = Field(
        default=1000, ge=1, description="events held per process, queued or running (the scheduling window)"
    )
    window_s: float = Field(
        default=30.0,
        ge=0.0,
        description="and at most this many seconds of work at the measured time per event (0: no bound)",
    )
    max_poll_interval_ms: int = Field(default=300_000, ge=10_000)
    session_timeout_ms: int = Field(default=45_000, ge=6_000)
    commit_interval_ms: int = Field(default=2_000, ge=100)
    fetch_wait_max_ms: int = Field(
        default=100, ge=1, description="broker long-poll; short, so a resumed partition refetches quickly"
    )
    shutdown_timeout_s: float = Field(default=30.0, ge=0.0)
    retry: RetryPolicy = RetryPolicy()


class ThumbnailSettings(BaseModel):
    """What the thumbnails group renders: the first `pages` pages, one WebP per long side."""

    model_config = ConfigDict(frozen=True)

    pages: int = Field(default=1, ge=1)
    long_sides: tuple[int, ...] = (256, 1024)
    quality: int = Field(default=80, ge=1, le=100)
    max_pixels: int = Field(default=40_000_000, ge=1)


class OcrSettings(BaseModel):
    """How the OCR group reads pages (docs/architecture.md; shared/notes/models.md for the figures)."""

    model_config = ConfigDict(frozen=True)

    dpi: int = Field(default=150, ge=50, le=600)
    det_max_side: int = Field(
        default=1600, ge=320, description="detector input cap: 1600 reads dense scans exactly"
    )
    always_ocr: bool = False  # OCR pages even when they have a text layer
    max_pages: int = Field(default=200, ge=1)
    max_pixels: int = Field(default=40_000_000, ge=1, description="per rendered page")
    providers: tuple[str, ...] = ("CUDAExecutionProvider", "CPUExecutionProvider")
    batch_pages: int = Field(
        default=8,
        ge=1,
        description="most pages, from any of the documents the lanes hold, read as one batch",
    )
    batch_wait_ms: float = Field(
        default=20.0,
        ge=0,
        description="how long a batch's first page waits for more pages before a smaller batch runs",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="ONNX Runtime threads per worker process (None: every core); the CPU limit of "
        "one replica where replicas share a machine",
    )


class LimitSettings(BaseModel):
    """What docstream accepts from an event (docstream/validation.py; pages and pixels: `ocr`)."""

    model_config = ConfigDict(frozen=True)

    max_bytes: int = Field(default=256 * 1024 * 1024, ge=1, description="largest document, in bytes")
    max_future_skew_ms: int = Field(
        default=300_000, ge=0, description="how far an event's times may lie after its Kafka timestamp"
    )


class WarehouseSettings(BaseModel):
    """Where the warehouse sink writes and how it batches (consumers/warehouse/sink.py)."""

    model_config = ConfigDict(frozen=True)

    url: str | None = Field(
        default=None,
        description="chdb:///dir or http(s)://user:password@host:port; unset: chdb <home>/warehouse",
    )
    batch_rows: int = Field(default=500, ge=1, description="insert a batch once it holds this many rows")
    batch_ms: int = Field(default=1000, ge=1, description="or once its first row waited this long")
    index_every_s: float = Field(
        default=30.0,
        ge=0,
        description="the sink copies new chunks into the search index this often (0: never; search then"
        " reads them exactly, consumers/warehouse/vector_index.py)",
    )


class AnalyticsSettings(BaseModel):
    """When the analytics worker closes a window (consumers/analytics/app.py)."""

    model_config = ConfigDict(frozen=True)

    grace_ms: int = Field(
        default=10_000, ge=0, description="a window closes once the watermark passes its end + grace"
    )
    lateness_ms: int = Field(
        default=3_600_000,
        ge=0,
        description="a closed window is kept this long: a late event amends it (re-emitted, complete)",
    )
    window_sizes_ms: tuple[int, ...] = Field(
        default=(60_000, 3_600_000), min_length=1, description="the tumbling windows' sizes"
    )
    idle_ms: int | None = Field(
        default=2_000,
        ge=100,
        description="idle this long with every source committed: the wall clock moves the watermark; "
        "unset: event time only",
    )


class ScalingSettings(BaseModel):
    """The scaling policy of every consumer group (consumers/lag/scaling.py, docs/scaling.md).

    `docstream lag` and the exporter turn it into a `ScalingConfig` (`consumers.lag.scaling_config`).
    """

    model_config = ConfigDict(frozen=True)

    objective_s: float = Field(default=60.0, gt=0, description="the SLA: how far behind (s) a group may fall")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=12, ge=1, description="also capped by the partitions of the topics")
    target_utilisation: float = Field(default=0.8, gt=0, le=1)
    burst_step: int = Field(default=2, ge=1, description="replicas added per evaluation past the objective")
    up_window_s: float = Field(default=30.0, ge=0)
    down_window_s: float = Field(default=600.0, ge=0)
    quiet_period_s: float = Field(default=300.0, ge=0)
    max_scale_in: int = Field(default=2, ge=1)
    service_rate_per_replica: float | None = Field(
        default=None, gt=0, description="events/s one busy replica settles (a benchmark); unset: measured"
    )
    saturation_backlog_s: float = Field(default=5.0, ge=0)
    wait_quantile: float | None = Field(
        default=0.999, gt=0, lt=1, description="events within the objective under M/M/n; unset: off"
    )
    lead_s: float = Field(
        default=0.0,
        ge=0,
        description="the cold start (s): size for the arrival rate this far ahead while it rises",
    )
    trend_window_s: float = Field(default=120.0, ge=0, description="the window of the arrival trend")


class ApiSettings(BaseModel):
    """The HTTP ingest API (docstream/api, `docstream api serve`; docs/api.md)."""

    model_config = ConfigDict(frozen=True)

    host: str = Field(default="127.0.0.1", description="the address `docstream api serve` listens on")
    port: int = Field(default=8080, ge=0, le=65535, description="its port; 0: any free port, printed")
    key_refresh_s: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="a replica reads again whether a key it verified was revoked after this long (s):"
        " a revocation is in force on every replica within it",
    )
    heartbeat_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="how often a replica writes its heartbeat and reads the others' (s): liveness for"
        " the outbox's takeover, and what each admitted for the shared quota",
    )
    state_dir: Path | None = Field(
        default=None,
        description="the API's documents registry and outbox (SQLite); unset: <home>/api",
    )
    import_roots: tuple[str, ...] = Field(
        default=(),
        description="roots a JSON upload's URI may name, as <root>/<tenant>/...; unset: <home>/inbox",
    )
    objective_s: float = Field(
        default=60.0, gt=0, description="admit a document while its predicted wait is at most this (s)"
    )
    bulk_share: float = Field(
        default=0.5, gt=0, le=1, description="bulk documents are refused above this share of the objective"
    )
    quota_rate_per_s: float = Field(default=50.0, gt=0, description="each tenant's documents per second")
    quota_burst: float = Field(default=200.0, ge=1, description="each tenant's documents at once")
    outbox_max_records: int = Field(
        default=100_000, ge=1, description="events kept while the broker is away; then 503"
    )
    publish_timeout_s: float = Field(
        default=2.0, gt=0, description="wait this long for the broker's acknowledgement, then use the outbox"
    )
    refresh_s: float = Field(default=2.0, gt=0, description="how often the lag behind admission is sampled")
    rate_window_s: float = Field(
        default=30.0,
        gt=0,
        description="the completion and arrival rates behind admission are measured over this (s): shorter"
        " than the lag monitor's minute, so a stopped or resumed group shows in the predicted wait and"
        " Retry-After within it",
    )


class Settings(BaseSettings):
    """Everything a docstream process can be told from outside."""

    model_config = SettingsConfigDict(
        env_prefix="DOCSTREAM_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        populate_by_name=True,  # Settings(bootstrap_servers=...) works as well as the env aliases
    )

    home: Path = Field(
        default=Path(".docstream"), description="local state: broker data, logs, blobs, API keys"
    )
    bootstrap_servers: str | None = Field(
        default=None,
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP_SERVERS", "DOCSTREAM_BOOTSTRAP_SERVERS"),
        description="an existing cluster; unset means the local broker managed by `docstream broker`",
    )
    security_protocol: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SECURITY_PROTOCOL", "DOCSTREAM_SECURITY_PROTOCOL")
    )
    sasl_mechanism: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SASL_MECHANISM", "DOCSTREAM_SASL_MECHANISM")
    )
    sasl_username: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SASL_USERNAME", "DOCSTREAM_SASL_USERNAME")
    )
    sasl_password: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SASL_PASSWORD", "DOCSTREAM_SASL_PASSWORD")
    )
    ssl_ca_location: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SSL_CA_LOCATION", "DOCSTREAM_SSL_CA_LOCATION")
    )
    ssl_certificate_location: str | None = Field(
        default=None,
        validation_alias=AliasChoices("KAFKA_SSL_CERTIFICATE_LOCATION", "DOCSTREAM_SSL_CERTIFICATE_LOCATION"),
    )
    ssl_key_location: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_SSL_KEY_LOCATION", "DOCSTREAM_SSL_KEY_LOCATION")
    )
    local_broker_port: int = Field(default=9092, ge=1, le=65535)
    local_controller_port: int = Field(default=9093, ge=1, le=65535)
    broker_secure: bool = Field(
        default=False,
        description="`docstream broker start` runs the local broker secured (SASL_SSL, SCRAM-SHA-512,"
        " TLS with a local CA) as `--secure` does; docs/security.md",
    )
    schema_registry_url: str | None = None
    blob_url: str | None = Field(
        default=None, description="s3://bucket/prefix, or an fsspec URL; unset means <home>/blobs"
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="an S3-compatible store's endpoint (MinIO ...); unset: AWS, or botocore's own"
        " AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL. Credentials and region: the standard AWS chain",
    )
    s3_timeout_s: float = Field(
        default=20.0, gt=0, description="connect and read timeout of one S3 request (docs/blobs.md)"
    )
    s3_outage_wait_s: float = Field(
        default=120.0,
        ge=0,
        description="how long a blob store call waits for S3 to come back before it fails (transient)",
    )
    topic_partitions: int = Field(default=12, ge=1)
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        description="replicas of each new topic; unset: one per broker up to 3 (then min.insync.replicas 2)",
    )
    group_prefix: str = "docstream."
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="how `docstream worker` logs: text, or one JSON object per line (docs/operations.md)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="WARNING",
        description="the least severe lines logged; INFO adds a line per event a stage handled",
    )
    runtime: RuntimeSettings = RuntimeSettings()
    thumbnails: ThumbnailSettings = ThumbnailSettings()
    ocr: OcrSettings = OcrSettings()
    limits: LimitSettings = LimitSettings()
    warehouse: WarehouseSettings = WarehouseSettings()
    analytics: AnalyticsSettings = AnalyticsSettings()
    scaling: ScalingSettings = ScalingSettings()
    api: ApiSettings = ApiSettings()

    @field_validator("log_format", mode="before")
    @classmethod
    def _format_any_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_any_case(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @property
    def blob_root(self) -> str:
        return self.blob_url or str((self.home / "blobs").resolve())

    @property
    def warehouse_url(self) -> str:
        return self.warehouse.url or f"chdb://{(self.home / 'warehouse').resolve()}"

    @property
    def api_state_dir(self) -> Path:
        return (self.api.state_dir or self.home / "api").resolve()

    @property
    def api_import_roots(self) -> tuple[str, ...]:
        return self.api.import_roots or (str((self.home / "inbox").resolve()),)

    @property
    def uses_local_broker(self) -> bool:
        return self.bootstrap_servers is None

    @property
    def bootstrap(self) -> str:
        """KAFKA_BOOTSTRAP_SERVERS, else the local cluster's brokers: every node of the one
        `docstream broker start --brokers N` recorded (infra.cluster), or the one local broker."""
        return self.bootstrap_servers or local_bootstrap(self.home / "broker", self.local_broker_port)


def local_bootstrap(broker_dir: Path, port: int) -> str:
    """The bootstrap list of the local cluster recorded in broker_dir/cluster.json, or the one
    broker on `port` when none is recorded (or the record is unreadable: `docstream broker status`
    reports that)."""
    try:
        record = json.loads((broker_dir / CLUSTER_FILE).read_text())
        return ",".join(f"127.0.0.1:{int(b)}" for b, _ in record["ports"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"127.0.0.1:{port}"


def load_settings() -> Settings:
    """Read the settings from the environment (call once, at process start)."""
    return Settings()
