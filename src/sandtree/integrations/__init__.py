"""sandtree inside other agent frameworks: an inspect-ai sandbox environment, a mini-swe-agent
environment and a LangChain / deepagents sandbox. Each adapts the SDK; none holds logic of its own."""

__all__: list[str] = []
