from verl_deploy.cli import main

main()
