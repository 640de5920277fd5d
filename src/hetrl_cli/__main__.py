from hetrl_cli.cli import main

main()
