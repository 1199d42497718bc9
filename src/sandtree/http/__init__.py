"""The REST server: /api/v1 derived from the operation table, Contree's /v1 (contree/), the token gate, previews."""
