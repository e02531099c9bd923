"""`jobkit sweep batch`: to be written."""
