from .cli.common import main

main()
