"""``kimi upstream-tests``: upstream's own tests for the files the series changes, pristine against patched."""
