"""The entry points of the driver process, one module per ``toolbox`` subcommand: ``run``, ``tune``, ``eval``,
``export``, ``serve``, ``plot``, ``traces``, ``deploy`` and ``cli`` (the ``toolbox`` command that dispatches to
them). Each has a ``main(argv)`` and runs as ``python -m toolbox.commands.NAME``; ``python -m toolbox.run`` stays the
job entry point. Nothing below this package imports it."""
