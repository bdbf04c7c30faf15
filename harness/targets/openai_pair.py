"""Two OpenAI-compatible endpoints someone else started, overlap on and off: a served target
without servers of ours and without an agent (stress --target openai). What it can judge: the
tokens (clear-winner divergences, logprob records) and a server that stops answering; steps and
books need an agent inside the engine, and are said to be not judged. Its requests ask for token
ids as "token_id:N" (`return_tokens_as_token_ids`, vLLM's completions API)."""
from __future__ import annotations

from harness.targets.base import TargetUnavailable
from harness.targets.served.pair import ServedTarget


class OpenAIPair(ServedTarget):
    name = "openai"
    agent_env = None

    def __init__(self, url_on: str, url_off: str, served_model: str | None = None, **kw):
        super().__init__(**kw)
        self.urls = {True: url_on.rstrip("/"), False: url_off.rstrip("/")}
        self.faults = frozenset()
        self._model = served_model

    def url(self, overlap: bool) -> str:
        return self.urls[overlap]

    def start(self, which=(False, True)) -> None:
        import httpx
        for o in which:
            try:
                httpx.get(self.urls[o] + "/v1/models", timeout=10.0).raise_for_status()
            except httpx.HTTPError as e:
                raise TargetUnavailable(f"openai: {self.urls[o]} (overlap {'on' if o else 'off'}) does not answer "
                                        f"GET /v1/models: {type(e).__name__}: {e}") from None

    def model_name(self) -> str:
        if self._model is None:
            import httpx
            self.start()
            data = httpx.get(self.urls[True] + "/v1/models", timeout=10.0).json().get("data") or [{}]
            self._model = data[0].get("id") or "default"
        return self._model

    def set_plan(self, overlap, delays=None, faults=(), seed=None):
        pass  # no agent

    def close(self) -> None:
        pass  # not ours to stop
