"""`goose serve`: an OpenAI-compatible HTTP server for one model, decoding with Goose."""
