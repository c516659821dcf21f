"""What Goose keeps on disk: folders published atomically, and the tokenizer identity that a saved
datastore or memory is checked against."""
