"""The MCP server: the operations as tools for agents (stdio, or HTTP through the token gate)."""
