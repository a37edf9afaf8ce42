"""Everything that runs vLLM: the offline engine, the client of `vllm serve` endpoints, the server an inference
box runs, a served judge and GPTQ quantization for the boxes. Imports pipeline, data and the base modules."""
