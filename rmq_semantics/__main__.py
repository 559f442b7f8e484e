import sys

from rmq_semantics.cli import main

# Guarded: a spawned child process (the benchmark's collector) imports this module again.
if __name__ == "__main__":
    sys.exit(main())
