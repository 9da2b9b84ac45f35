"""Actors: trio tasks with mailboxes that call plugins outside transactions and submit
kernel procedures to the storage actor."""
