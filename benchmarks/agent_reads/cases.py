"""24 questions about one function each, in real third-party source files of 20K-60K characters.

The files are read from the packages installed in the project's virtual environment (jinja2, numpy, pydantic,
pytest), so nothing is vendored; a case whose function is missing in the installed version is reported as
skipped, never silently dropped. Half the questions name the function (``named``), half describe what it does in
other words (``described``). Gold: the function's lines (decorators included), found with ``ast``.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    module_file: str  # path under site-packages, e.g. "jinja2/utils.py"
    function: str
    style: str  # "named" | "described"
    question: str

    @property
    def name(self) -> str:
        return f"{self.module_file}:{self.function}"


CASES: list[Case] = [
    Case("jinja2/utils.py", "url_quote", "named",
         "In url_quote, what happens to an argument that is neither bytes nor str, and what changes when for_qs is set?"),
    Case("jinja2/utils.py", "generate_lorem_ipsum", "described",
         "How does the placeholder-text generator decide where to put commas and full stops among the random words?"),
    Case("jinja2/utils.py", "select_autoescape", "named",
         "What does select_autoescape return for a template that has no name?"),
    Case("jinja2/utils.py", "htmlsafe_json_dumps", "described",
         "Which helper serialises an object to JSON that is safe to drop into an HTML script tag, and which "
         "characters does it escape?"),
    Case("jinja2/filters.py", "do_dictsort", "named",
         "What does do_dictsort raise when `by` is neither 'key' nor 'value'?"),
    Case("jinja2/filters.py", "do_xmlattr", "described",
         "Which filter turns a mapping into an attribute string for a tag, and what does it do with keys that "
         "contain a space, a slash or an equals sign?"),
    Case("jinja2/filters.py", "do_replace", "named",
         "In do_replace, how is the count argument handled, and what happens when autoescaping is enabled?"),
    Case("jinja2/lexer.py", "compile_rules", "described",
         "How are the start delimiters for comments, blocks and variables ordered so that the longest one is "
         "tried first?"),
    Case("jinja2/lexer.py", "get_lexer", "named",
         "How does get_lexer decide whether it can reuse a cached lexer for an environment?"),
    Case("numpy/polynomial/polyutils.py", "trimcoef", "named",
         "What does trimcoef raise when tol is negative, and what does it return when every coefficient is small?"),
    Case("numpy/polynomial/polyutils.py", "mapdomain", "described",
         "Which function applies the linear map that sends one interval onto another to an array of points?"),
    Case("numpy/polynomial/polyutils.py", "getdomain", "described",
         "Which function works out the smallest interval that holds all the given points, and what does it give "
         "back when the points are complex numbers?"),
    Case("numpy/lib/_shape_base_impl.py", "array_split", "named",
         "How does array_split share out the extra elements when the array does not divide equally?"),
    Case("numpy/lib/_shape_base_impl.py", "column_stack", "described",
         "Which function stacks one-dimensional arrays side by side as the columns of a two-dimensional result?"),
    Case("numpy/lib/_arraysetops_impl.py", "setxor1d", "named",
         "How does setxor1d find the values that are in only one of the two inputs?"),
    Case("numpy/lib/_arraysetops_impl.py", "setdiff1d", "described",
         "Which function returns the unique values of the first array that do not occur in the second one?"),
    Case("numpy/lib/_twodim_base_impl.py", "tri", "named",
         "What does tri build, and what dtype does it use by default?"),
    Case("numpy/lib/_twodim_base_impl.py", "mask_indices", "described",
         "Which function takes a masking function such as triu and gives back the indices where the mask of an "
         "n-by-n array is non-zero?"),
    Case("pydantic/_internal/_fields.py", "_check_protected_namespaces", "described",
         "Where does pydantic warn or fail when a field name starts with a reserved prefix such as model_?"),
    Case("pydantic/_internal/_fields.py", "resolve_default_value", "named",
         "In resolve_default_value, when is the default factory called with the validated data?"),
    Case("_pytest/pathlib.py", "make_numbered_dir", "named",
         "How many times does make_numbered_dir try before it gives up, and what does it raise then?"),
    Case("_pytest/pathlib.py", "on_rm_rf_error", "described",
         "What happens when removing a directory tree hits a read-only file: which errors are ignored, warned "
         "about, or fixed by changing permissions and trying again?"),
    Case("_pytest/main.py", "_in_venv", "named",
         "How does _in_venv tell that a directory is a virtual environment?"),
    Case("_pytest/main.py", "validate_basetemp", "described",
         "What stops a user from passing the current working directory, or one of its parents, as the base "
         "temporary directory?"),
]


def site_root(module_file: str) -> Path:
    top = importlib.import_module(module_file.split("/")[0])
    return Path(top.__file__).resolve().parent.parent


def load(case: Case) -> tuple[str, tuple[int, int]] | None:
    """(file text, 1-based inclusive line range of the function) or None when it is not in this version."""
    path = site_root(case.module_file) / case.module_file
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == case.function:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return text, (first, node.end_lineno or node.lineno)
    return None
