from replag.cli import main

main(prog_name="replag")
