import sys

from rmq_semantics.cli import main

sys.exit(main(["coordinator", *sys.argv[1:]]))
