"""`jobkit sweep models`: to be written."""
