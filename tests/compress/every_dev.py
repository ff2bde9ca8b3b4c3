"""Dev phrasings for the "every X" recogniser (``spread.asks_for_every``, the classifier of ``compress/intent.py``),
written for issue 48: requests that ask for every match (or for the whole message) and pointed ones, in several
wordings each. They live in ``pflash_proxy/compress/every_dev.json``, the classifier's training data; held-out
wordings live with the evals (``pflash_proxy/bench``) and are not copied there or here."""

import json
from pathlib import Path

import pflash_proxy.compress

_DATA = json.loads((Path(pflash_proxy.compress.__file__).parent / "every_dev.json").read_text())
EVERY: list[str] = _DATA["every"]
POINTED: list[str] = _DATA["pointed"]
DOCUMENT_QUESTIONS: list[str] = _DATA["pointed_documents"]
