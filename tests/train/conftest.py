from tests.drafter.conftest import HAVE_LLAMA, gemma  # noqa: F401 -- the same session-wide gemma fixture
