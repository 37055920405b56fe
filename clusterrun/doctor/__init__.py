"""Node health checks run by ``clusterrun doctor``."""
