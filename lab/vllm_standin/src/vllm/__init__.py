"""spark-vllm lab STAND-IN for vLLM. Not the real engine: see lab/vllm_standin/README.md."""
__version__ = "0.20.0+lab.standin"
STANDIN = True
