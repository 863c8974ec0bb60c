from unimem.cli import main

main(prog_name="unimem")
