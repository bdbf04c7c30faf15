"""The plumbing of a pair of servers we start, shared by the vLLM and SGLang targets: the pair
itself (pair: ServedTarget), the processes (process) and the keeper each runs under (keeper),
their logs read (log), the OpenAI wire format (openai_wire) and chat conversations (chat_turns).
This package imports nothing: `python -m harness.targets.served.keeper` must start fast."""
