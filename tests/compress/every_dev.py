"""Dev phrasings for the "every X" recogniser (``spread.asks_for_every``, the classifier of ``compress/intent.py``),
written for issue 48: requests that ask for every match (or for the whole message) and pointed ones, in several
wordings each. They live in the relevance lab's ``evals/cases/every_dev.json``, the classifier's training data
(``evals/train_intent.py``); held-out wordings live with the evals (``evals/cases``) and are not copied there or
here."""

import json

from evals.train_intent import DEV

_DATA = json.loads(DEV.read_text())
EVERY: list[str] = _DATA["every"]
POINTED: list[str] = _DATA["pointed"]
DOCUMENT_QUESTIONS: list[str] = _DATA["pointed_documents"]
