"""``CompressStage``: the I/O shell around the sans-IO ``compress`` package (PFlash for chat requests). It runs
after ``SessionStage`` (which knows what the slot already holds) and before ``SessionCommitStage``.

- Admission (``_candidate``): the candidates are this turn's messages (after the last assistant message) that the
  session was not served, never a ``system``/``developer`` message; the newest of at least ``--threshold`` tokens
  (exact per-line counts from ``Engine.pieces``) is compressed. Before that the whole prompt is bounded by
  ``--max-prompt-tokens`` (``_refuse_long_prompt``, ``_refuse_oversized``: 400 ``context_length_exceeded``),
  counting from bytes first so a long history is refused without tokenizing all of it.
- Compression runs in an executor (numpy, never on the event loop) within a budget over the tokens the upstream
  would prefill; the served message is re-tokenized and the budget corrected a few times if it missed.
- Recall: on a short new user turn in a session with omitted lines, the omitted units are scored against its
  question and the best excerpts prepended (and stored, so the turn replays).
- A cold history (no slot, no snapshot) over the threshold is served as it is (``full-cold``).
- Any failure serves the message whole (``full-error``, the reason in the log).
Headers: ``X-PFlash-Mode``, ``X-PFlash-Prompt-Tokens``, ``X-PFlash-Kept-Tokens``, and
``X-PFlash-Budget-Note: insufficient_middle_budget`` when the budget was widened (``full-budget``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping

from pflash_proxy.compress import (
    Compressor, LexicalScorer, RecallGate, RecallSource, RequestFinder, Scorer, Segmenter,
    TokenizedText, UnitSegmenter, format_recall_block,
)
from pflash_proxy.compress.pipeline import CompressionOutcome, Landing
from pflash_proxy.compress.request import RequestSpec, follow_up_query
from pflash_proxy.compress.rewrite import Source
from pflash_proxy.compress.text import split_lines
from pflash_proxy.config import CompressionOptions
from pflash_proxy.engine import Engine, EngineError, counts_per_line
from pflash_proxy.errors import ProxyError
from pflash_proxy.headers import BUDGET_NOTE_HEADER, KEPT_TOKENS_HEADER, MODE_HEADER, PROMPT_TOKENS_HEADER
from pflash_proxy.models import message_text
from pflash_proxy.contract import CompressionNote, Message, ProxyRequest, SessionContext, Stage
from pflash_proxy.sessions.traces import record_compression, record_recall, segmenter_name
from pflash_proxy.stages.scorers import Scoring, default_spread
from pflash_proxy.stats import CompressStats

log = logging.getLogger(__name__)

_BUDGET_ROUNDS = 4
_ANSWER_ROOM = 1 / 8  # of the slot's context: the most the widening of an unsure code ranking leaves for the answer
_ANSWER_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # the answer's limit, by dialect
_SAMPLE_CHARS = 65536  # chars per token of an oversized message are measured on its first 64 K characters
_NEVER_SHORTENED = ("system", "developer")  # the agent's instructions, like its tool definitions


_COUNT_CHUNK_CHARS = 1 << 18  # the whole-prompt bound tokenizes long prompts in pieces of at most this many
_MIN_CHUNK_CHARS = 1 << 14  # ... and at least this many characters (twice the limit in between)
_CUT_SLACK = 2  # tokens a cut between two pieces may add to their count (a merge split in two)
_TEMPLATE_SLACK = 16  # tokens the chat template may add per message


def _prompt_texts(m: Message) -> list[str]:
    """The texts of one message that reach the prompt: its content, and its tool calls' names and arguments."""
    out = [message_text(m.get("content"))]
    calls = m.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.extend(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                       for v in (fn.get("name"), fn.get("arguments")) if v is not None)
    return [t for t in out if t]


class ContextTooLong(ProxyError):
    status = 400
    code = "context_length_exceeded"


