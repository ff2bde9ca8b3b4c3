"""The inspector: what the model read, per session, and what each turn saved.

- ``trace``: the compression and recall traces ``CompressStage`` leaves in ``SessionRecord.traces`` (bounded), and
  the turn traces;
- ``turns``: ``SavingsStage``, which records a turn trace after each answer (the slot's state, llama-server's
  ``timings``, tokens avoided and time saved by cause, estimated) and keeps the totals since start;
- ``data``: the JSON views built from them and from the read-only views the proxy hands it (``InspectorViews``:
  upstream, sessions and slots, counters);
- ``routes``: the aiohttp sub-app (``create_inspector``) serving ``/pflash/ui`` (static pages in ``static/``) and
  ``/pflash/api``, loopback or ``--api-key`` only;
- ``pflash-proxy show [SESSION]`` (``cli/show.py``) shows the same in a terminal.
"""
