"""The ``clusterrun`` command line. One module per command; heavy imports happen inside commands."""
