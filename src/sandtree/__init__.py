"""sandtree: a self-hosted sandbox for AI agents with git-like, content-addressed images."""
