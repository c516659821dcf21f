"""`python -m goose`: the same as the `goose` command."""

from goose.cli import main

raise SystemExit(main())
