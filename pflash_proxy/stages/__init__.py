"""The pipeline stages (the proxy's addons) and the one place their order is written: ``default_stages``.

1. ``chains.ResponseChainStage``: a Responses ``previous_response_id`` is expanded into the items it stands for.
2. ``sessions.SessionStage``: identity, served history, slot lease, restore.
3. ``compress.CompressStage`` (PFlash, when ``--pflash``): the newest long message shortened, recall; its scorer
   and segmenter come from ``scorers.build_scorer`` (the registry ``scorers.SCORERS`` names every scorer).
4. ``inspector.turns.SavingsStage``: notes the turn; after the answer, records what it saved (the inspector's turn
   trace, the savings counters).
5. ``sessions.SessionCommitStage``: the served history is written beside the forwarded request, committed before
   the answer's headers go out.
The server (``server.app.create_app``) and the bench (``bench.runner.Proxy``) both call ``default_stages``.
Imports are lazy: ``config`` reads the scorer registry from this package at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pflash_proxy.config import Settings
    from pflash_proxy.contract import Stage
    from pflash_proxy.engine import Engine
    from pflash_proxy.llama.upstream import Upstream


def default_stages(settings: Settings, upstream: Upstream, *, scorer: Any = None, extra: Sequence[Stage] = (),
                   engine: Engine | None = None) -> list[Stage]:
    """The ordered stage list: response chains → sessions (identity, slot, restore) → compression → commit served
    history, then ``extra`` (the bench's recorder). ``scorer``: a scorer built by the caller (the bench's arms)
    instead of the one ``--scorer`` names; building that one may load a drafter (errors stop start-up).
    ``engine``: the seam the compression and savings stages call (default: llama-server on ``upstream``)."""
    if not settings.sessions:
        return list(extra)
    if engine is None:
        from pflash_proxy.llama.engine import LlamaServerEngine

        engine = LlamaServerEngine(upstream)
    from pflash_proxy.sessions.manager import SessionManager
    from pflash_proxy.stages.chains import ResponseChainStage
    from pflash_proxy.stages.sessions import SessionCommitStage, SessionStage

    manager = SessionManager(settings, upstream)
    # previous_response_id is expanded into the items it stands for before the session is looked up
    stages: list[Stage] = [ResponseChainStage(manager), SessionStage(manager)]
    if settings.pflash:
        from pflash_proxy.stages.compress import CompressStage

        if scorer is not None:
            stages.append(CompressStage(settings, engine, scorer=scorer))
        else:
            from pflash_proxy.stages.scorers import build_scorer

            built = build_scorer(settings)  # loads the drafter when one is configured
            stages.append(CompressStage(settings, engine, built.segmenter, built.scorer, built))
    from pflash_proxy.inspector.turns import SavingsStage

    stages.append(SavingsStage(manager, settings.threshold if settings.pflash else None, engine))
    stages.append(SessionCommitStage(manager))
    return stages + list(extra)