class CompressStage(Stage):
    name = "pflash"

    def __init__(self, settings: CompressionOptions, engine: Engine, segmenter: Segmenter | None = None,
                 scorer: Scorer | None = None, resources: Scoring | None = None):
        self.settings = settings  # the compression options; the compressor gets the compress package's form of them
        self.resources = resources  # owns the drafter, if any (closed on stop)
        self.engine = engine
        self._n_ctx: int | None = None  # the slot's context, once the engine said it (``_widen_room``)
        self.scorer: Scorer = scorer or LexicalScorer()
        segmenter = segmenter or UnitSegmenter(settings.min_segment, settings.max_segment)
        self.compressor = Compressor(settings.pipeline(default_spread(self.scorer.name)), segmenter, self.scorer)
        self.finder = RequestFinder(query_pin=settings.query_pin)
        self.gate = RecallGate(theta=settings.theta, recall_budget=settings.recall_budget)
        self.counters: dict[str, int] = {}
        self.tokens_in = self.tokens_kept = 0

    # Pipeline hook ---------------------------------------------------------------------------------------
    async def on_request(self, req: ProxyRequest) -> None:
        ctx = req.notes.session
        if req.kind != "chat" or ctx is None or ctx.turn.record is None:
            return
        mode, prompt_tokens, kept_tokens, failed = "passthrough", None, None, None
        try:
            result = await self._process(req, ctx)
            if result is not None:
                mode, prompt_tokens, kept_tokens = result
        except ContextTooLong:
            raise
        except EngineError as exc:  # unreachable, not ready, or a count the engine refused
            mode, failed = "full-error", str(exc)
            log.warning("pflash: serving the message whole: the engine call failed: %s", exc)
        except Exception as exc:  # never fail the request because of compression
            mode, failed = "full-error", f"{type(exc).__name__}: {exc}"
            log.exception("pflash: serving the message whole after an internal error")
        # what the compressor noted when it ran (``_compress``), with the mode served and why it failed, if it did
        note = req.notes.compression or CompressionNote(mode)
        note.mode, note.reason = mode, failed or note.reason
        req.notes.compression = note
        self.counters[mode] = self.counters.get(mode, 0) + 1
        req.response_headers[MODE_HEADER] = mode
        if prompt_tokens is not None:
            req.response_headers[PROMPT_TOKENS_HEADER] = str(prompt_tokens)
            req.response_headers[KEPT_TOKENS_HEADER] = str(kept_tokens)
        req.log_fields["pflash"] = mode
        if note.reason is not None:
            req.log_fields["pflash_reason"] = note.reason

    async def _process(self, req: ProxyRequest, ctx: SessionContext) -> tuple[str, int, int] | None:
        if not self.settings.pflash:
            return None
        messages: list[Message] = list(req.messages)
        await self._refuse_long_prompt(req, messages)
        new_from = ctx.turn.matched
        if new_from >= len(messages):
            return None
        newest = len(messages) - 1
        newest_text = message_text(messages[newest].get("content"))
        found = await self._candidate(req, ctx, messages)
        if found is None:
            return await self._recall(req, ctx, messages, newest, newest_text) or await self._cold(ctx, messages,
                                                                                                    newest)
        idx, prompt_tokens, tt = found
        return await self._compress(req, ctx, messages, idx, tt, prompt_tokens)

    async def _candidate(self, req: ProxyRequest, ctx: SessionContext,
                         messages: list[Message]) -> tuple[int, int, TokenizedText] | None:
        """The newest long message of this turn that may be shortened, and the prompt's token count.

        Candidates are the messages after the last assistant message that the session has not been served, newest
        first, whose role is not ``system``/``developer`` (instructions are the agent's program and are never
        shortened; tool definitions never are messages). A message's UTF-8 byte length bounds its token count
        from above, so only those of at least ``threshold`` bytes are counted exactly (``Engine.pieces``:
        the per-line counts the compression needs, so the chosen message is tokenized once); the first of at least
        ``threshold`` tokens wins, so a shorter long-looking message never shields an earlier long one. The whole
        prompt is counted first (``Engine.count_prompt``, one number) and refused above ``--max-prompt-tokens`` before
        any pieces are requested.
        """
        turn = next((i + 1 for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), 0)
        prompt_tokens = None
        for i in range(len(messages) - 1, max(ctx.turn.matched, turn) - 1, -1):
            if messages[i].get("role") in _NEVER_SHORTENED:
                continue
            text = message_text(messages[i].get("content"))
            if len(text.encode("utf-8")) < self.settings.threshold:
                continue
            if prompt_tokens is None:
                await self._refuse_oversized(text)
                prompt_tokens = await self.engine.count_prompt(req.chat_body())
                if prompt_tokens > self.settings.max_prompt_tokens:
                    raise ContextTooLong(f"this request has {prompt_tokens} prompt tokens, more than the "
                                         f"{self.settings.max_prompt_tokens} allowed with PFlash on "
                                         "(--max-prompt-tokens)")
                if prompt_tokens < self.settings.threshold:
                    return None  # the whole prompt is shorter than the threshold: so is every message in it
            tt = await self._tokenized(text)
            if tt.total_tokens >= self.settings.threshold:
                return i, prompt_tokens, tt
        return None

    async def _refuse_long_prompt(self, req: ProxyRequest, messages: list[Message]) -> None:
        """First of all: ``--max-prompt-tokens`` bounds the whole prompt, whichever messages carry it
        (history, instructions, tool calls, tool definitions). No token is shorter than a byte, so a prompt whose
        text is at most the limit in UTF-8 bytes costs nothing. Beyond, its text is tokenized in pieces of twice
        the limit in characters (16 K to 256 K), in order, until the count passes the limit plus the tokens the cuts between pieces
        can add (``_CUT_SLACK`` each): the request is then refused having tokenized about the limit's worth of
        text and one piece, never all of a huge body. A prompt counted whole that comes near the limit (within
        ``_TEMPLATE_SLACK`` tokens a message for the chat template) is counted exactly (``count_prompt``)."""
        limit = self.settings.max_prompt_tokens
        texts = [t for m in messages for t in _prompt_texts(m)]
        tools = req.body.get("tools")
        if tools:
            texts.append(json.dumps(tools, ensure_ascii=False))
        if sum(map(len, texts)) * 4 <= limit or sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) <= limit:
            return
        text = "\n".join(texts)
        chunk = min(_COUNT_CHUNK_CHARS, max(_MIN_CHUNK_CHARS, 2 * limit))  # a piece: about the limit's worth
        counted = pieces = 0
        for at in range(0, len(text), chunk):
            counted += await self.engine.count_text(text[at:at + chunk])
            pieces += 1
            if counted - pieces * _CUT_SLACK > limit:
                raise ContextTooLong(f"this request has more than {limit} prompt tokens (more than "
                                     f"{counted - pieces * _CUT_SLACK:,} counted in the first "
                                     f"{min(len(text), at + chunk):,} of its {len(text):,} "
                                     "characters), the most allowed with PFlash on (--max-prompt-tokens)")
        if counted + _TEMPLATE_SLACK * len(messages) > limit:
            prompt_tokens = await self.engine.count_prompt(req.chat_body())
            if prompt_tokens > limit:
                raise ContextTooLong(f"this request has {prompt_tokens} prompt tokens, more than the {limit} "
                                     "allowed with PFlash on (--max-prompt-tokens)")

    async def _refuse_oversized(self, text: str) -> None:
        """A cheap bound before the exact count: a message far over ``--max-prompt-tokens`` is refused after
        tokenizing a prefix of about 1.25x the limit's worth of text (its chars per token measured on a 64 KB
        sample), never the whole of it. A prefix's token count is at most one more than its share of the whole's,
        so a prefix over the limit (+1) proves the message is."""
        limit = self.settings.max_prompt_tokens
        if len(text.encode("utf-8")) <= limit:  # no token is shorter than a byte
            return
        sample = text[:_SAMPLE_CHARS]
        per_token = len(sample) / max(1, await self.engine.count_text(sample))
        probe = int(limit * per_token * 1.25) + 1
        if probe >= len(text):
            return  # the exact count costs about as much
        n = await self.engine.count_text(text[:probe])
        if n > limit + 1:
            raise ContextTooLong(f"this request has more than {n - 1} prompt tokens (counted on the first "
                                 f"{probe:,} of {len(text):,} characters of one message), more than the {limit} "
                                 "allowed with PFlash on (--max-prompt-tokens)")

    # Compression -----------------------------------------------------------------------------------------
    async def _compress(self, req: ProxyRequest, ctx: SessionContext, messages: list[Message], idx: int,
                        tt: TokenizedText, prompt_tokens: int) -> tuple[str, int, int]:
        loop = asyncio.get_running_loop()
        msg = messages[idx]
        source: Source = "tool" if msg.get("role") in ("tool", "function") else "paste"
        label = str(idx + 1)
        request = self.finder.find(messages, idx, tt)
        uncached = max(prompt_tokens - ctx.turn.expected, tt.total_tokens)
        # A running conversation is one this session has answered: the served history (the requests, not the
        # answers) reaches up to an assistant message. A new chat that shares only a system prompt (or an
        # agent's fixed preamble) with an earlier session is cold, so its flat ranking gets full prefill; in a
        # running one a flat ranking is served with markers, and recall brings lines back.
        in_conversation = any(m.get("role") == "assistant" for m in messages[:ctx.turn.matched + 1])
        req.relay.progress = f"compressing {tt.total_tokens:,} tokens ({self.scorer.name})"
        t0 = time.perf_counter()
        room = await self._widen_room(prompt_tokens, tt.total_tokens, req.body)
        outcome = await loop.run_in_executor(None, functools.partial(
            self.compressor.compress, tt, request, uncached, in_conversation, source, label, widen_room=room))
        budget = outcome.budget_tokens  # the message's budget; a corrected re-run selects against budget - error
        if outcome.mode == "compressed":
            outcome, served_tokens = await self._land_on_budget(tt, request, uncached, in_conversation, source,
                                                                label, outcome, room)
        total_ms = (time.perf_counter() - t0) * 1000
        served = served_tokens if outcome.mode == "compressed" else tt.total_tokens
        record_compression(ctx.traces, idx, msg, tt, request, outcome, prompt_tokens, uncached, self.scorer.name,
                           segmenter_name(self.compressor.segmenter), served, budget)
        fields = {"tokens_in": tt.total_tokens, "units_in": outcome.units_in, "units_kept": outcome.units_kept,
                  "budget_tokens": budget, "scorer": self.scorer.name, "pflash_ms": round(total_ms, 1),
                  **({"gutter": outcome.gutter} if outcome.gutter else {}),
                  **{f"ms_{k}": round(v, 2) for k, v in outcome.stage_ms.items()}}
        req.notes.compression = CompressionNote(outcome.mode, ms=round(total_ms, 1), scorer=self.scorer.name,
                                          stage_ms=dict(outcome.stage_ms))
        if outcome.mode != "compressed":
            req.log_fields.update(fields)
            req.notes.compression.reason = outcome.reason
            log.info("pflash %s: message %s (%d tokens) served whole: %s", outcome.mode, label, tt.total_tokens,
                     outcome.reason, extra={"fields": fields})
            return outcome.mode, prompt_tokens, prompt_tokens
        kept_prompt = prompt_tokens - tt.total_tokens + served_tokens
        fields["tokens_kept"] = served_tokens
        log.info("pflash compressed message %s: %d → %d tokens, %d → %d units (%s, %.0f ms)", label,
                 tt.total_tokens, served_tokens, outcome.units_in, outcome.units_kept, fields["scorer"], total_ms,
                 extra={"fields": fields})
        req.log_fields.update(fields)
        if outcome.budget_note is not None:  # the budget was widened: say so (``pipeline.middle_budget``)
            req.response_headers[BUDGET_NOTE_HEADER] = outcome.budget_note
            req.notes.compression.reason = outcome.reason
        _serve_text(req, messages, idx, outcome.text)
        if outcome.recall is not None and outcome.recall.omitted_texts:  # kept with the history by the commit
            req.notes.compression.recall = outcome.recall
        self.tokens_in += tt.total_tokens
        self.tokens_kept += served_tokens
        return "compressed", prompt_tokens, kept_prompt

    async def _widen_room(self, prompt_tokens: int, message_tokens: int, body: Mapping[str, object]) -> int | None:
        """The most an unsure code ranking may widen this message's budget to (``coderank.widen``): the slot's
        context (``EngineInfo.n_ctx``, asked once) less the rest of the prompt and less room for the answer (the
        request's own limit, ``max_tokens`` or its dialect's name for it, at most ``_ANSWER_ROOM`` of the
        context; that share when it sets none), so that a prompt the curve's budget fits is not widened past the
        context. None when the engine does not say (no bound)."""
        if self._n_ctx is None:
            try:
                self._n_ctx = (await self.engine.describe(wait=False)).n_ctx
            except EngineError:
                return None
        if self._n_ctx is None:
            return None
        asked = next((v for k in _ANSWER_LIMITS if isinstance(v := body.get(k), int) and v > 0), None)
        answer = int(self._n_ctx * _ANSWER_ROOM) if asked is None else min(asked, int(self._n_ctx * _ANSWER_ROOM))
        return self._n_ctx - (prompt_tokens - message_tokens) - answer

    async def _land_on_budget(self, tt: TokenizedText, request: RequestSpec, uncached: int, in_conversation: bool,
                              source: Source, label: str, outcome: CompressionOutcome, room: int | None = None
                              ) -> tuple[CompressionOutcome, int]:
        """Measure the served message exactly; while it is past the budget or more than ``LAND_SLACK`` below it
        (the note/marker estimate off), re-select with the measured error taken off (``Landing``: a few cheap
        rounds, each reusing the first round's units and scores) and keep the best: at most the budget and
        closest to it, else the least over."""
        loop = asyncio.get_running_loop()
        landing = Landing(outcome.budget_tokens, (outcome, await self._count(outcome.text)))
        for _ in range(_BUDGET_ROUNDS):
            adjust = landing.next_adjust()
            if adjust is None:
                break
            retry = await loop.run_in_executor(None, functools.partial(
                self.compressor.compress, tt, request, uncached, in_conversation, source, label,
                budget_adjust=adjust, analysis=outcome.analysis, widen_room=room))  # the same units and scores
            if retry.mode != "compressed":
                break
            landing.offer(retry, await self._count(retry.text))
        return landing.best

    async def _cold(self, ctx: SessionContext, messages: list[Message], idx: int) -> tuple[str, int, int] | None:
        """An uncached earlier history of at least ``threshold`` tokens is prefilled as it is (never compressed):
        say so with ``full-cold``."""
        if ctx.turn.cache != "miss" or idx == 0:
            return None
        history = "".join(message_text(m.get("content")) for m in messages[:idx]
                          if m.get("role") not in _NEVER_SHORTENED)  # instructions never are candidates
        if len(history.encode("utf-8")) < self.settings.threshold:
            return None
        n = await self.engine.count_text(history)
        if n < self.settings.threshold:
            return None
        return "full-cold", n, n

    # Recall ----------------------------------------------------------------------------------------------
    async def _recall(self, req: ProxyRequest, ctx: SessionContext, messages: list[Message], idx: int,
                      text: str) -> tuple[str, int, int] | None:
        assert ctx.turn.record is not None  # on_request admits only requests with a session record
        sources: list[RecallSource] = ctx.turn.record.recall_sources
        msg = messages[idx]
        if not self.settings.chat_recall or not sources or msg.get("role") != "user" or not text.strip():
            return None
        loop = asyncio.get_running_loop()
        query = follow_up_query(msg, self.finder.query_pin)  # the question, not the client's reminders
        if not query.strip():
            return None
        decision = await loop.run_in_executor(None, functools.partial(self.gate.decide, sources, query, self.scorer))
        req.log_fields["recall_share"] = round(decision.share, 4)
        if not decision.recall:
            return None
        block = format_recall_block(decision.recalled)
        record_recall(ctx.traces, idx, decision)
        _serve_text(req, messages, idx, block + ("\n" if block.endswith("\n") else "\n\n") + text)
        recalled = sum(e.tokens for e in decision.recalled)
        log.info("pflash recall: %d excerpt(s), %d tokens, share %.3f", len(decision.recalled), recalled,
                 decision.share, extra={"fields": {"recall_tokens": recalled}})
        return "recall", recalled, recalled

    # Token counts ----------------------------------------------------------------------------------------
    async def _tokenized(self, text: str) -> TokenizedText:
        """Exact per-line token counts from the engine's tokenizer (each token counted on its first line)."""
        lines = split_lines(text)
        return TokenizedText(text, lines, counts_per_line(lines, await self.engine.pieces(text)))

    async def _count(self, text: str) -> int:
        return await self.engine.count_text(text)

    async def stop(self) -> None:
        if self.resources is not None:
            self.resources.close()

    def stats(self) -> CompressStats:
        scoring = self.resources.stats() if self.resources is not None and self.resources.drafter is not None \
            else None
        return CompressStats(dict(self.counters), self.tokens_in, self.tokens_kept, self.settings.threshold,
                             self.scorer.name, segmenter_name(self.compressor.segmenter), scoring)


def _serve_text(req: ProxyRequest, messages: list[Message], idx: int, text: str) -> None:
    """Forward ``messages`` with message ``idx`` carrying ``text`` instead of what the client sent."""
    messages[idx] = _with_text(messages[idx], text)
    req.set_messages(messages)


def _with_text(msg: Message, text: str) -> Message:
    """The message with its text replaced; content parts keep their shape (non-text parts stay)."""
    new = dict(msg)
    content = msg.get("content")
    if isinstance(content, list):
        others = [p for p in content if not (isinstance(p, dict) and p.get("type", "text") == "text")]
        new["content"] = [{"type": "text", "text": text}, *others]
    else:
        new["content"] = text
    return new
