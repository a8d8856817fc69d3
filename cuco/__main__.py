from cuco.cli import main

main()
