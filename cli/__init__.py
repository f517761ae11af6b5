"""`qm`, Quartermaster's command line: it speaks only HTTP to the portal's API (docs/researchers.md)."""
