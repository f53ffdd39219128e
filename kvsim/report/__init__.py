"""Reports: Markdown with matplotlib figures, drawn from saved results."""
