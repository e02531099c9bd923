"""`jobkit sweep xla`: to be written."""
