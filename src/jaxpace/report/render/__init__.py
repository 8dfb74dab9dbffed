"""What the report shows: terminal text, tables, the HTML page and the Perfetto trace."""
