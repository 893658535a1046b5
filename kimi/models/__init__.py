"""Reference models made by the project (never downloaded): ``tokenizer`` and ``reference``."""
