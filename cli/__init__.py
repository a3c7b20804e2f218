"""The admin CLI `ecstore`: argument parsing and presentation only."""
