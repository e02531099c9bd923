"""`jobkit sweep network`: to be written."""
