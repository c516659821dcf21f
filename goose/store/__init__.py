"""What Goose keeps on disk: where (the cache folder), folders published atomically, and the tokenizer identity
that a saved datastore or memory is checked against."""
