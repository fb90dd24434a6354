"""`python -m kvphase.cli`: the same command line as the `kvphase` script."""

from kvphase.cli import main

main()
