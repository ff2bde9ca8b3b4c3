"""The ``X-PFlash-*`` headers: every one the proxy sets on an answer or reads from a request, by name.

They are public API (clients, dashboards and balancers read them; docs/reference.md's table lists them), so every
module names them through these constants.  This module imports nothing of the project.
"""

from __future__ import annotations

PREFIX = "X-PFlash-"  # every header below starts with it; the server re-sends late ones on a stream as a comment

# compression (stages/compress.py)
MODE_HEADER = "X-PFlash-Mode"  # what PFlash did to the turn: passthrough, compressed, recall, full-flat, ...
PROMPT_TOKENS_HEADER = "X-PFlash-Prompt-Tokens"  # the prompt's tokens before compression (when it was compressed)
KEPT_TOKENS_HEADER = "X-PFlash-Kept-Tokens"  # the prompt's tokens after compression (when it was compressed)
BUDGET_NOTE_HEADER = "X-PFlash-Budget-Note"  # why the budget was widened (insufficient_middle_budget)

# sessions and the slot cache (stages/sessions.py)
SESSION_HEADER = "X-PFlash-Session"  # request: the client's name for its session; answer: the session's id
SLOT_HEADER = "X-PFlash-Slot"  # the llama-server slot that served the turn ("all": a batch of prompts)
CACHE_HEADER = "X-PFlash-Cache"  # the turn's prefix cache: hit, hit-prefix, restored (from SSD) or miss
CACHED_TOKENS_HEADER = "X-PFlash-Cached-Tokens"  # prompt tokens taken from the cache (llama-server's on a whole answer)
CACHE_REASON_HEADER = "X-PFlash-Cache-Reason"  # why a turn that had a snapshot or a slot is a miss after all
DEGRADED_HEADER = "X-PFlash-Degraded"  # the session index cannot be read or written: served, not saved

# the spawned llama-server (server/routes.py)
TURN_CAP_HEADER = "X-PFlash-Turn-Cap"  # a spawned base model's cap lowered the request's max_tokens to this

# scale-out across nodes (sessions/cluster.py)
NODE_HEADER = "X-PFlash-Node"  # the node that served the turn
VIA_HEADER = "X-PFlash-Via"  # the node that received the turn and forwarded it to the one that served it
TAKEOVER_HEADER = "X-PFlash-Takeover"  # the node that held the session before this turn took it over
FORWARDED_HEADER = "X-PFlash-Forwarded-By"  # request only, between nodes: the signed node that forwarded this turn

ALL = (MODE_HEADER, PROMPT_TOKENS_HEADER, KEPT_TOKENS_HEADER, BUDGET_NOTE_HEADER, SESSION_HEADER, SLOT_HEADER,
       CACHE_HEADER, CACHED_TOKENS_HEADER, CACHE_REASON_HEADER, DEGRADED_HEADER, TURN_CAP_HEADER, NODE_HEADER,
       VIA_HEADER, TAKEOVER_HEADER, FORWARDED_HEADER)  # every header above, in that order
