"""The one exception type for bad user input (config, data, checkpoint).

Entry points catch it, print ``error: <message>`` on one line to stderr and exit with
code 2. Messages name what is wrong and how to fix it.
"""


class BadInput(ValueError):
    """Input the user can fix: a typo'd key, an impossible value, a missing checkpoint."""
