"""Post-run analysis of one job (`jobkit analyze`) and of several side by side (`jobkit compare`)."""
