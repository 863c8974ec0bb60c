from unimem.cli.main import main

main(prog_name="unimem")
