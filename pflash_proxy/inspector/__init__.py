"""The inspector: what the model read, per session, and what each turn saved.

It only reads: the traces it shows are built by ``sessions.traces`` (compression, recall, cache) and
``stages.savings.SavingsStage`` (a turn trace after each answer: the slot's state, the engine's counts and times,
tokens avoided and time saved by cause, estimated), which writes them to the session's trace log.

- ``data``: the JSON views built from them and from the read-only views the proxy hands it (``InspectorViews``:
  upstream, sessions and slots, counters);
- ``routes``: the aiohttp sub-app (``create_inspector``) serving ``/pflash/ui`` (static pages in ``static/``) and
  ``/pflash/api``, loopback or ``--api-key`` only;
- ``pflash-proxy show [SESSION]`` (``cli/show.py``) shows the same in a terminal.
"""
