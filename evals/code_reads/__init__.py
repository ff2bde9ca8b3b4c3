"""``python -m evals code-reads``: agent file reads of real third-party code, questions generated, split by
package.

``generator`` picks functions and methods from the installed packages and writes the questions
(``questions``); ``run`` reads each file in the three shapes the agents use through the real proxy (dry run:
nothing is prefilled) and writes ``report.md`` and ``results.json``.
"""
