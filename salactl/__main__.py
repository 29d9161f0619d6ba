from salactl.cli import main

main()
