"""The ``edged`` command: one console script with subcommands."""
