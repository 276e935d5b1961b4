from logcompact.cli import main

main()
