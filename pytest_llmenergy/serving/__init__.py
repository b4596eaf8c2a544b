"""Servers as targets: an OpenAI-compatible endpoint (``--llm-endpoint``) or an engine
started for the session (``--llm-serve=vllm``), with exact token counts verified from
every response and each request's timing from its stream."""
