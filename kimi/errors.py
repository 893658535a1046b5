"""Errors the command line reports as one clear message (exit code 1)."""


class KimiError(Exception):
    """A failure the user can act on.

    The message names what is wrong and the fix; the CLI prints it without a
    traceback and exits with status 1.  Usage errors (bad flags) are argparse's
    and exit with status 2.
    """
