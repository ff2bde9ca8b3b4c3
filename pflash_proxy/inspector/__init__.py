"""The inspector: what the model read, per session (issue 14).

- ``trace``: the compression and recall traces ``CompressStage`` leaves in ``SessionRecord.extra`` (bounded);
- ``data``: the JSON views built from them and from the running app (slots, sessions, counters);
- ``routes``: ``/pflash/ui`` (static pages in ``static/``) and ``/pflash/api``, loopback or ``--api-key`` only;
- ``show``: ``pflash-proxy show [SESSION]``, the same in a terminal.
"""
