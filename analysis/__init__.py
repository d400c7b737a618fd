"""Analysis of raw records: tidy tables, comparison with published numbers, and figures."""
