"""HTML pages: access check, then a form, then one service or selector, then a template."""
