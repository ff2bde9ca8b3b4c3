"""One typed configuration for the proxy: ``Settings``, one group of options per concern (``GROUPS``: proxy,
upstream, sessions, compression, drafter, limits, cluster, inspector; ``serve --help`` shows the same groups).

Every option has one name, unique across the groups: ``--prefill-curve`` ↔ ``PFLASH_PREFILL_CURVE`` ↔
``prefill_curve = ...`` in TOML ↔ ``settings.compression.prefill_curve`` (three fields are named after their group's
switch instead: ``upstream.url`` is ``--upstream``, ``sessions.enabled`` ``--sessions``, ``drafter.path``
``--drafter``; ``OPTIONS`` maps each name to its group and field).

Sources, highest precedence first:

1. CLI flags (only the ones actually given on the command line);
2. ``PFLASH_*`` environment variables (``PFLASH_PORT``, ``PFLASH_UPSTREAM`` ... one per option, plus the
   seed's historical names listed in ``SEED_ENV_ALIASES``; ``PFLASH_PUBLIC_HOST`` is comma-separated,
   ``PFLASH_LLAMA_SERVER_ARGS`` space-separated);
3. a TOML file (``--config`` or ``PFLASH_CONFIG``; see ``configs/pflash-proxy.toml``);
4. the defaults below (production defaults from the PFlash seeds).

The merged mapping (flat, by option name) is validated once by pydantic.  An invalid value stops start-up with
*one* line that names the option and where it came from (``ConfigError``).  ``--scorer`` names an entry of the
scorer registry, which sits above this module: the command line and the stages check it.  The state directory is
resolved at call time from ``PFLASH_HOME`` so tests can point it at ``tmp_path``.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from pflash_proxy.compress.budget import DEFAULT_CURVE, BudgetCurve
from pflash_proxy.compress.pipeline import CompressionSettings

_COMPRESSION = CompressionSettings()  # the compression defaults, written once (compress/pipeline.py)
DRAFTER_DEFAULT_SCORER = "auto"  # --scorer with --drafter and no --scorer: code by lexical, else head-attention (README)

# Names used by the PFlash seed (model card "Using it") that map onto our fields.
SEED_ENV_ALIASES: dict[str, str] = {
    "PFLASH_SEGMENT_PROBE_GGUF": "segment_probe",
    "PFLASH_REQUEST_PROBE_GGUF": "request_probe",
    "PFLASH_SCORING_HEAD_GGUF": "scoring_head",
    "PFLASH_DRAFTER_GGUF": "drafter",
    "PFLASH_QUERY_PIN": "query_pin",
    "PFLASH_FALLBACK_SPREAD": "fallback_spread",
    "PFLASH_CHAT_RECALL": "chat_recall",
}


def state_home() -> Path:
    """The state directory, resolved now (not at import) from ``PFLASH_HOME``."""
    env = os.environ.get("PFLASH_HOME")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "state" / "pflash-proxy"


def private_dir(path: Path) -> Path:
    """Create ``path`` as 0700; an existing directory of ours that others can read is tightened to 0700 (it
    holds session histories and KV snapshots). One owned by another user (llama-server's, under systemd) is left
    as it is."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        import logging

        os.chmod(path, 0o700)
        logging.getLogger("pflash_proxy").info("tightened %s to 0700 (it was %o)", path, st.st_mode & 0o777)
    return path


def parse_heads(v: str) -> list[tuple[int, int]]:
    """``--attention-heads 5.0,11.2`` → [(5, 0), (11, 2)]; ValueError on anything else."""
    out: list[tuple[int, int]] = []
    for item in v.replace(" ", "").split(","):
        layer, head = item.split(".")
        out.append((int(layer), int(head)))
    if not out or any(a < 0 or b < 0 for a, b in out):
        raise ValueError(v)
    return out


def split_hosts(value: str) -> list[str]:
    """llama-server's ``--host`` forms: comma-separated addresses (blanks ignored); ``[::1]`` is taken as ``::1``."""
    out: list[str] = []
    for host in value.split(","):
        host = host.strip()
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if host:
            out.append(host)
    return out


def format_host(host: str) -> str:
    """An address as it goes into a URL: IPv6 literals in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


PUBLIC_HOST = re.compile(r"^(\[[0-9a-f:.]+\]|[0-9a-f:.]*:[0-9a-f:.]*|[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?)$")


class ConfigError(Exception):
    """Invalid configuration: the message is one line naming the option."""


class Options(BaseModel):
    """One group of settings: its fields are options of their own name (``alias``: the option's name where the
    field's differs from it), unique across the groups."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)


class ProxyOptions(Options):
    """Where the proxy listens and keeps its state."""

    host: str = "127.0.0.1"  # listen addresses, comma-separated (llama-server's --host forms; ``.sock`` = UNIX)
    port: int = Field(8090, ge=0, le=65535)
    log_json: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    home: Path = Field(default_factory=state_home)

    @field_validator("host")
    @classmethod
    def _hosts(cls, v: str) -> str:
        hosts = split_hosts(v)
        if not hosts:
            raise ValueError("needs at least one address")
        return ",".join(hosts)

    @model_validator(mode="after")
    def _one_port(self) -> ProxyOptions:
        if self.port == 0 and len(self.tcp_hosts) > 1:
            raise ValueError("port: --port 0 is not supported with several TCP addresses in --host")
        return self

    @property
    def hosts(self) -> list[str]:
        """``--host 127.0.0.1,::1`` → ["127.0.0.1", "::1"]: one listening socket each."""
        return split_hosts(self.host)

    @property
    def tcp_hosts(self) -> list[str]:
        return [h for h in self.hosts if not h.endswith(".sock")]

    @property
    def unix_paths(self) -> list[str]:
        return [h for h in self.hosts if h.endswith(".sock")]

    @property
    def local_url(self) -> str:
        """The URL this machine's commands (``stats``, ``warm``, ``show``) reach the proxy at: its first TCP
        address (a wildcard address through the loopback of its family)."""
        host = (self.tcp_hosts or ["127.0.0.1"])[0]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        return f"http://{format_host(host)}:{self.port}"


class UpstreamOptions(Options):
    """The llama-server behind the proxy: one it is given (``--upstream``) or one it starts (``--spawn``)."""

    url: str | None = Field(None, alias="upstream")
    upstream_timeout_s: float = Field(600, gt=0)
    upstream_wait_s: float = Field(60, ge=0)  # a request waits this long for a (re)starting llama-server, then 503
    upstream_api_key: str | None = None  # llama-server's --api-key, for the proxy's own calls
    spawn: bool = False
    model: Path | None = None
    llama_server: Path | None = None
    llama_server_args: list[str] = Field(default_factory=list)  # after ``--`` on the command line
    parallel: int = Field(2, ge=1, le=64)
    ctx_size: int = Field(32768, ge=256)
    spawn_threads: int | None = Field(None, ge=1)
    spawn_max_tokens: int | None = Field(None, ge=0)  # the spawned server's -n (None: 256 for a base model)
    startup_timeout_s: float = Field(300, gt=0)

    @field_validator("url")
    @classmethod
    def _upstream_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")


class SessionOptions(Options):
    """Conversations pinned to slots, snapshotted to disk and restored."""

    drop_volatile_lines: bool = True  # Anthropic Messages: drop per-request billing lines from the system prompt
    slot_save_path: Path | None = None
    max_cache_gb: float = Field(20, gt=0)
    save_every_turn: bool = False
    idle_save_s: float = Field(30, ge=0)  # snapshot a resident session idle this long, once per change (0 = off)
    idle_save_mb_s: float = Field(50, gt=0)  # every save's I/O budget: snapshot MB written per second, on average
    shutdown_save_timeout_s: float = Field(30, gt=0)
    session_ttl_days: float = Field(30, ge=0)
    max_sessions: int = Field(10000, ge=1)
    max_index_mb: float = Field(1024, gt=0)  # the session index's bytes on disk; least recently used go beyond
    enabled: bool = Field(True, alias="sessions")  # off: requests forwarded as they are (no compression either)
    cache_isolation: Literal["credential", "shared"] = "credential"  # slots' KV across credentials (isolation.py)
    allow_slot_actions: bool = False  # pass clients' POST /slots/N?action=... through (under a lease of slot N)


class LimitOptions(Options):
    """What one client may hold of the proxy: body sizes, waits, the queue."""

    max_body_mb: float = Field(64, gt=0)
    progress_interval_s: float = Field(5, ge=0)  # SSE comments to a waiting streaming client (0 = none)
    max_pending_mb: float = Field(1024, ge=0)  # request bodies held in memory at once; beyond: 429 (0 = no bound)
    body_timeout_s: float = Field(60, ge=0)  # a request body not in whole this long after its headers: 408
    max_queue: int = Field(256, ge=0)  # requests waiting for a slot beyond this get 429 + Retry-After (0 = no bound)
    queue_timeout_s: float = Field(600, ge=0)  # a wait for a slot longer than this gets 503 + Retry-After (0 = none)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


class ClusterOptions(Options):
    """Several proxies sharing one session index (docs/scale-out.md)."""

    index: str = "embedded"  # the session index: "embedded" (diskcache in --home) or redis://HOST:PORT/DB (shared)
    node_id: str | None = None  # this node's name in a shared index (default HOSTNAME:PORT)
    advertise_url: str | None = None  # the URL other nodes forward turns to (default http://HOST:PORT)
    heartbeat_s: float = Field(2, gt=0)  # a node renews its heartbeat this often; it expires after 3 of them
    cluster_peers: list[str] = Field(default_factory=list)  # the node URLs a turn may be forwarded to
    cluster_secret: str | None = None  # shared by the nodes: signs heartbeats and forwarded turns (HMAC-SHA256)

    @field_validator("index")
    @classmethod
    def _index(cls, v: str) -> str:
        v = v.strip()
        if v != "embedded" and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected 'embedded' or a redis://HOST:PORT/DB URL")
        return v

    @field_validator("advertise_url")
    @classmethod
    def _advertise(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/") if v else v

    @field_validator("cluster_peers", mode="before")
    @classmethod
    def _peers(cls, v: Any) -> list[str]:
        items = [v] if isinstance(v, str) else list(v or [])
        out = []
        for item in items:
            if not isinstance(item, str):
                raise ValueError("expected node URLs")
            for url in item.split(","):
                url = url.strip().rstrip("/")
                if url:
                    if not url.startswith(("http://", "https://")):
                        raise ValueError(f"{url!r} is not an http:// or https:// URL")
                    out.append(url)
        return out

    @field_validator("cluster_secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        if v is not None and len(v.strip()) < 16:
            raise ValueError("must be at least 16 characters (e.g. `openssl rand -hex 32`)")
        return v.strip() if v is not None else None


class CompressionOptions(Options):
    """A new long message shortened to a budget; omitted lines recalled into later questions (seed defaults: the
    compress package's own, ``compress.pipeline.CompressionSettings``)."""

    pflash: bool = True
    threshold: int = Field(_COMPRESSION.threshold, ge=1)
    prefill_curve: str = DEFAULT_CURVE
    query_pin: int = Field(_COMPRESSION.query_pin, ge=0)
    # one flat threshold (compress.spread: (N_eff - k) / k); None: the scorer's own curve
    fallback_spread: float | None = Field(None, ge=-1, le=100)
    chat_recall: bool = True
    theta: float = Field(_COMPRESSION.theta, ge=0, le=1)
    recall_budget: int = Field(_COMPRESSION.recall_budget, ge=0)
    max_prompt_tokens: int = Field(225280, ge=1)
    min_segment: int = Field(_COMPRESSION.min_segment, ge=1)
    max_segment: int = Field(_COMPRESSION.max_segment, ge=2)
    scorer: str = "lexical"  # a name of the scorer registry (stages/scorers.py), checked when the stages are built
    segmenter: Literal["heuristic", "probe"] = "heuristic"

    @field_validator("prefill_curve")
    @classmethod
    def _curve(cls, v: str) -> str:
        BudgetCurve.parse(v)  # TOKENS:RATIO points, ascending, 0 < RATIO <= 1, and at most one message:SHARE
        return v

    @model_validator(mode="after")
    def _segments(self) -> CompressionOptions:
        if self.min_segment >= self.max_segment:
            raise ValueError("min_segment: must be smaller than max_segment")
        return self

    def pipeline(self, spread: str | float) -> CompressionSettings:
        """The compress package's settings for these options; ``spread``: the flat gate's threshold when
        ``--fallback-spread`` is not given (the scorer's own curve)."""
        return CompressionSettings(
            threshold=self.threshold, curve=BudgetCurve.parse(self.prefill_curve), query_pin=self.query_pin,
            fallback_spread=self.fallback_spread if self.fallback_spread is not None else spread, theta=self.theta,
            recall_budget=self.recall_budget, min_segment=self.min_segment, max_segment=self.max_segment)


class DrafterOptions(Options):
    """A small model that scores units for the attention and head scorers, and its probe files."""

    path: Path | None = Field(None, alias="drafter")
    drafter_gpu_layers: int = 0
    drafter_threads: int = Field(2, ge=1)
    drafter_ctx: int = Field(32768, ge=512)
    drafter_cache_mb: int = Field(512, ge=0)
    drafter_timeout_s: float = Field(120, gt=0)
    attention_heads: str = "auto"
    segment_probe: Path | None = None
    request_probe: Path | None = None
    scoring_head: Path | None = None

    @field_validator("attention_heads")
    @classmethod
    def _heads(cls, v: str) -> str:
        v = v.strip().lower()
        if v in ("auto", "all"):
            return v
        try:
            parse_heads(v)
        except ValueError:
            raise ValueError("expected 'auto', 'all' or LAYER.HEAD pairs like '5.0,11.2'") from None
        return v


class InspectorOptions(Options):
    """Who may read the inspector (/pflash/ui) and /pflash/*."""

    public_host: list[str] = Field(default_factory=list)  # Host names /pflash/* answers besides loopback ones
    api_key: str | None = None  # lets non-loopback clients read the inspector (Authorization: Bearer)

    @field_validator("public_host", mode="before")
    @classmethod
    def _public_hosts(cls, v: Any) -> list[str]:
        items = [v] if isinstance(v, str) else list(v or [])
        out = []
        for item in items:
            if not isinstance(item, str):
                raise ValueError("expected host names")
            for name in item.split(","):
                name = name.strip().lower().rstrip(".")
                if name:
                    if not PUBLIC_HOST.match(name):
                        raise ValueError(f"{name!r} is not a host name (give it without scheme or port)")
                    out.append(name.removeprefix("[").removesuffix("]"))
        return out


# The groups, in the order of ``serve --help``: attribute of ``Settings`` → its model.
GROUPS: dict[str, type[Options]] = {
    "proxy": ProxyOptions, "upstream": UpstreamOptions, "sessions": SessionOptions,
    "compression": CompressionOptions, "drafter": DrafterOptions, "limits": LimitOptions,
    "cluster": ClusterOptions, "inspector": InspectorOptions,
}


@dataclass(frozen=True)
class Option:
    """One option: its name (``--NAME``, ``PFLASH_NAME``, ``NAME =`` in TOML), its group and field there."""

    name: str
    group: str
    field: str
    info: FieldInfo


def _options() -> dict[str, Option]:
    out: dict[str, Option] = {}
    for group, model in GROUPS.items():
        for field, info in model.model_fields.items():
            name = info.alias or field
            if name in out or name in GROUPS and name != group:
                raise RuntimeError(f"option {name!r} is defined twice")  # pragma: no cover - a coding error
            out[name] = Option(name, group, field, info)
    return out


OPTIONS: dict[str, Option] = _options()  # every option by its name, in groups' order
FIELDS = set(OPTIONS)  # the option names


def _values(options: BaseModel) -> dict[str, object]:
    """A group's values by option name, for a copy: all of them but a scorer not given (a drafter's default,
    derived again)."""
    values = options.model_dump(by_alias=True)
    if isinstance(options, CompressionOptions) and "scorer" not in options.model_fields_set:
        values.pop("scorer")
    return values


class Settings(BaseModel):
    """All settings, one group per concern (``GROUPS``). Built from groups (``Settings(compression=...)``) or from
    option names (``Settings(upstream="http://...", threshold=8192)``: each goes into its group)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    proxy: ProxyOptions = Field(default_factory=ProxyOptions)
    upstream: UpstreamOptions = Field(default_factory=UpstreamOptions)
    sessions: SessionOptions = Field(default_factory=SessionOptions)
    compression: CompressionOptions = Field(default_factory=CompressionOptions)
    drafter: DrafterOptions = Field(default_factory=DrafterOptions)
    limits: LimitOptions = Field(default_factory=LimitOptions)
    cluster: ClusterOptions = Field(default_factory=ClusterOptions)
    inspector: InspectorOptions = Field(default_factory=InspectorOptions)

    def __init__(self, **options: object) -> None:  # groups, or options by name (``_by_option_name``)
        super().__init__(**options)

    @model_validator(mode="before")
    @classmethod
    def _by_option_name(cls, data: object) -> object:
        """Option names given flat go into their group (``threshold=`` → ``compression``); a group given whole
        (a model or a mapping) is taken as it is, with any of its options also given flat on top."""
        if not isinstance(data, Mapping):
            return data
        out: dict[str, object] = {}
        flat: dict[str, dict[str, object]] = {}
        for key, value in data.items():
            if key in GROUPS and isinstance(value, (Mapping, BaseModel)):
                out[key] = value
            elif key in OPTIONS:
                flat.setdefault(OPTIONS[key].group, {})[key] = value
            else:
                out[key] = value  # refused below (extra="forbid")
        for group, values in flat.items():
            base = out.get(group)  # a group given whole: a model, a mapping, or absent
            given = _values(base) if isinstance(base, BaseModel) else dict(base) if isinstance(base, Mapping) else {}
            out[group] = {**given, **values}
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if not self.upstream.spawn and not self.upstream.url:
            raise ValueError("upstream: give --upstream URL or --spawn")
        if self.upstream.spawn and self.upstream.url:
            raise ValueError("upstream: --upstream and --spawn are exclusive")
        if self.drafter.path is not None and "scorer" not in self.compression.model_fields_set:
            # a drafter without an explicit --scorer gets DRAFTER_DEFAULT_SCORER (README, Benchmarks), in a copy
            # (the group given may be shared) that still counts the scorer as not given
            compression = self.compression.model_copy()
            object.__setattr__(compression, "scorer", DRAFTER_DEFAULT_SCORER)
            object.__setattr__(self, "compression", compression)  # assignment validation would rerun this
        return self

    def with_options(self, **options: object) -> Settings:
        """A copy with the options named (flat names, as for the constructor) replaced, validated again."""
        given = {g: _values(getattr(self, g)) for g in GROUPS}
        for name, value in options.items():
            if name not in OPTIONS:
                raise ValueError(f"{name}: unknown option")
            given[OPTIONS[name].group][name] = value
        return Settings(**given)

    # Derived from several groups -----------------------------------------------------------------------------
    @property
    def effective_node_id(self) -> str:
        return self.cluster.node_id or f"{socket.gethostname()}:{self.proxy.port}"

    @property
    def effective_advertise_url(self) -> str:
        """The URL other nodes reach this one at: ``--advertise-url``, else the first TCP address (a wildcard
        address named by the host name)."""
        if self.cluster.advertise_url:
            return self.cluster.advertise_url
        host = (self.proxy.tcp_hosts or ["127.0.0.1"])[0]
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"http://{format_host(host)}:{self.proxy.port}"

    @property
    def effective_slot_save_path(self) -> Path:
        return (self.sessions.slot_save_path or self.proxy.home / "slots").expanduser()


# PFLASH_* variables that are not settings: set-up, tests and benches read them
NON_SETTING_ENV = {"PFLASH_CONFIG", "PFLASH_TEST_MODEL_DIR", "PFLASH_WHEELHOUSE", "PFLASH_AGENTS_CACHE"}
_WARNED: set[str] = set()
# Options that no longer exist, with why: a configuration file naming one still loads (one line on stderr)
REMOVED = {"cold_history": "an uncached earlier history is always prefilled as it is (its one value, raw)"}


def _warn_unknown(key: str) -> None:
    """One line on stderr, once per variable and process: a typo must not be silently ignored."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    import difflib
    import sys

    names = [f"PFLASH_{f.upper()}" for f in FIELDS] + list(SEED_ENV_ALIASES)
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    print(f"pflash-proxy: ignoring unknown environment variable {key}{hint}", file=sys.stderr)


def _warn_removed(key: str, path: Path) -> None:
    import sys

    print(f"pflash-proxy: ignoring {key} in {path}: the option was removed ({REMOVED[key]})", file=sys.stderr)


def env_overrides(environ: Mapping[str, str]) -> dict[str, tuple[str | list[str], str]]:
    """``PFLASH_*`` variables → {field: (raw value, source label)}; unknown ones are warned about once."""
    out: dict[str, tuple[str | list[str], str]] = {}
    value: str | list[str]  # a string, or the list a list-valued field is split into
    for key, value in environ.items():
        if not key.startswith("PFLASH_") or key in NON_SETTING_ENV:
            continue
        field = SEED_ENV_ALIASES.get(key) or key[len("PFLASH_"):].lower()
        if field not in FIELDS:
            _warn_unknown(key)
            continue
        if field == "llama_server_args":
            value = value.split()
        elif field in ("public_host", "cluster_peers"):  # PFLASH_PUBLIC_HOST=a.example,b.example
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif field == "chat_recall" and _is_fraction(value):
            # PFLASH_CHAT_RECALL=0.05 sets θ directly; 0/1 switch recall off/on (seed usage).
            out["theta"] = (value, key)
            value = "1"
        out[field] = (value, key)
    return out


def _is_fraction(value: str) -> bool:
    try:
        f = float(value)
    except ValueError:
        return False
    return 0 < f < 1


def load_settings(
    cli: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge file < env < CLI and validate; raise ``ConfigError`` with one clear line."""
    environ = os.environ if environ is None else environ
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    config_file = config_file or environ.get("PFLASH_CONFIG")
    merged: dict[str, object] = {}
    sources: dict[str, str] = {}
    if config_file:
        path = Path(config_file).expanduser()
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config: file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
        for key, value in _flatten_toml(data).items():
            if key in REMOVED:
                _warn_removed(key, path)
                continue
            if key not in FIELDS:
                raise ConfigError(f"{key}: unknown option in {path}")
            merged[key] = value
            sources[key] = str(path)
    for key, (value, label) in env_overrides(environ).items():
        merged[key] = value
        sources[key] = label
    for key, value in cli.items():
        if key not in FIELDS:
            raise ConfigError(f"{key}: unknown option")
        merged[key] = value
        sources[key] = "--" + key.replace("_", "-")
    try:
        return Settings(**merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        parts = [str(p) for p in err["loc"]]
        if parts and parts[0] in GROUPS:  # (group, option, ...): the option names it
            parts = parts[1:2]
        loc = ".".join(parts) or _option_from_msg(err["msg"])
        msg = err["msg"].removeprefix("Value error, ")
        if not parts and ":" in msg:
            loc, msg = msg.split(":", 1)
            msg = msg.strip()
        source = sources.get(loc)
        where = f" (from {source})" if source else ""
        raise ConfigError(f"{loc}{where}: {msg}") from None


def _option_from_msg(msg: str) -> str:
    return msg.removeprefix("Value error, ").split(":", 1)[0]


def _flatten_toml(data: Mapping[str, object]) -> dict[str, object]:
    """Tables in the TOML file are only for grouping: ``[compression] threshold = 1`` → ``threshold``."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        key = key.replace("-", "_")
        if isinstance(value, dict):
            flat.update(_flatten_toml(value))
        else:
            flat[key] = value
    return flat
