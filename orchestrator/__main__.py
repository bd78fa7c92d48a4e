from orchestrator.commands.cli import main

main()
