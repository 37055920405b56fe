"""A detached run: its supervisor on rank 0's node (host.py, links.py), started and watched from here."""
