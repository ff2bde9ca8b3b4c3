"""The pipeline stages (the proxy's addons) and the one place their order is written: ``default_stages``.

1. ``chains.ResponseChainStage``: a Responses ``previous_response_id`` is expanded into the items it stands for.
2. ``sessions.SessionStage``: identity, served history, slot lease, restore.
3. ``compress.CompressStage`` (PFlash, when ``--pflash``): the newest long message shortened, recall; its scorer
   and segmenter come from ``scorers.build_scorer`` (the registry ``scorers.SCORERS`` names every scorer).
4. ``savings.SavingsStage``: notes the turn; after the answer, records what it saved (the inspector's turn
   trace, the savings counters) and writes the turn's traces to the session's trace log.
5. ``sessions.SessionCommitStage``: the served history is written beside the forwarded request, committed before
   the answer's headers go out.
The server (``server.app.create_app``, for the bench too) calls ``default_stages`` with the session service it
built, starts and stops; each stage gets its own group of the settings (``CompressStage`` the ``compression``
options). With ``--no-sessions`` the list is only ``extra``: requests are forwarded as they are, without
compression either (it needs the session's served history to know which message is new and to keep what a slot
holds consistent).
Imports are lazy: the command line imports the scorer registry from this package for ``--help``.
The stages hand each other what they found through the request's typed notes (``contract.StageNotes``): a stage
module imports the contract, never another stage module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pflash_proxy.compress import Scorer
    from pflash_proxy.config import Settings
    from pflash_proxy.contract import Stage
    from pflash_proxy.engine import Engine
    from pflash_proxy.sessions.index import SessionIndex
    from pflash_proxy.sessions.service import SessionService

log = logging.getLogger(__name__)


def default_stages(settings: Settings, engine: Engine, sessions: SessionService | None = None, *,
                   scorer: Scorer | None = None, extra: Sequence[Stage] = (), index: SessionIndex | None = None
                   ) -> list[Stage]:
    """The ordered stage list: response chains → sessions (identity, slot, restore) → compression → commit served
    history, then ``extra`` (the bench's recorder). ``sessions``: the session service the session stages call,
    which its builder starts and stops (the app's, ``server.app.create_app``; None: one is built here on ``index``,
    the one ``--index`` names unless given, for a caller that starts it itself). ``scorer``: a scorer built by the
    caller (the bench's arms) instead of the one ``--scorer`` names; building that one may load a drafter (errors
    stop start-up). ``engine``: the seam the session, compression and savings stages call (the app's
    ``LlamaServerEngine``)."""
    from pflash_proxy.stages.scorers import check_scorer

    check_scorer(settings.compression.scorer)  # a name the registry does not know stops start-up, sessions or not
    if not settings.sessions.enabled:
        if settings.compression.pflash:
            log.info("--no-sessions: requests are forwarded as they are, without compression or recall")
        return list(extra)
    from pflash_proxy.stages.chains import ResponseChainStage
    from pflash_proxy.stages.sessions import SessionCommitStage, SessionStage

    if sessions is None:
        from pflash_proxy.sessions.service import SessionService

        sessions = SessionService(settings, engine, index)
    # previous_response_id is expanded into the items it stands for before the session is looked up
    stages: list[Stage] = [ResponseChainStage(sessions), SessionStage(sessions, engine)]
    if settings.compression.pflash:
        from pflash_proxy.stages.compress import CompressStage

        if scorer is not None:
            stages.append(CompressStage(settings.compression, engine, scorer=scorer))
        else:
            from pflash_proxy.stages.scorers import build_scorer

            built = build_scorer(settings)  # loads the drafter when one is configured
            stages.append(CompressStage(settings.compression, engine, built.segmenter, built.scorer, built))
    from pflash_proxy.stages.savings import SavingsStage

    stages.append(SavingsStage(sessions, settings.compression.threshold if settings.compression.pflash else None,
                               engine))
    stages.append(SessionCommitStage())
    return stages + list(extra)
