"""Developer tools, not the serving path: the acceptance report, the tiny test
models' builder, the bundled prompt sets and the small chat tokenizer."""
