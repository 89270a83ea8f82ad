from opgen.cli import run

run()
