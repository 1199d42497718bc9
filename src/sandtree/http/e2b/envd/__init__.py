"""envd, E2B's in-sandbox API, served by sandtree for each live sandbox on port 49983 (dispatch.py):
Connect-RPC process.Process and filesystem.Filesystem, HTTP /files and /health."""
