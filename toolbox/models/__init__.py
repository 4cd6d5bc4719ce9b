"""Model and tokenizer loading (hub id or local directory) and tiny test models."""
