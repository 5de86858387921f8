"""Small commands around the daemons: ``zbatch-status`` (a live view) and ``zbatch-keys`` (CURVE key pairs)."""
