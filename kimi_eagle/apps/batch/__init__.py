"""Papermill batch runs of the notebooks over parameter grids, their summaries, and the demo."""
