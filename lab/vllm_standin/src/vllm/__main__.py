from vllm.cli import main

main()
