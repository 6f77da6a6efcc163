"""See DESIGN.md B.2; filled by its own issue."""
