"""Dev phrasings for the "every X" recogniser (``spread.every_intent``), written for issue 48: requests that ask
for every match (or for the whole message) and pointed ones, in several wordings each. Tuning only on these;
held-out wordings live with the evals (``pflash_proxy/bench``) and are not copied here."""

EVERY = [
    # quantified
    "Describe all handlers.", "What does each handler do?", "Explain every retry path in this file.",
    "For each endpoint, tell me which status codes it returns.", "Show me all the places the lock is taken.",
    "Give me all config options with their defaults.", "Which tests touch the cache, all of them please.",
    "What do all the subclasses override?", "Go over each of the migrations and say what it changes.",
    "Check every call to open() and tell me which ones leak.",
    # plural after a question word
    "Which functions call retry?", "What files import the settings module?", "Which methods raise KeyError?",
    "Which classes inherit from BaseHandler?", "What errors can this parser throw?",
    "Which options are deprecated?", "Which records mention the product Nimbolt?",
    "What events does the scheduler emit?", "Which routes require authentication?",
    "What environment variables does it read?",
    # uses and occurrences
    "Where is retry used?", "Where is the timeout value read?", "Where else is this flag checked?",
    "Who calls flush_buffers?", "What uses the connection pool?", "Find the callers of parse_header.",
    "Show me the usages of the legacy client.", "Where do we log the user's email?",
    "Is the token ever written to disk anywhere?", "Where all is the config mutated?",
    # counted and enumerated
    "How many handlers are registered?", "Count the TODO comments.", "What is the number of retries per job?",
    "List the public API.", "Enumerate the states of the state machine.", "Give me a full list of the flags.",
    "list the sections that talk about billing", "Can you list what this file exports?",
    # summaries and the whole
    "Give a Summary of what this module does", "Summarize this file.", "Give me an overview of the document.",
    "What does this module do?", "What is this file for?", "Describe this document.", "tl;dr?",
    "Explain the whole script to me.", "Walk me through this code.", "What's the gist of the article?",
    "Can you recap the log above?", "High-level description of the package please.",
    "What reaches the cache? Be exhaustive.", "Audit this whole module for thread-safety problems.",
]

POINTED = [
    "Which function calls retry?", "Where is retry defined?", "What does the handler do?",
    "What does parse_header return for an empty line?", "Why does the upload fail with a 413?",
    "How is the timeout computed?", "Which class owns the connection pool?", "What does trimcoef return when every "
    "coefficient is small?", "Which function returns all items of a list?", "Where is the retry limit set?",
    "What is the launch code for the orbital relay?", "Who wrote the Kestrel treaty?",
    "In Summary.time, what happens step by step?", "What does the Summary class do with its quantiles?",
    "How does the cache decide to evict an entry?", "Why is the second request slower than the first?",
    "Fix the off-by-one error in the pagination.", "Explain the locking in flush_buffers.",
    "What is the default port?", "When does the scheduler give up on a job?",
    "How many times does make_numbered_dir try before it gives up?", "Which team filed REC-14502?",
    "Is there a bug in the date parsing?", "What happens if the file is missing?",
    "Rename the helper that builds the URL.", "Which exception is raised when the key is missing?",
    "Where does the config file get loaded from?", "What does this regex match?",
    "How do I turn off the progress bar?", "Why does it hang when all workers are busy?",
    "What is the return type of fetch?", "Which line sets the user agent?", "Add a docstring to the parser.",
    "Does the client retry on a 503?", "What does the --strict flag change?",
    "How is each request authenticated before it reaches the handler?", "What is the first step of the install?",
    "Which of the functions handles the redirect?", "Tell me what the decode step does.",
    "Where does the error message come from?", "Can you explain why the test is flaky?",
    "What does the constructor of Pool do with its arguments?", "What year did Ilse Marrow sign the treaty?",
    "How does it handle a missing header?", "What happens after all retries fail?",
    "Which verbs does the request parser's parse_message accept?", "What options does Pool.map take?",
]
