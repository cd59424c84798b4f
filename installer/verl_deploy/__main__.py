from verl_deploy.entry import main

main()
