"""The Python SDK: Sandtree and AsyncSandtree over an engine in-process or a server (remote.py), and the objects they hand out (images, sandboxes, runs)."""
