"""Optional integrations, each imported only when its app is installed (docs/observability.md)."""
