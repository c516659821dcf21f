"""The runners of ``goose bench``'s peers, each run by its path under the peer's own interpreter.

``llama_runner.py`` (``goose bench llama``) needs llama-cpp-python and nothing of goose;
``vllm_runner.py`` (``goose bench vllm``) needs vLLM and goose, both in the vLLM environment (vLLM's
engine loads goose's proposer by name). Run as scripts, not as modules of this package: this
folder holds nothing else, so that Python putting it first on the runner's path shadows no module.
goose imports them only for their ``METHODS`` (and tests for their pure parts).
"""
