"""Command implementations of `thor`, one module per subcommand."""
