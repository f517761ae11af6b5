"""`python -m cli`: the same as the `qm` console script."""

from cli.main import main

main()
