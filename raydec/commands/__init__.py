"""The `raydec` subcommands that start long-running services (``raydec serve``)."""
