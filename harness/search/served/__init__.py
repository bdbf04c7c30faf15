"""The stress search against a served pair (vLLM, or any OpenAI-compatible on/off pair), the twin
of the ref engine's search around it: the drawn cases (case, chat: conversations and client ids),
both arms judged with every oracle (judge, effects), the loop (explore), shrinking (shrink) and
reproducers (repro). This package imports nothing: import the module you need."""
