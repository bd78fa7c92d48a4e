from orchestrator.cli import main

main()
